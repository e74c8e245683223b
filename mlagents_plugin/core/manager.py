"""ML-Agents' EnvManager over supervised worker slots: every decision, for every backend.

Here, once: stepping and resetting, deadlines, the restart policy, port moves, dropping a failed
worker's data, health stats, and closing whatever is still open at interpreter exit. A backend
(core/backend.py) only starts, reaches, waits for and takes down workers; each slot's state
changes only through its transitions (core/lifecycle.py).
"""
import atexit
import multiprocessing.util  # noqa: F401  registers its exit handler before ours: NOTE [ Interpreter exit ]
import time
from typing import Any, Callable, Dict, List, Optional, Set

from mlagents.trainers.action_info import ActionInfo
from mlagents.trainers.env_manager import EnvironmentStep, EnvManager
from mlagents.trainers.policy import Policy
from mlagents.trainers.policy.torch_policy import TorchPolicy
from mlagents.trainers.settings import RunOptions, TrainerSettings
from mlagents_envs import logging_util
from mlagents_envs.base_env import BaseEnv, BehaviorName, BehaviorSpec
from mlagents_envs.environment import UnityEnvironment
from mlagents_envs.exception import UnityWorkerInUseException
from mlagents_envs.side_channel.side_channel import SideChannel
from mlagents_envs.timers import hierarchical_timer, timed

from mlagents_plugin.core import batching, factories, signals, worker_inputs
from mlagents_plugin.core.backend import Backend, BackendSetup, Placed, Reply, WorkerRef, WorkerTimers
from mlagents_plugin.core.errors import (
    AllWorkersFailedError,
    ManagerClosedError,
    RemoteWorkerError,
    WorkerTimeoutError,
    add_note,
    error_from_stop,
    exception_from_envelope,
)
from mlagents_plugin.core.gathering import Gathering
from mlagents_plugin.core.lifecycle import CHECK_INVARIANTS, Reason, Slot, WorkerState
from mlagents_plugin.core.names import command_name
from mlagents_plugin.core.placement import Placement
from mlagents_plugin.core.protocol import (
    EnvironmentCommand,
    EnvironmentRequest,
    ParameterCall,
    StepPayload,
    WorkerHello,
    WorkerSpec,
    pack,
    qualified_name,
)
from mlagents_plugin.core.restart import Cause, RestartPolicy
from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.core.stats import HealthStats
from mlagents_plugin.core.watched import WatchedClock
from mlagents_plugin.core.wire import Decoders
from mlagents_plugin.integration import compat

logger = logging_util.get_logger(__name__)

# An upper bound on any single wait, so that a wait never outlives a deadline computed late.
MAX_WAIT_S = 1.0
# How many times one worker may move to another worker id because its port is taken.
MAX_PORT_MOVES = 8

EnvFactory = Callable[[int, List[SideChannel]], BaseEnv]


