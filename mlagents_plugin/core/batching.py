"""One forward pass of a behaviour's policy for every worker that is ready to step.

# NOTE [ Batched inference ]
# ML-Agents asks the policy for actions once per worker and behaviour (``_take_step`` calls
# ``policy.get_action(decision_steps, worker_id)``). For a small network most of each call is
# fixed cost (tensor set-up, autograd bookkeeping, module dispatch): with 8 workers the trainer
# spends 8 times that overhead per round of steps. When several workers are ready together, the
# manager instead concatenates their DecisionSteps, calls ``policy.evaluate`` once with the
# agents' global ids (``agent_<worker>-<id>``, so recurrent memories are looked up and saved per
# agent exactly as before), and splits every output back by worker. Each worker's ActionInfo
# holds what a call of its own would have held, in shape and content: a deterministic policy
# gives identical actions; a stochastic one samples from the same distributions.
#
# What forms a batch: the workers whose replies are in when the manager computes actions, that
# is every reply that came in during its waits (``Backend.wait`` hands over all that are ready
# by then), and the workers still stepping whose replies were due within one forward pass, for
# which it waited (NOTE [ Gathering a batch ] in gathering.py). Policies that change
# ``get_action`` (not ML-Agents' TorchPolicy path) are called per worker, as is every behaviour
# when ``env_manager.batch_inference`` is false.
"""
from typing import Any, List, Sequence, Tuple

import numpy as np
from mlagents.trainers.action_info import ActionInfo
from mlagents.trainers.behavior_id_utils import get_global_agent_id
from mlagents.trainers.policy import Policy
from mlagents.trainers.policy.torch_policy import TorchPolicy
from mlagents_envs.base_env import DecisionSteps, _ActionTupleBase

Request = Tuple[int, DecisionSteps]  # (worker id, the decision steps of one behaviour)


def batchable(policy: Policy) -> bool:
    """Does ``policy.get_action`` do exactly what ``get_actions`` does with ``evaluate``?"""
    return isinstance(policy, TorchPolicy) and type(policy).get_action is TorchPolicy.get_action


def get_actions(policy: TorchPolicy, requests: Sequence[Request]) -> List[ActionInfo]:
    """``[policy.get_action(steps, worker_id) for worker_id, steps in requests]``, with one
    ``evaluate`` for all of them (NOTE [ Batched inference ])."""
    asking = [(worker_id, steps) for worker_id, steps in requests if len(steps) > 0]
    if len(asking) < 2:
        return [policy.get_action(steps, worker_id) for worker_id, steps in requests]
    global_agent_ids = [
        get_global_agent_id(worker_id, int(agent_id)) for worker_id, steps in asking for agent_id in steps.agent_id
    ]
    run_out = policy.evaluate(_concatenate([steps for _, steps in asking]), global_agent_ids)
    policy.save_memories(global_agent_ids, run_out.get("memory_out"))
    policy.check_nan_action(run_out.get("action"))
    infos = []
    start = 0
    for _, steps in requests:
        if len(steps) == 0:
            infos.append(ActionInfo.empty())
            continue
        end = start + len(steps)
        outputs = {key: _rows(value, start, end) for key, value in run_out.items()}
        infos.append(
            ActionInfo(
                action=outputs.get("action"),
                env_action=outputs.get("env_action"),
                outputs=outputs,
                agent_ids=list(steps.agent_id),
            )
        )
        start = end
    return infos


def _concatenate(batch: Sequence[DecisionSteps]) -> DecisionSteps:
    """One DecisionSteps with the agents of all, in order (what ``evaluate`` reads: the
    observations and the action masks)."""
    masks = None
    if any(steps.action_mask is not None for steps in batch):
        branches = next(steps.action_mask for steps in batch if steps.action_mask is not None)
        masks = [
            np.concatenate(
                [
                    steps.action_mask[b] if steps.action_mask is not None
                    else np.zeros((len(steps), branch.shape[1]), dtype=bool)  # nothing masked
                    for steps in batch
                ]
            )
            for b, branch in enumerate(branches)
        ]
    return DecisionSteps(
        obs=[np.concatenate([steps.obs[i] for steps in batch]) for i in range(len(batch[0].obs))],
        reward=np.concatenate([steps.reward for steps in batch]),
        agent_id=np.concatenate([steps.agent_id for steps in batch]),
        action_mask=masks,
        group_id=np.concatenate([steps.group_id for steps in batch]),
        group_reward=np.concatenate([steps.group_reward for steps in batch]),
    )


def _rows(value: Any, start: int, end: int) -> Any:
    """Rows ``start:end`` (one worker's agents) of an output of ``evaluate``, as its own copy."""
    if isinstance(value, _ActionTupleBase):  # ActionTuple, LogProbsTuple
        return type(value)(continuous=value.continuous[start:end].copy(), discrete=value.discrete[start:end].copy())
    if isinstance(value, np.ndarray):
        return value[start:end].copy()
    raise TypeError(f"evaluate() returned a {type(value).__name__}: batched inference cannot split it")
