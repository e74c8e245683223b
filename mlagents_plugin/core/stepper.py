"""The Stepper: from the policies' actions to the workers' steps, as ML-Agents' ``get_steps`` asks.

``send_actions`` (Gymnasium's ``step_async``) computes the next actions of idle workers, in one
forward pass per behaviour where it can (core/batching.py), and asks the supervisor to send
them; ``collect`` (``step_wait``) pumps until steps are in, waiting a little longer for workers
whose steps are due within one forward pass (core/gathering.py), then sends the next actions of
the steps it returns before it returns them (NOTE [ Actions as steps land ]). It keeps, per
worker, the step its next actions answer and the actions that led to its outstanding step; the
slots, the pump and every failure are the supervisor's (core/supervision.py).
"""
import time
from typing import Callable, Dict, List, Optional, Set

from mlagents.trainers.action_info import ActionInfo
from mlagents.trainers.env_manager import EnvironmentStep
from mlagents.trainers.policy import Policy
from mlagents.trainers.policy.torch_policy import TorchPolicy
from mlagents_envs.base_env import BehaviorName
from mlagents_envs.timers import timed

from mlagents_plugin.core import batching
from mlagents_plugin.core.gathering import Gathering
from mlagents_plugin.core.protocol import EnvironmentCommand
from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.core.supervision import MAX_WAIT_S, Landed, Supervisor

AllActionInfo = Dict[BehaviorName, ActionInfo]

# NOTE [ Actions as steps land ]
# ML-Agents' loop is ``get_steps`` (the actions of the workers whose steps it returned last
# time are computed and sent, then it waits for steps), ``process_steps`` (the steps go into
# the AgentManagers), then the trainer's ``advance`` (trajectories, updates). A worker whose
# step was returned sits idle through all of that; only workers still stepping overlap with
# it. With ``early_actions`` (the default), ``get_steps`` computes and sends the next actions
# for the steps it returns before it returns them, so the envs step while the trainer works.
# What the actions are computed from does not change (each step's own observations), nor
# what the AgentManager gets (the ActionInfo that led to the step). What changes is the
# policy they come from: as it was before the round's ``trainer.advance`` (its weights, its
# observation normaliser, which PPO updates in every advance, a self-play snapshot), not
# after it, as upstream's workers that are still stepping then get theirs. PPO keeps the
# log-probs of the actions as taken, so its ratios stay right. Likewise, new environment
# parameters (a lesson change) reach each env one step later: a step is in flight already.
# Three kinds of step keep upstream's order:
# - a recurrent policy's: computing actions saves the agents' memories (``save_memories``)
#   and the AgentManager then reads the previous ones for the step it adds, and forgets an
#   ended episode's, so that the agent's next action starts from none;
# - a behaviour's without a policy yet: the trainer makes it after it has seen the step;
# - a policy's that is not ML-Agents' own TorchPolicy (a subclass may change what
#   computing actions saves, or what it reads that ``add_experiences`` writes).