class SupervisedManagerBase(EnvManager):
    """The manager over a backend; ``SupervisedEnvManager`` and ``RayEnvManager`` choose one."""

    def __init__(
        self,
        env_factory: EnvFactory,
        run_options: RunOptions,
        n_env: int,
        settings: Optional[EnvManagerSettings],
        backend: Callable[[BackendSetup], Backend],
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
    ):
        """``backend`` builds the transport (a Backend subclass); ``clock`` and ``cpu_clock`` (this
        thread's CPU time) are injected by the fast tests. Every worker is started before this
        returns."""
        super().__init__()
        if not callable(env_factory):
            raise TypeError(
                f"env_factory must be callable as (worker_id, side_channels) -> BaseEnv, "
                f"not {env_factory!r}"
            )
        self.run_options = run_options
        self.settings = (settings or EnvManagerSettings()).resolved(run_options)
        assert self.settings.startup_timeout_s is not None and self.settings.step_timeout_s is not None
        self._startup_timeout_s: float = self.settings.startup_timeout_s  # resolved: never None
        self._step_timeout_s: float = self.settings.step_timeout_s
        self._clock = clock
        self._watched = WatchedClock(clock, cpu_clock)  # the deadlines': NOTE [ Time nobody watched ]
        other_machines = getattr(backend, "WORKERS_ON_OTHER_MACHINES", False)
        self._pickled_factory = factories.dumps_factory(env_factory, other_machines=other_machines)
        self.env_parameters: Optional[Dict] = None
        self._parameter_calls: List[ParameterCall] = []  # env_parameters, as a worker applies them
        self._engine_config = worker_inputs.engine_config(run_options.engine_settings)
        self._analytics = worker_inputs.Analytics(run_options)
        self._restarts = RestartPolicy(
            run_options.env_settings, self.settings.restart_on, self.settings.restart_backoff_s, clock
        )
        self._slots = [Slot(i) for i in range(n_env)]
        self._spare_env_worker_id = n_env
        # mlagents-learn without --env: ML-Agents' factory connects to the Editor's fixed port
        self._waits_for_the_editor = (
            run_options.env_settings.env_path is None
            and getattr(env_factory, "__module__", None) == "mlagents.trainers.learn"
        )
        self._completed: List[EnvironmentStep] = []
        self._decoders = Decoders()
        self._failures: List[BaseException] = []  # of the wait being handled: _pump raises the first
        self._health = HealthStats(n_env, clock)
        self._gathering = Gathering(n_env)  # NOTE [ Gathering a batch ]
        self._closed = False
        self._interrupts_before = signals.interrupts()  # NOTE [ Trainer signals ]: a lost one is raised again
        self._backend = backend(
            BackendSetup(self.settings, n_env, self._pickled_factory, clock)
        )
        _open_managers.add(self)
        try:
            for slot in self._slots:
                self._launch(slot)
        except BaseException:
            self.close()
            raise

    # ----------------------------------------------------------------- EnvManager interface

    def _step(self) -> List[EnvironmentStep]:
        signals.raise_if_lost(self._interrupts_before)
        if not self._completed:  # else: steps of a wait that raised, returned first
            self._queue_steps()
        while not self._completed:  # one wait returns every worker that is ready by then
            self._pump()
            if self._completed and self.settings.batch_inference:
                self._gather()  # (a worker whose step is in may die meanwhile: then wait on)
        if self.settings.early_actions:  # before the steps are handed over: a raise keeps them
            self._queue_steps([slot for slot in self._idle() if self._acts_early(slot)])
            self._backend.send_now()
        steps, self._completed = self._completed, []
        return self._with_health_stats(steps)

    def _reset_env(self, config: Optional[Dict] = None) -> List[EnvironmentStep]:
        signals.raise_if_lost(self._interrupts_before)
        # Steps in flight belong to the episodes being reset: let them land, then drop them.
        self._pump_until(lambda: all(s.awaiting is not EnvironmentCommand.STEP for s in self._slots))
        self._completed.clear()
        self.set_env_parameters(config)
        for slot in self._slots:
            if slot.live and slot.awaiting is None:
                self._request(slot, EnvironmentCommand.RESET)

        # One step per worker, as upstream. A worker that fails now is restarted (and reset) if
        # the policy allows, and its new incarnation's reset step is the one returned; if it is
        # not restarted, its error is raised from here.
        def every_worker_reset() -> bool:
            reset = {step.worker_id for step in self._completed}
            return all(s.worker_id in reset or s.state is WorkerState.FAILED for s in self._slots)

        self._pump_until(every_worker_reset)
        steps, self._completed = self._completed, []
        return steps

    def set_env_parameters(self, config: Optional[Dict] = None) -> None:
        self.env_parameters = config
        self._parameter_calls = worker_inputs.parameter_calls(config)
        for slot in self._slots:
            if slot.live:
                self._send(slot, EnvironmentCommand.ENVIRONMENT_PARAMETERS, self._parameter_calls)

    def on_training_started(self, behavior_name: str, trainer_settings: TrainerSettings) -> None:
        message = self._analytics.training_started(behavior_name, trainer_settings)
        slot = self._slots[0]  # as upstream: only worker 0 has the analytics channel
        if slot.live:
            self._send(slot, EnvironmentCommand.TRAINING_STARTED, message)

    @property
    def training_behaviors(self) -> Dict[BehaviorName, BehaviorSpec]:
        """Every behaviour any worker reported. Workers send specs with READY and whenever
        new behaviours appear, so this needs no round trip once the workers are up."""
        self._pump_until(
            lambda: any(s.behavior_specs for s in self._slots)
            or all(s.state is not WorkerState.STARTING for s in self._slots)
        )
        result: Dict[BehaviorName, BehaviorSpec] = {}
        for slot in self._slots:
            result.update(slot.behavior_specs)
        return result

    @property
    def placements(self) -> Dict[int, Placement]:
        """Where each running worker is, by worker id: its pid, and its node and actor on Ray."""
        return {
            s.worker_id: (s.placement or Placement(s.worker_id, None, "localhost"))._replace(pid=s.known_pid)
            for s in self._slots
            if s.live and s.known_pid is not None
        }

    @property
    def worker_pids(self) -> Dict[int, int]:
        """The pid of each running (or starting) worker, by worker id."""
        return {worker_id: p.pid for worker_id, p in self.placements.items() if p.pid is not None}

    @property
    def restart_counts(self) -> Dict[str, int]:
        """Restarts so far, by cause (``died``, ``hung``, ``unity``, ``restart_on``)."""
        counts: Dict[str, int] = {}
        for health in self._health.workers:
            for cause, n in health.restarts.items():
                counts[cause.value] = counts.get(cause.value, 0) + n
        return counts

    def close(self) -> None:
        """Close every worker, bounded: CLOSE, then the backend's ladder. Idempotent.

        It never raises: ``mlagents-learn`` writes its run logs (timers, training status) after
        it. A first interrupt while closing hurries the close along (workers still busy get
        SIGTERM, which makes them close their envs now; envs already closing finish); a second
        one kills every worker at once (NOTE [ Trainer signals ]).
        """
        if self._closed:
            return
        self._closed = True
        _open_managers.discard(self)
        try:
            try:
                self._close_workers(signals.interrupted_twice())
            except KeyboardInterrupt:
                if signals.interrupted_twice() or not self._backend.hurry():
                    raise
                logger.warning(
                    "Interrupted while closing: env workers still busy are asked to stop (SIGTERM) "
                    "and close their envs now; envs already closing finish. Ctrl-C again kills them."
                )
                self._close_workers(False)
        except KeyboardInterrupt:
            self._kill_workers()
        except Exception:
            logger.exception(f"Closing the env workers of this {type(self).__name__} failed.")
        finally:
            self._summarize()

    def _kill_workers(self) -> None:
        """A second interrupt while closing: every worker is killed at once. Each further one
        lands between two releases, and the next attempt goes on from there."""
        for _ in range(3):
            try:
                logger.warning("Interrupted again while closing: killing the env workers now.")
                self._close_workers(True)
                return
            except KeyboardInterrupt:
                continue
            except Exception:
                logger.exception(f"Killing the env workers of this {type(self).__name__} failed.")
                return

    def _summarize(self) -> None:
        """One line per worker: how it did, and how its last process ended. Never raises: an
        interrupt now would only cut the summary short."""
        try:
            for slot in self._slots:
                slot.close()
                self._decoders.forget(slot.worker_id)  # released or not (an interrupt cut the close)
                logger.info(
                    f"Env worker {slot.worker_id}: {self._health.summary(slot.worker_id)}; "
                    f"its last process {self._backend.outcome(slot.worker_id)}."
                )
        except KeyboardInterrupt:
            pass

    def _close_workers(self, interrupted: bool) -> None:
        """Release every live slot, then finish the backend's ladder; where an interrupt stopped
        an earlier call, this one goes on."""
        for slot in self._slots:
            if slot.live:
                if interrupted:
                    reason = Reason.INTERRUPTED
                elif slot.state is WorkerState.STARTING:
                    reason = Reason.BUILDING
                else:
                    reason = Reason.CLOSE
                with signals.deferred():  # NOTE [ Trainer signals ]: never half released
                    slot.sent(EnvironmentCommand.CLOSE)
                    try:
                        self._release(slot, reason)
                    except Exception:  # the others are still to be released, and the backend closed
                        logger.exception(f"Releasing {slot.label} failed.")
                    slot.close()
        for timers in self._backend.close(interrupted):
            merge_worker_timers(timers.timer_root)

    # ------------------------------------------------------------------------ stepping

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

    def _idle(self) -> List[Slot]:
        return [slot for slot in self._slots if slot.state is WorkerState.IDLE]

    def _acts_early(self, slot: Slot) -> bool:
        """May the slot's next actions be sent before its step is returned (NOTE [ Actions as steps land ])?"""
        names = _last_step(slot).current_all_step_result
        return all(name in self.policies and _policy_acts_early(self.policies[name]) for name in names)

    def _gather(self) -> None:
        """Wait for the workers still stepping whose replies are due within one forward pass
        (NOTE [ Gathering a batch ] in gathering.py)."""
        stepping = [
            (slot.worker_id, slot.sent_at)
            for slot in self._slots
            if slot.state is WorkerState.BUSY and slot.awaiting is EnvironmentCommand.STEP
        ]
        if not stepping:
            return
        until, due = self._gathering.wait_until(stepping, self._watched.now())
        while any(self._slots[worker_id].state is WorkerState.BUSY for worker_id in due):
            left_s = until - self._watched.now()
            if left_s <= 0:
                return
            self._pump(left_s)

    def _queue_steps(self, slots: Optional[List[Slot]] = None) -> None:
        """Compute the next actions of ``slots`` (by default every idle one) and send them."""
        slots = self._idle() if slots is None else slots
        if not slots:
            return
        started = self._clock()
        if self.settings.batch_inference and len(slots) > 1:
            actions = self._take_steps([_last_step(slot) for slot in slots])
        else:
            actions = [self._take_step(_last_step(slot)) for slot in slots]
        if self.settings.batch_inference:
            self._gathering.passed(self._clock() - started)
        for slot, all_action_info in zip(slots, actions, strict=True):
            slot.previous_all_action_info = all_action_info
            env_actions = {
                name: info.env_action
                for name, info in all_action_info.items()
                if len(info.agent_ids) > 0
            }
            self._request(slot, EnvironmentCommand.STEP, env_actions)

    @timed
    def _take_steps(self, last_steps: List[EnvironmentStep]) -> List[Dict[BehaviorName, ActionInfo]]:
        """``[self._take_step(step) for step in last_steps]``, with one forward pass per
        behaviour for all of them (NOTE [ Batched inference ] in batching.py)."""
        actions: List[Dict[BehaviorName, ActionInfo]] = [{} for _ in last_steps]
        for name, policy in self.policies.items():
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
    def _take_step(self, last_step: EnvironmentStep) -> Dict[BehaviorName, ActionInfo]:
        all_action_info: Dict[str, ActionInfo] = {}
        for brain_name, step_tuple in last_step.current_all_step_result.items():
            if brain_name in self.policies:
                all_action_info[brain_name] = self.policies[brain_name].get_action(
                    step_tuple[0], last_step.worker_id
                )
        return all_action_info

    def _with_health_stats(self, steps: List[EnvironmentStep]) -> List[EnvironmentStep]:
        """Attach due health numbers to the first step (see stats.py)."""
        health = self._health.due()
        if not health:
            return steps
        first = steps[0]
        stats = {**first.environment_stats, **health}
        return [first._replace(environment_stats=stats)] + steps[1:]

    # ------------------------------------------------------------------ worker lifecycle

    def _launch(self, slot: Slot) -> None:
        with signals.deferred():  # NOTE [ Trainer signals ]: no process nobody knows of
            slot.launch(self._watched.now(), self._startup_timeout_s)
            try:
                placement = self._backend.launch(self._worker_spec(slot))
                if placement is not None:
                    slot.placed(placement)
            except BaseException:
                slot.close()  # nothing of it runs: nothing to release
                raise

    def _worker_spec(self, slot: Slot) -> WorkerSpec:
        """What the slot's new incarnation starts with; the backend fills in its own part."""
        return WorkerSpec(
            worker_id=slot.worker_id,
            incarnation=slot.incarnation,
            env_worker_id=slot.env_worker_id,
            pickled_env_factory=self._pickled_factory,
            env_path=self.run_options.env_settings.env_path,
            engine_config=self._engine_config,
            analytics=self._analytics.environment_initialized if slot.worker_id == 0 else None,
            log_level=logger.getEffectiveLevel(),
            owner_tag="",
            hardened=False,
            segment_prefix=None,
            listen=self.settings.listen,
        )

    def _send(self, slot: Slot, cmd: EnvironmentCommand, payload: Any = None) -> None:
        slot.sent(cmd)
        data = pack(EnvironmentRequest(cmd, slot.worker_id, slot.incarnation, payload))
        self._backend.deliver(self._ref(slot), cmd, data)

    def _ref(self, slot: Slot) -> WorkerRef:
        """The slot's current incarnation, as a backend is told of it (it never gets the slot)."""
        return WorkerRef(
            slot.worker_id,
            slot.incarnation,
            slot.label,
            slot.awaiting or slot.last_command,
            self._decoders.segment_name(slot.worker_id),
        )

    def _release(self, slot: Slot, reason: Reason) -> None:
        """The backend lets the slot's incarnation go; its step results' segment is unmapped."""
        try:
            self._backend.release(self._ref(slot), reason)
        finally:
            self._decoders.forget(slot.worker_id)

    def _request(self, slot: Slot, cmd: EnvironmentCommand, payload: Any = None) -> None:
        """Send a request that has a reply (STEP, RESET), and start its clock."""
        slot.request(cmd, self._watched.now(), self._step_timeout_s)
        self._send(slot, cmd, payload)

    # ------------------------------------------------------------------------- events

    def _pump_until(self, done: Callable[[], bool]) -> None:
        while not done():
            self._pump()

    def _check_usable(self) -> None:
        if self._closed:
            raise ManagerClosedError(f"This {type(self).__name__} is closed.")
        if not any(s.live or s.state is WorkerState.RESTARTING for s in self._slots):
            raise AllWorkersFailedError(
                "Every env worker has failed (their errors were raised earlier); close this "
                f"{type(self).__name__} and create a new one."
            )

    def _pump(self, limit_s: float = MAX_WAIT_S) -> None:
        """Wait once (at most ``limit_s``) for replies, deaths and deadlines, and handle every one
        of them; then raise the first error that must reach the trainer (NOTE [ A wait is handled
        whole ])."""
        self._check_usable()
        self._watched.entered()
        failures: List[BaseException] = []
        self._failures = failures
        try:
            bound_s, started = min(limit_s, self._time_to_next_deadline()), self._clock()
            events = self._backend.wait(bound_s)
            self._watched.waited(bound_s, started)
            for event in events:
                if isinstance(event, WorkerTimers):
                    merge_worker_timers(event.timer_root)
                    continue
                slot = self._slots[event.worker_id]
                if slot.live and slot.incarnation == event.incarnation:  # else: from a replaced one
                    if isinstance(event, Reply):
                        self._handle(slot, event)
                    elif isinstance(event, Placed):
                        slot.placed(event.placement)
                    else:
                        self._fail(slot, event.error)
            self._backend.advance()
            self._check_deadlines()
            self._start_due_restarts()
            if CHECK_INVARIANTS:
                for slot in self._slots:
                    slot.check()
        finally:
            self._watched.left()
            self._failures = []
        if failures:
            raise failures[0]

    def _time_to_next_deadline(self) -> float:
        watched_now, now = self._watched.now(), self._clock()
        waits = [s.deadline - watched_now for s in self._slots if s.deadline is not None]  # watched time
        waits += [  # a restart waiting for its predecessor to go waits on the backend's deadline
            s.restart_at - now
            for s in self._slots
            if s.state is WorkerState.RESTARTING and not self._backend.departing(s.worker_id)
        ]
        backend_deadline = self._backend.next_deadline()
        if backend_deadline is not None:
            waits.append(backend_deadline - now)
        if not waits:
            return MAX_WAIT_S
        return min(MAX_WAIT_S, max(0.0, min(waits)))

    def _handle(self, slot: Slot, reply: Reply) -> None:
        response = reply.response
        if response.cmd is EnvironmentCommand.READY:
            hello: WorkerHello = response.payload
            slot.behavior_specs.update(hello.behavior_specs or {})
            slot.ready(hello.pid, self._watched.now(), self._step_timeout_s)
        elif response.cmd in (EnvironmentCommand.STEP, EnvironmentCommand.RESET):
            payload: StepPayload = response.payload
            if payload.behavior_specs:
                slot.behavior_specs.update(payload.behavior_specs)
            if payload.timer_root is not None:
                merge_worker_timers(payload.timer_root)
            if response.cmd is EnvironmentCommand.RESET:
                slot.previous_all_action_info = {}
            else:
                # the worker's own time: from sending, a step's time would include the trainer's
                # work while the step waited to be read (NOTE [ Actions as steps land ])
                self._health.stepped(slot.worker_id, payload.step_s)
                self._gathering.stepped(slot.worker_id, payload.step_s)
            step = EnvironmentStep(
                self._decoders.decode(slot.worker_id, payload.all_step_result),
                slot.worker_id,
                slot.previous_all_action_info,
                payload.environment_stats,
            )
            slot.previous_step = step
            slot.answered()
            self._completed.append(step)
        elif response.cmd is EnvironmentCommand.ENV_EXITED:
            self._fail(slot, exception_from_envelope(response.payload, slot.label))
        elif response.cmd is EnvironmentCommand.STOPPED:
            self._fail(slot, error_from_stop(response.payload, slot.label, slot.worker_id, slot.pid))

    def _check_deadlines(self) -> None:
        now = self._watched.now()
        for slot in self._slots:
            if slot.live and slot.deadline is not None and now >= slot.deadline:
                if slot.state is WorkerState.STARTING:
                    setting = "startup_timeout_s"
                    what = (
                        f"did not finish building its env within startup_timeout_s="
                        f"{self.settings.startup_timeout_s} s{self._backend.startup_hint()}"
                    )
                else:
                    setting = "step_timeout_s"
                    what = (
                        f"did not answer {command_name(slot.awaiting)} within step_timeout_s="
                        f"{self.settings.step_timeout_s} s"
                    )
                error = WorkerTimeoutError(
                    f"{slot.label} {what}; it is hung, or the env is slower than the timeout "
                    f"allows (raise env_manager.{setting} or --timeout-wait).",
                    slot.worker_id,
                    slot.pid,
                )
                self._fail(slot, error, Reason.HUNG)

    def _fail(self, slot: Slot, exc: BaseException, reason: Reason = Reason.CLOSE) -> None:
        """A worker failed: restart it if the policy allows, else ``exc`` is for the trainer
        (raised by ``_pump`` when the wait is handled whole).

        Only this worker restarts; the others keep stepping. Its steps not yet returned, and
        its partial trajectories, are dropped: they came from the env that failed. Released and
        moved on as one step (NOTE [ Trainer signals ]: an interrupt between the two would leave
        a live slot whose process the backend no longer has).
        """
        with signals.deferred():
            self._release_failed(slot, exc, reason)

    def _release_failed(self, slot: Slot, exc: BaseException, reason: Reason) -> None:
        worker_id = slot.worker_id
        self._completed = [s for s in self._completed if s.worker_id != worker_id]
        self._release(slot, reason)
        compat.drop_worker_trajectories(self.agent_managers, worker_id)
        if _is_port_in_use(exc) and self._waits_for_the_editor:
            add_note(exc, self._editor_port_taken())
        elif _is_port_in_use(exc) and self._health.workers[worker_id].port_moves < MAX_PORT_MOVES:
            self._move_to_another_port(slot)
            return
        cause = self._restarts.classify(exc)
        if cause is Cause.FORK_SERVER:  # not the worker's doing: at once, not counted
            self._health.failed(worker_id, cause, True)
            logger.info(f"Restarting env worker {worker_id} from a new fork server: {exc}")
            slot.restart(self._clock())
            return
        restart = cause is not Cause.OTHER and self._restarts.has_quota(worker_id, slot.ever_started)
        self._health.failed(worker_id, cause, restart)
        if restart:
            delay = self._restarts.record(worker_id, cause, exc)
            logger.warning(
                f"Restarting env worker {worker_id} in {delay:.1f} s after "
                f"{type(exc).__name__}: {exc}"
            )
            slot.restart(self._clock() + delay)
            return
        if cause is not Cause.OTHER:
            add_note(exc, self._restarts.explain_refusal(worker_id, slot.ever_started))
        slot.fail()
        logger.error(f"Env worker {worker_id} failed: {type(exc).__name__}: {exc}")
        self._failures.append(exc)  # raised once the wait is handled whole

    def _editor_port_taken(self) -> str:
        """The Editor connects to one fixed port: moving elsewhere cannot help."""
        port = UnityEnvironment.DEFAULT_EDITOR_PORT
        holder = self._backend.port_holder(port)
        return (
            f"mlagents-learn waits for the Unity Editor on port {port}, which "
            f"{holder or 'another process'} holds: only one run at a time can wait for the Editor. "
            "Stop the other run, or train a build with --env."
        )

    def _move_to_another_port(self, slot: Slot) -> None:
        """Restart the worker at once with a worker id nobody uses: a Unity build's port is
        base_port + worker id, and another process holds this one (NOTE [ One run per port ] in
        integration/rpc_server.py)."""
        base_port = self.run_options.env_settings.base_port
        old, new = slot.env_worker_id, self._spare_env_worker_id
        self._spare_env_worker_id += 1
        slot.env_worker_id = new
        self._health.moved_port(slot.worker_id)
        holder = self._backend.port_holder(base_port + old)
        logger.warning(
            f"Env worker {slot.worker_id}: port {base_port + old} (worker id {old}) is "
            + (f"held by {holder}" if holder else "in use (by another run on the same --base-port, or a "
               "Unity player left from an earlier run)")
            + f"; moving to worker id {new} (port {base_port + new})."
        )
        slot.restart(self._clock())

    def _start_due_restarts(self) -> None:
        now = self._clock()
        for slot in self._slots:
            if (
                slot.state is WorkerState.RESTARTING
                and now >= slot.restart_at
                and not self._backend.departing(slot.worker_id)  # one incarnation at a time
            ):
                self._launch(slot)
                if self._parameter_calls:
                    self._send(slot, EnvironmentCommand.ENVIRONMENT_PARAMETERS, self._parameter_calls)
                self._request(slot, EnvironmentCommand.RESET)


