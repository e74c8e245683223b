"""``trainer_type: ppo_fast``: ML-Agents' PPO, whose update reads its buffer as arrays.

The same trainer as ``ppo`` (it subclasses ML-Agents' ``PPOTrainer``: the same policy, optimizer,
reward signals, trajectory processing, checkpoints and ``.onnx`` export) but for
``_update_policy``, which feeds the optimizer the same minibatches, in the same order, from
arrays made once per update instead of Python lists rebuilt at every epoch and minibatch
(NOTE [ The same minibatches ]). docs/trainers.md says what it changes and what it measures.

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
import warnings
from collections import defaultdict
from typing import Any, Dict, List, Union

import numpy as np
from mlagents.trainers.buffer import AgentBuffer, AgentBufferKey, BufferKey
from mlagents.trainers.ppo.trainer import PPOTrainer

TRAINER_NAME = "ppo_fast"

Field = Union[np.ndarray, List[Any]]


class FastPPOTrainer(PPOTrainer):
    """ML-Agents' PPO with the update of NOTE [ The same minibatches ] (timed, as upstream's, by
    RLTrainer's ``_update_policy`` timer: timers.json reads the same)."""

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
