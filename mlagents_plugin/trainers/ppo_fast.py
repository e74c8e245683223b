"""``trainer_type: ppo_fast``: ML-Agents' PPO, with a round's trajectories processed together
and an update that reads its buffer as arrays.

The same learner as ``ppo`` (it subclasses ML-Agents' ``PPOTrainer``: the same policy,
optimizer and losses, reward signals, checkpoints and ``.onnx`` export). Two things change:
``advance`` processes a round's trajectories on one buffer, with one critic pass for all their
value estimates (NOTE [ A round at once ]), and ``_update_policy`` feeds the optimizer the same
minibatches, in the same order, from arrays made once per update instead of Python lists
rebuilt at every epoch and minibatch (NOTE [ The same minibatches ]). docs/trainers.md says what
it changes and what it measures.

# NOTE [ A round at once ]
# ML-Agents' trainer takes the trajectories queued since its last ``advance`` one by one: for
# each, a new AgentBuffer filled step by step, the normalisers' update, two critic passes (its
# steps, then the observation after its last step), each reward signal's evaluation, GAE, and an
# append of every field to the update buffer. The agents of a build end episodes and reach
# ``time_horizon`` together, so a round brings many short trajectories (the goal scene: about 16
# of 4 steps each), and the per-trajectory overhead costs more than the arithmetic. Here a
# round's trajectories are taken off their queues as upstream takes them (no more than were
# queued when ``advance`` began) and laid one after the other in one buffer, field by field
# (trainers/trajectories.py: upstream's entries, checked entry for entry); the normalisers are
# updated once with it; ONE critic pass gives the values of every step and of each trajectory's
# next observation; each reward signal evaluates the round once; then, trajectory by trajectory
# in upstream's order, the step count, summaries and checkpoints, the stats, and GAE on the
# trajectory's rows; and one append of each field to the update buffer. What differs from
# upstream is rounding and, with ``normalize: true``, order:
# - a batch of many rows is not summed in the same order as several small ones: values (and
#   curiosity, GAIL and RND rewards, which come from networks) differ from upstream's in the
#   last bits of a float32 (tests/test_trainers.py: within 1e-5, every round);
# - with ``normalize: true``, the normalisers take the round in one update, and the values of
#   its first trajectories see the steps of its later ones: a running mean and variance over
#   every step seen, moved by one round's steps, as when upstream's trainer runs a little later.
#   The same holds for RND with ``normalize: true`` in its own network settings (its evaluation
#   updates its normaliser: once per round here), and for a checkpoint that falls mid-round
#   (its normalisers have seen the whole round).
# Recurrent policies keep upstream's path: their critic's memory runs on from each trajectory to
# the next (ML-Agents keeps one, whatever the agent), so the values depend on their order.

# NOTE [ The same minibatches ]
# ML-Agents' update (OnPolicyTrainer._update_policy) normalises the advantages, then for each
# epoch shuffles the whole update buffer, field by field, in Python (AgentBuffer.shuffle: one
# ``np.random.shuffle`` of the sequence indices, then every field's list rebuilt from slices), and
# cuts each minibatch out as lists (make_mini_batch), which the optimizer turns into arrays and
# tensors again. Here each field becomes one array when the update starts; an epoch draws the
# same ``np.random.shuffle`` of sequence indices from the same global generator, composes it with
# the order so far (the buffer upstream shuffles is the one it shuffled before), and a minibatch
# is each field indexed by that order. The optimizer gets an AgentBuffer whose fields are those
# arrays: the values, dtypes, minibatches and random draws are upstream's, so a run learns
# exactly what ``ppo`` learns with the same seed (tests/test_trainers.py compares the two, reward
# for reward). A field whose entries do not stack into one array (ragged groupmate rewards) is
# indexed as a list.
"""
import time
import warnings
from collections import defaultdict
from typing import Any, Dict, List, Sequence, Tuple, Union

import numpy as np
from mlagents.torch_utils import torch
from mlagents.trainers.agent_processor import AgentManagerQueue
from mlagents.trainers.buffer import AgentBuffer, AgentBufferKey, BufferKey, RewardSignalUtil
from mlagents.trainers.ppo.trainer import PPOTrainer
from mlagents.trainers.torch_entities.utils import ModelUtils
from mlagents.trainers.trainer.trainer_utils import get_gae
from mlagents.trainers.trajectory import ObsUtil, Trajectory
from mlagents_envs.timers import hierarchical_timer

from mlagents_plugin.trainers.trajectories import round_buffer

TRAINER_NAME = "ppo_fast"

Field = Union[np.ndarray, List[Any]]
Values = Dict[str, np.ndarray]
Bootstrap = Union[np.ndarray, float]  # a value estimate of shape (1,), or 0.0 after a terminal step