def _policy_acts_early(policy: Policy) -> bool:
    """ML-Agents' own TorchPolicy, without memories (NOTE [ Actions as steps land ])."""
    return type(policy) is TorchPolicy and not policy.use_recurrent


def _last_step(slot: Slot) -> EnvironmentStep:
    """The step the slot's next actions answer (an empty one before its first)."""
    return slot.previous_step if slot.previous_step is not None else EnvironmentStep.empty(slot.worker_id)


def merge_worker_timers(timer_root: Any) -> None:
    """Add a worker's timer tree to the trainer's, under ``workers`` (as upstream does)."""
    if timer_root is None:
        return
    with hierarchical_timer("workers") as main_timer_node:
        main_timer_node.merge(timer_root, root_name="worker_root", is_parallel=True)


def _is_port_in_use(exc: BaseException) -> bool:
    # A rebuilt UnityWorkerInUseException garbles its message, so it arrives by name.
    return isinstance(exc, UnityWorkerInUseException) or (
        isinstance(exc, RemoteWorkerError)
        and exc.type_name == qualified_name(UnityWorkerInUseException)
    )


# NOTE [ A wait is handled whole ]
# One wait returns every event that is ready: replies, deaths, a worker's last words. Reading an
# event consumes its bytes from the pipe, so an event left unhandled is lost: had a failure been
# raised in the middle of the batch, a sibling's reply read in the same wait would be dropped,
# its slot left BUSY, and that worker declared hung step_timeout_s later (the manager promises to
# stay usable after one worker fails for good). So a failure that must reach the trainer is kept
# as a value until the whole wait is handled, deadlines and restarts included, and then the first
# one is raised; the steps handled meanwhile are returned by the next ``get_steps``, before any
# new request goes out (the others' failures are logged, their slots FAILED). CPython's process
# pool returns failures as values for the same reason.


# NOTE [ Interpreter exit ]
# Worker processes are not daemonic (a daemonic process may not start children, and envs may
# need to), so multiprocessing's own exit handler *joins* them, without a timeout. A trainer that
# never called close() would hang there. This handler is registered after multiprocessing's and
# therefore runs before it: it closes every manager still open, ladder included, so nothing is
# left for multiprocessing to wait for. (Ray registers its own exit handler when it is imported,
# after this one, so it runs first and its actors go with the driver; a RayEnvManager closed
# here then only says so: ray/backend.py.)
_open_managers: Set[SupervisedManagerBase] = set()


@atexit.register
def _close_open_managers() -> None:
    for manager in list(_open_managers):
        manager.close()
