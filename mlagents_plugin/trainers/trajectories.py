"""A round's trajectories as one AgentBuffer: the fields ML-Agents' ``Trajectory.to_agentbuffer``
makes for each, entry for entry, one trajectory after the other.

Upstream appends one entry to each of some 25 fields per step, each append going through
``AgentBuffer.__getitem__``, into a new AgentBuffer per trajectory; here each field of a
trajectory is one list comprehension over its steps, into plain lists, and each field of the
round one list. tests/test_trainers.py compares the two on trajectories with every kind of entry
(camera and vector observations, groupmates, action masks, memories).
"""
from typing import Dict, List, Sequence

import numpy as np
from mlagents.trainers.buffer import AgentBuffer, AgentBufferKey, BufferKey
from mlagents.trainers.trajectory import AgentExperience, GroupObsUtil, ObsUtil, Trajectory


def round_buffer(trajectories: Sequence[Trajectory]) -> AgentBuffer:
    """The fields of ``trajectory.to_agentbuffer()`` for each trajectory, one after the other."""
    buffer = AgentBuffer()
    for trajectory in trajectories:
        for key, entries in _fields(trajectory).items():
            buffer[key].extend(entries)
    buffer[BufferKey.ACTION_MASK].padding_value = 1  # as upstream's appends of masks set it
    return buffer


def _fields(trajectory: Trajectory) -> Dict[AgentBufferKey, list]:
    """``trajectory.to_agentbuffer()``'s fields as lists, in its order (a dict keeps it)."""
    steps: List[AgentExperience] = trajectory.steps
    following = steps[1:]  # the step after each step but the last
    last = steps[-1]
    mates_after = [step.group_status for step in following] + [last.group_status]  # the last: its own
    observations = range(len(steps[0].obs))
    fields: Dict[AgentBufferKey, list] = {}
    for i in observations:
        fields[ObsUtil.get_name_at(i)] = [step.obs[i] for step in steps]
        fields[ObsUtil.get_name_at_next(i)] = [step.obs[i] for step in following] + [trajectory.next_obs[i]]
    fields[BufferKey.GROUP_CONTINUOUS_ACTION] = [[m.action.continuous for m in step.group_status] for step in steps]
    fields[BufferKey.GROUP_DISCRETE_ACTION] = [[m.action.discrete for m in step.group_status] for step in steps]
    fields[BufferKey.GROUPMATE_REWARDS] = [[m.reward for m in step.group_status] for step in steps]
    fields[BufferKey.GROUP_REWARD] = [step.group_reward for step in steps]
    fields[BufferKey.GROUP_NEXT_CONT_ACTION] = [[m.action.continuous for m in mates] for mates in mates_after]
    fields[BufferKey.GROUP_NEXT_DISC_ACTION] = [[m.action.discrete for m in mates] for mates in mates_after]
    for i in observations:
        fields[GroupObsUtil.get_name_at(i)] = [[m.obs[i] for m in step.group_status] for step in steps]
        fields[GroupObsUtil.get_name_at_next(i)] = [[m.obs[i] for m in step.group_status] for step in following] + [
            [obs[i] for obs in trajectory.next_group_obs]
        ]
    memories = [step.memory for step in steps if step.memory is not None]
    if memories:
        fields[BufferKey.MEMORY] = memories
    fields[BufferKey.MASKS] = [1.0] * len(steps)
    fields[BufferKey.DONE] = [step.done for step in steps]
    fields[BufferKey.GROUP_DONES] = [[m.done for m in step.group_status] for step in steps]
    fields[BufferKey.CONTINUOUS_ACTION] = [step.action.continuous for step in steps]
    fields[BufferKey.DISCRETE_ACTION] = [step.action.discrete for step in steps]
    fields[BufferKey.NEXT_CONT_ACTION] = [step.action.continuous for step in following] + [
        np.zeros_like(last.action.continuous)
    ]
    fields[BufferKey.NEXT_DISC_ACTION] = [step.action.discrete for step in following] + [
        np.zeros_like(last.action.discrete)
    ]
    fields[BufferKey.CONTINUOUS_LOG_PROBS] = [step.action_probs.continuous for step in steps]
    fields[BufferKey.DISCRETE_LOG_PROBS] = [step.action_probs.discrete for step in steps]
    # AgentExperience's mask says True for a masked action; the buffer's, 1 for an allowed one
    fields[BufferKey.ACTION_MASK] = [
        1 - np.concatenate(step.action_mask)
        if step.action_mask is not None
        else np.ones(step.action.discrete.shape, dtype=np.float32)
        for step in steps
    ]
    fields[BufferKey.PREV_ACTION] = [step.prev_action for step in steps]
    fields[BufferKey.ENVIRONMENT_REWARDS] = [step.reward for step in steps]
    return fields
