"""A trajectory as an AgentBuffer, field by field: what ML-Agents' ``Trajectory.to_agentbuffer``
makes, entry for entry, without its per-step loop over every field.

Upstream appends one entry to each of some 20 fields per step, each append going through
``AgentBuffer.__getitem__``; here each field is one list comprehension over the steps.
tests/test_trainers.py compares the two on trajectories with every kind of entry (camera and
vector observations, groupmates, action masks, memories).
"""
from typing import List

import numpy as np
from mlagents.trainers.buffer import AgentBuffer, BufferKey
from mlagents.trainers.trajectory import AgentExperience, GroupObsUtil, ObsUtil, Trajectory


def to_agentbuffer(trajectory: Trajectory) -> AgentBuffer:
    """``trajectory.to_agentbuffer()``, the same entries in the same fields."""
    steps: List[AgentExperience] = trajectory.steps
    following = steps[1:]  # the step after each step but the last
    last = steps[-1]
    buffer = AgentBuffer()
    observations = range(len(steps[0].obs))
    for i in observations:  # the fields in upstream's order, as a dict keeps them
        buffer[ObsUtil.get_name_at(i)].extend([step.obs[i] for step in steps])
        buffer[ObsUtil.get_name_at_next(i)].extend([step.obs[i] for step in following] + [trajectory.next_obs[i]])
    buffer[BufferKey.GROUP_CONTINUOUS_ACTION].extend(
        [[mate.action.continuous for mate in step.group_status] for step in steps]
    )
    buffer[BufferKey.GROUP_DISCRETE_ACTION].extend(
        [[mate.action.discrete for mate in step.group_status] for step in steps]
    )
    buffer[BufferKey.GROUPMATE_REWARDS].extend([[mate.reward for mate in step.group_status] for step in steps])
    buffer[BufferKey.GROUP_REWARD].extend([step.group_reward for step in steps])
    # the last step's "next" group actions are its own, as upstream's
    buffer[BufferKey.GROUP_NEXT_CONT_ACTION].extend(
        [[mate.action.continuous for mate in step.group_status] for step in following + [last]]
    )
    buffer[BufferKey.GROUP_NEXT_DISC_ACTION].extend(
        [[mate.action.discrete for mate in step.group_status] for step in following + [last]]
    )
    for i in observations:
        buffer[GroupObsUtil.get_name_at(i)].extend([[mate.obs[i] for mate in step.group_status] for step in steps])
        buffer[GroupObsUtil.get_name_at_next(i)].extend(
            [[mate.obs[i] for mate in step.group_status] for step in following]
            + [[obs[i] for obs in trajectory.next_group_obs]]
        )
    memories = [step.memory for step in steps if step.memory is not None]
    if memories:
        buffer[BufferKey.MEMORY].extend(memories)
    buffer[BufferKey.MASKS].extend([1.0] * len(steps))
    buffer[BufferKey.DONE].extend([step.done for step in steps])
    buffer[BufferKey.GROUP_DONES].extend([[mate.done for mate in step.group_status] for step in steps])

    buffer[BufferKey.CONTINUOUS_ACTION].extend([step.action.continuous for step in steps])
    buffer[BufferKey.DISCRETE_ACTION].extend([step.action.discrete for step in steps])
    buffer[BufferKey.NEXT_CONT_ACTION].extend(
        [step.action.continuous for step in following] + [np.zeros_like(last.action.continuous)]
    )
    buffer[BufferKey.NEXT_DISC_ACTION].extend(
        [step.action.discrete for step in following] + [np.zeros_like(last.action.discrete)]
    )
    buffer[BufferKey.CONTINUOUS_LOG_PROBS].extend([step.action_probs.continuous for step in steps])
    buffer[BufferKey.DISCRETE_LOG_PROBS].extend([step.action_probs.discrete for step in steps])
    # AgentExperience's mask says True for a masked action; the buffer's, 1 for an allowed one
    masks = buffer[BufferKey.ACTION_MASK]
    masks.extend(
        [
            1 - np.concatenate(step.action_mask)
            if step.action_mask is not None
            else np.ones(step.action.discrete.shape, dtype=np.float32)
            for step in steps
        ]
    )
    masks.padding_value = 1
    buffer[BufferKey.PREV_ACTION].extend([step.prev_action for step in steps])
    buffer[BufferKey.ENVIRONMENT_REWARDS].extend([step.reward for step in steps])
    return buffer