class Stepper:
    def __init__(
        self,
        supervisor: Supervisor,
        pump: Callable[[float], None],
        policies: Dict[BehaviorName, Policy],
        settings: EnvManagerSettings,
        n_env: int,
        clock: Callable[[], float] = time.monotonic,
    ):
        """``pump(limit_s)`` is the manager's: a supervisor pump whose landed steps come back
        through ``landed``; ``policies`` is the EnvManager's own dict (set_policy fills it)."""
        self._supervisor = supervisor
        self._pump = pump
        self._policies = policies
        self._batch = settings.batch_inference
        self._early = settings.early_actions
        self._clock = clock
        self._gathering = Gathering(n_env)  # NOTE [ Gathering a batch ]
        self._last_steps: Dict[int, EnvironmentStep] = {}  # by worker id: what its next actions answer
        self._sent: Dict[int, AllActionInfo] = {}  # by worker id: what led to its outstanding step
        self._completed: List[EnvironmentStep] = []  # landed, not yet returned

    # ------------------------------------------------------------------- get_steps

    def step(self) -> List[EnvironmentStep]:
        """ML-Agents' ``_step``: actions out for every idle worker, then every step that is in.
        Steps of a pump that raised are returned first, before any new request goes out."""
        if not self._completed:
            self.send_actions()
        while not self._completed:  # one wait returns every worker that is ready by then
            self._pump(MAX_WAIT_S)
            if self._completed and self._batch:
                self._gather()  # (a worker whose step is in may die meanwhile: then wait on)
        if self._early:  # before the steps are handed over: a raise keeps them
            self.send_actions([w for w in self._supervisor.idle() if self._acts_early(w)])
            self._supervisor.flush()  # (also what a Ray host held back behind its call in flight)
        return self.take_completed()

    def send_actions(self, worker_ids: Optional[List[int]] = None) -> None:
        """Compute the next actions of ``worker_ids`` (by default every idle worker) and send
        them, together (one call per Ray actor)."""
        worker_ids = self._supervisor.idle() if worker_ids is None else worker_ids
        if not worker_ids:
            return
        last_steps = [self._last_step(w) for w in worker_ids]
        started = self._clock()
        if self._batch and len(worker_ids) > 1:
            actions = self._take_steps(last_steps)
        else:
            actions = [self._take_step(step) for step in last_steps]
        if self._batch:
            self._gathering.passed(self._clock() - started)
        for worker_id, all_action_info in zip(worker_ids, actions, strict=True):
            self._sent[worker_id] = all_action_info
            env_actions = {
                name: info.env_action for name, info in all_action_info.items() if len(info.agent_ids) > 0
            }
            self._supervisor.request(worker_id, EnvironmentCommand.STEP, env_actions)
        self._supervisor.flush()

    def sent_actions(self, worker_id: int) -> AllActionInfo:
        """What led to the worker's outstanding (or last) step."""
        return self._sent.get(worker_id, {})

    # ----------------------------------------------------------- what the pump brought

    def landed(self, landed: List[Landed]) -> None:
        for result in landed:
            if result.command is EnvironmentCommand.RESET:
                self._sent[result.worker_id] = {}
            else:
                self._gathering.stepped(result.worker_id, result.step_s)
            step = EnvironmentStep(
                result.all_step_result,
                result.worker_id,
                self._sent.get(result.worker_id, {}),
                result.environment_stats,
            )
            self._last_steps[result.worker_id] = step
            self._completed.append(step)

    def forget(self, worker_id: int) -> None:
        """The worker's incarnation failed: its steps not yet returned are dropped (they came from
        the env that failed), and its next incarnation starts from none."""
        self._completed = [s for s in self._completed if s.worker_id != worker_id]
        self._last_steps.pop(worker_id, None)
        self._sent.pop(worker_id, None)

    def completed_workers(self) -> Set[int]:
        """The workers whose steps are in and not yet returned."""
        return {step.worker_id for step in self._completed}

    def take_completed(self) -> List[EnvironmentStep]:
        steps, self._completed = self._completed, []
        return steps

    def drop_completed(self) -> None:
        self._completed.clear()

    # ---------------------------------------------------------------------- internals

    def _last_step(self, worker_id: int) -> EnvironmentStep:
        """The step the worker's next actions answer (an empty one before its first)."""
        step = self._last_steps.get(worker_id)
        return step if step is not None else EnvironmentStep.empty(worker_id)

    def _acts_early(self, worker_id: int) -> bool:
        """May the worker's next actions be sent before its step is returned (NOTE [ Actions as
        steps land ])?"""
        names = self._last_step(worker_id).current_all_step_result
        return all(name in self._policies and _policy_acts_early(self._policies[name]) for name in names)

    def _gather(self) -> None:
        """Wait for the workers still stepping whose replies are due within one forward pass
        (NOTE [ Gathering a batch ] in gathering.py)."""
        stepping = self._supervisor.stepping()
        if not stepping:
            return
        watched = self._supervisor.watched
        until, due = self._gathering.wait_until(stepping, watched.now())
        while any(worker_id in due for worker_id, _ in self._supervisor.stepping()):
            left_s = until - watched.now()
            if left_s <= 0:
                return
            self._pump(left_s)

    @timed
    def _take_steps(self, last_steps: List[EnvironmentStep]) -> List[AllActionInfo]:
        """``[self._take_step(step) for step in last_steps]``, with one forward pass per
        behaviour for all of them (NOTE [ Batched inference ] in batching.py)."""
        actions: List[AllActionInfo] = [{} for _ in last_steps]
        for name, policy in self._policies.items():
            asking = [i for i, step in enumerate(last_steps) if name in step.current_all_step_result]
            requests = [
                (last_steps[i].worker_id, last_steps[i].current_all_step_result[name][0]) for i in asking
            ]
            if batching.batchable(policy):
                infos = batching.get_actions(policy, requests)
            else:
                infos = [policy.get_action(steps, worker_id) for worker_id, steps in requests]
            for i, info in zip(asking, infos, strict=True):
                actions[i][name] = info
        return actions

    @timed
    def _take_step(self, last_step: EnvironmentStep) -> AllActionInfo:
        """Upstream's ``_take_step``: one worker's actions, a policy call per behaviour."""
        all_action_info: AllActionInfo = {}
        for brain_name, step_tuple in last_step.current_all_step_result.items():
            if brain_name in self._policies:
                all_action_info[brain_name] = self._policies[brain_name].get_action(
                    step_tuple[0], last_step.worker_id
                )
        return all_action_info


def _policy_acts_early(policy: Policy) -> bool:
    """ML-Agents' own TorchPolicy, without memories (NOTE [ Actions as steps land ])."""
    return type(policy) is TorchPolicy and not policy.use_recurrent
