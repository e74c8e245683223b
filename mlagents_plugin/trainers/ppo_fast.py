"""``trainer_type: ppo_fast``: ML-Agents' PPO, with a round's trajectories processed together
and an update that reads its buffer as arrays.

The same learner as ``ppo`` (it subclasses ML-Agents' ``PPOTrainer``: the same policy,
optimizer and losses, reward signals, checkpoints and ``.onnx`` export). Two things change:
``advance`` takes the value estimates of every trajectory of a round in one critic pass (NOTE
[ A round at once ]), and ``_update_policy`` feeds the optimizer the same minibatches, in the
same order, from arrays made once per update instead of Python lists rebuilt at every epoch and
minibatch (NOTE [ The same minibatches ]). docs/trainers.md says what it changes and what it
measures.

# NOTE [ A round at once ]
# ML-Agents' trainer takes the trajectories queued since its last ``advance`` one by one: for
# each, the normalisers' update, then two critic passes (its steps, then the observation after
# its last step), the reward signals, GAE and the buffers. Agents of a build reach
# ``time_horizon`` or the end of an episode together, so a round brings tens of short
# trajectories, and the two small passes per trajectory cost more than all the arithmetic. Here a
# round's trajectories are taken off their queues as upstream takes them (no more than were
# queued when ``advance`` began), the normalisers are updated with each in order, and then ONE
# critic pass gives the value estimates of all of them (every step of every trajectory, and each
# one's next observation, as rows of one batch). The rest is upstream's, trajectory by trajectory
# in the same order: summaries and checkpoints fall on the same steps, the same stats are
# reported. Two differences, both in rounding or in order only:
# - a batch of many rows is not summed in the same order as several small ones: the values
#   differ from upstream's in the last bits of a float32 (about 1e-7 of their size);
# - with ``normalize: true``, each trajectory's values see the normaliser updated with the whole
#   round, not only with the trajectories before it: its running mean and variance move by one
#   round's steps out of all steps seen, as when upstream's trainer runs a little later.
# Recurrent policies keep upstream's path: their critic carries a memory from trajectory to
# trajectory of one agent, which a batch cannot.

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
import torch
from mlagents.trainers.agent_processor import AgentManagerQueue
from mlagents.trainers.buffer import AgentBuffer, AgentBufferKey, BufferKey, RewardSignalUtil
from mlagents.trainers.ppo.trainer import PPOTrainer
from mlagents.trainers.trainer.trainer_utils import get_gae
from mlagents.trainers.trajectory import ObsUtil, Trajectory
from mlagents_envs.timers import hierarchical_timer

from mlagents_plugin.trainers.trajectories import to_agentbuffer

TRAINER_NAME = "ppo_fast"

Field = Union[np.ndarray, List[Any]]


Values = Dict[str, np.ndarray]


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
        buffers = [to_agentbuffer(trajectory) for trajectory in trajectories]
        for buffer in buffers:
            self._warn_if_group_reward(buffer)
            if self.is_training:
                self.policy.actor.update_normalization(buffer)
                self.optimizer.critic.update_normalization(buffer)
        for trajectory, buffer, (values, value_next) in zip(
            trajectories, buffers, self._value_estimates(trajectories, buffers), strict=True
        ):
            self._finish_trajectory(trajectory, buffer, values, value_next)

    def _value_estimates(
        self, trajectories: Sequence[Trajectory], buffers: Sequence[AgentBuffer]
    ) -> List[Tuple[Values, Dict[str, Any]]]:
        """Each trajectory's value estimates and bootstrap values, from one critic pass over the
        steps of all, then each one's next observation (as get_trajectory_value_estimates)."""
        lengths = [buffer.num_experiences for buffer in buffers]
        steps = sum(lengths)
        inputs = [
            torch.as_tensor(
                np.concatenate(
                    [np.asarray(buffer[ObsUtil.get_name_at(i)]) for buffer in buffers]
                    + [np.asarray(trajectory.next_obs[i])[np.newaxis] for trajectory in trajectories]
                ),
                dtype=torch.float32,
            )
            for i in range(len(self.policy.behavior_spec.observation_specs))
        ]
        with torch.no_grad():
            outputs, _ = self.optimizer.critic.critic_pass(inputs, None, sequence_length=steps + len(buffers))
        columns = {name: output.numpy() for name, output in outputs.items()}
        estimates: List[Tuple[Values, Dict[str, Any]]] = []
        start = 0
        for index, (trajectory, length) in enumerate(zip(trajectories, lengths, strict=True)):
            values = {name: column[start : start + length] for name, column in columns.items()}
            value_next: Dict[str, Any] = {
                name: column[steps + index : steps + index + 1] for name, column in columns.items()
            }
            if trajectory.done_reached and not trajectory.interrupted:
                for name in value_next:
                    if not self.optimizer.reward_signals[name].ignore_done:
                        value_next[name] = 0.0
            estimates.append((values, value_next))
            start += length
        return estimates

    def _finish_trajectory(
        self, trajectory: Trajectory, buffer: AgentBuffer, values: Values, value_next: Dict[str, Any]
    ) -> None:
        """PPOTrainer._process_trajectory after its value estimates: the same steps, stats and
        buffers, in the same order."""
        super(PPOTrainer, self)._process_trajectory(trajectory)  # RLTrainer's: steps, summaries, checkpoints
        agent_id = trajectory.agent_id
        for name, estimate in values.items():
            buffer[RewardSignalUtil.value_estimates_key(name)].extend(estimate)
            self._stats_reporter.add_stat(
                f"Policy/{self.optimizer.reward_signals[name].name.capitalize()} Value Estimate", np.mean(estimate)
            )
        self.collected_rewards["environment"][agent_id] += np.sum(buffer[BufferKey.ENVIRONMENT_REWARDS])
        for name, reward_signal in self.optimizer.reward_signals.items():
            rewards = reward_signal.evaluate(buffer) * reward_signal.strength
            buffer[RewardSignalUtil.rewards_key(name)].extend(rewards)
            self.collected_rewards[name][agent_id] += np.sum(rewards)
        advantages, returns = [], []
        for name in self.optimizer.reward_signals:
            estimate = buffer[RewardSignalUtil.value_estimates_key(name)].get_batch()
            advantage = get_gae(
                rewards=buffer[RewardSignalUtil.rewards_key(name)].get_batch(),
                value_estimates=estimate,
                value_next=value_next[name],
                gamma=self.optimizer.reward_signals[name].gamma,
                lambd=self.hyperparameters.lambd,
            )
            returns.append(advantage + estimate)
            advantages.append(advantage)
            buffer[RewardSignalUtil.returns_key(name)].set(returns[-1])
            buffer[RewardSignalUtil.advantage_key(name)].set(advantage)
        buffer[BufferKey.ADVANTAGES].set(list(np.mean(np.array(advantages, dtype=np.float32), axis=0)))
        buffer[BufferKey.DISCOUNTED_RETURNS].set(list(np.mean(np.array(returns, dtype=np.float32), axis=0)))
        if self.should_still_train:  # as RLTrainer._append_to_update_buffer, of sequences of one step
            for key, entries in buffer.items():
                self.update_buffer[key].extend(entries)
        if trajectory.done_reached:
            self._update_end_episode_stats(agent_id, self.optimizer)

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