class FastPPOTrainer(PPOTrainer):
    """ML-Agents' PPO with NOTE [ A round at once ] and NOTE [ The same minibatches ]; timed by
    upstream's ``process_trajectory`` and ``_update_policy`` timers (timers.json reads the same)."""

    def advance(self) -> None:
        """RLTrainer.advance, with the round's trajectories processed together."""
        with hierarchical_timer("process_trajectory"):
            trajectories: List[Trajectory] = []
            for queue in self.trajectory_queues:
                queued = queue.qsize()  # no more than were queued: they are on-policy
                for _ in range(queued):
                    try:
                        trajectories.append(queue.get_nowait())
                    except AgentManagerQueue.Empty:
                        break
                if self.threaded and not queued:
                    time.sleep(0.0001)  # as upstream: yield the thread rather than spin
            if self.policy.use_recurrent:
                for trajectory in trajectories:
                    self._process_trajectory(trajectory)
            elif trajectories:
                self._process_round(trajectories)
        if self.should_still_train and self._is_ready_update():
            with hierarchical_timer("_update_policy"):
                if self._update_policy():
                    for queue in self.policy_queues:
                        queue.put(self.get_policy(queue.behavior_id))

    def _process_round(self, trajectories: Sequence[Trajectory]) -> None:
        """PPOTrainer._process_trajectory for each trajectory, in order, on one buffer for all."""
        buffer = round_buffer(trajectories)
        self._warn_if_group_reward(buffer)
        if self.is_training:
            self.policy.actor.update_normalization(buffer)
            self.optimizer.critic.update_normalization(buffer)
        values, values_next = self._value_estimates(trajectories, buffer)
        rewards = self._signal_rewards(buffer)
        environment = np.asarray(buffer[BufferKey.ENVIRONMENT_REWARDS])
        # float32, as the optimizer reads them; GAE gives float64 after a terminal step (its
        # bootstrap value is 0.0), rounded here once, as upstream's are when they become tensors
        advantages = {name: np.empty_like(values[name]) for name in rewards}
        returns = {name: np.empty_like(values[name]) for name in rewards}
        start = 0
        for trajectory, value_next in zip(trajectories, values_next, strict=True):
            rows = slice(start, start + len(trajectory.steps))
            start = rows.stop
            super(PPOTrainer, self)._process_trajectory(trajectory)  # RLTrainer's: steps, summaries, checkpoints
            self._record(
                trajectory.agent_id,
                {name: values[name][rows] for name in values},
                np.sum(environment[rows]),
                {name: rewards[name][rows] for name in rewards},
            )
            for name, signal in self.optimizer.reward_signals.items():
                advantage = get_gae(
                    rewards=rewards[name][rows],
                    value_estimates=values[name][rows],
                    value_next=value_next[name],
                    gamma=signal.gamma,
                    lambd=self.hyperparameters.lambd,
                )
                advantages[name][rows] = advantage
                returns[name][rows] = advantage + values[name][rows]
            if trajectory.done_reached:
                self._update_end_episode_stats(trajectory.agent_id, self.optimizer)
        columns: Dict[AgentBufferKey, np.ndarray] = {}  # the fields in upstream's order
        for name in rewards:
            columns[RewardSignalUtil.value_estimates_key(name)] = values[name]
        for name in rewards:
            columns[RewardSignalUtil.rewards_key(name)] = rewards[name]
        for name in rewards:
            # ML-Agents 1.x's returns_key IS value_estimates_key: the returns replace the value
            # estimates, as upstream's set() does, and the update reads them as the old values
            columns[RewardSignalUtil.returns_key(name)] = returns[name]
            columns[RewardSignalUtil.advantage_key(name)] = advantages[name]
        columns[BufferKey.ADVANTAGES] = np.mean(np.array(list(advantages.values())), axis=0)
        columns[BufferKey.DISCOUNTED_RETURNS] = np.mean(np.array(list(returns.values())), axis=0)
        for key, column in columns.items():
            buffer[key].extend(column)
        # upstream appends each trajectory while it should still train; after max_steps no update
        # follows, so the round that crosses it is dropped whole
        if self.should_still_train:
            for key, entries in buffer.items():  # sequences of one step: resequence_and_append's extend
                self.update_buffer[key].extend(entries)

    def _record(self, agent_id: str, values: Values, environment: float, rewards: Values) -> None:
        """A trajectory's stats, as PPOTrainer._process_trajectory reports them."""
        for name, estimates in values.items():
            signal = self.optimizer.reward_signals[name]
            self._stats_reporter.add_stat(f"Policy/{signal.name.capitalize()} Value Estimate", np.mean(estimates))
        self.collected_rewards["environment"][agent_id] += environment
        for name, signal_rewards in rewards.items():
            self.collected_rewards[name][agent_id] += np.sum(signal_rewards)

    def _value_estimates(
        self, trajectories: Sequence[Trajectory], buffer: AgentBuffer
    ) -> Tuple[Values, List[Dict[str, Bootstrap]]]:
        """The value estimates of every step of the round, and each trajectory's bootstrap values,
        from one critic pass: the round's steps, then each trajectory's next observation (what
        get_trajectory_value_estimates gives a trajectory at a time)."""
        steps = buffer.num_experiences
        inputs = [
            ModelUtils.list_to_tensor(
                np.concatenate(
                    [np.asarray(buffer[ObsUtil.get_name_at(i)])]
                    + [np.asarray(trajectory.next_obs[i])[np.newaxis] for trajectory in trajectories]
                )
            )
            for i in range(len(self.policy.behavior_spec.observation_specs))
        ]
        with torch.no_grad():
            outputs, _ = self.optimizer.critic.critic_pass(inputs, None, sequence_length=steps + len(trajectories))
        columns = {name: ModelUtils.to_numpy(output) for name, output in outputs.items()}
        values_next: List[Dict[str, Bootstrap]] = []
        for index, trajectory in enumerate(trajectories):
            value_next: Dict[str, Bootstrap] = {name: column[steps + index, None] for name, column in columns.items()}
            if trajectory.done_reached and not trajectory.interrupted:
                for name in value_next:
                    if not self.optimizer.reward_signals[name].ignore_done:
                        value_next[name] = 0.0
            values_next.append(value_next)
        return {name: column[:steps] for name, column in columns.items()}, values_next

    def _signal_rewards(self, buffer: AgentBuffer) -> Values:
        """Each reward signal's rewards for every step of the round, in one evaluation each."""
        return {
            name: signal.evaluate(buffer) * signal.strength for name, signal in self.optimizer.reward_signals.items()
        }

    def _update_policy(self) -> bool:
        hyperparameters = self.hyperparameters
        buffer_length = self.update_buffer.num_experiences
        self.cumulative_returns_since_policy_update.clear()
        sequence_length = self.policy.sequence_length
        # as upstream: a whole number of sequences per minibatch, at least one
        batch_size = max(hyperparameters.batch_size - hyperparameters.batch_size % sequence_length, sequence_length)
        n_sequences = max(int(hyperparameters.batch_size / sequence_length), 1)

        fields = _as_arrays(self.update_buffer)
        advantages = np.array(fields[BufferKey.ADVANTAGES], dtype=np.float32)
        fields[BufferKey.ADVANTAGES] = (advantages - advantages.mean()) / (advantages.std() + 1e-10)
        length = len(fields[BufferKey.ADVANTAGES])
        order = np.arange(length - length % sequence_length)  # a shuffle keeps whole sequences only
        update_stats: Dict[str, List[float]] = defaultdict(list)
        for _ in range(hyperparameters.num_epoch):
            shuffled = np.arange(len(order) // sequence_length)
            np.random.shuffle(shuffled)  # upstream's one draw per epoch
            order = order.reshape(-1, sequence_length)[shuffled].reshape(-1)
            for start in range(0, (buffer_length // batch_size) * batch_size, batch_size):
                minibatch = _minibatch(fields, order[start : start + batch_size])
                stats = self.optimizer.update(minibatch, n_sequences)
                stats.update(self.optimizer.update_reward_signals(minibatch))
                for name, value in stats.items():
                    update_stats[name].append(value)

        for name, values in update_stats.items():
            self._stats_reporter.add_stat(name, np.mean(values))
        if self.optimizer.bc_module:
            for name, value in self.optimizer.bc_module.update().items():
                self._stats_reporter.add_stat(name, value)
        self._clear_update_buffer()
        return True


def _as_arrays(buffer: AgentBuffer) -> Dict[AgentBufferKey, Field]:
    """Each field as one array, or as a list where its entries do not stack. Each field's list
    is emptied once it is copied (the update clears the buffer anyway): the update never holds
    two copies of more than one field, as camera observations of a large buffer would weigh."""
    fields: Dict[AgentBufferKey, Field] = {}
    for key in list(buffer):
        entries = buffer[key]
        with warnings.catch_warnings():  # numpy < 1.24 warns of ragged entries before it fails
            warnings.simplefilter("ignore", category=getattr(np, "VisibleDeprecationWarning", DeprecationWarning))
            try:
                array = np.asarray(entries)
            except ValueError:  # ragged, in a numpy that refuses
                array = None
        fields[key] = list(entries) if array is None or array.dtype == object else array
        del entries[:]
    return fields


def _minibatch(fields: Dict[AgentBufferKey, Field], rows: np.ndarray) -> AgentBuffer:
    minibatch = AgentBuffer()
    for key, values in fields.items():
        minibatch[key] = values[rows] if isinstance(values, np.ndarray) else [values[i] for i in rows]
    return minibatch
