"""The Supervisor: the worker slots over a backend, their deadlines, failures, restarts and close.

It starts every worker, sends what it is asked to (collected in an outbox and delivered before
each wait, or on ``flush``), and in ``pump`` waits once and handles every event of the wait:
replies become ``Landed`` steps, deaths and passed deadlines become a restart or a failure as
the restart policy decides (core/restart.py). ``pump`` returns all of that as a value (NOTE [ A
wait is handled whole ]); it never computes actions (core/stepper.py does) nor knows ML-Agents'
EnvManager (core/manager.py wires the three together). Each slot's state changes only through
its transitions (core/lifecycle.py); this class is their one caller, which is why it is longer
than 400 lines: what writes a slot (start, send, the pump, failures, close) stays in one place.
"""
import time
from typing import Any, Callable, Dict, List, NamedTuple, Tuple

from mlagents_envs import logging_util
from mlagents_envs.base_env import BehaviorName, BehaviorSpec, DecisionSteps, TerminalSteps
from mlagents_envs.timers import hierarchical_timer

from mlagents_plugin.core import signals
from mlagents_plugin.core.backend import Backend, Event, Message, Placed, Reply, WorkerRef, WorkerTimers
from mlagents_plugin.core.errors import (
    AllWorkersFailedError,
    ManagerClosedError,
    WorkerTimeoutError,
    add_note,
    error_from_stop,
    exception_from_envelope,
)
from mlagents_plugin.core.lifecycle import CHECK_INVARIANTS, Reason, Slot, WorkerState, WorkerView
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
)
from mlagents_plugin.core.restart import Cause, Decision, Fail, MovePort, RestartPolicy
from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.core.stats import HealthStats
from mlagents_plugin.core.watched import WatchedClock
from mlagents_plugin.core.wire import Decoders

logger = logging_util.get_logger(__name__)

# An upper bound on any single wait, so that a wait never outlives a deadline computed late.
MAX_WAIT_S = 1.0

AllStepResult = Dict[BehaviorName, Tuple[DecisionSteps, TerminalSteps]]


class Landed(NamedTuple):
    """A worker's STEP or RESET came back."""

    worker_id: int
    command: EnvironmentCommand  # STEP or RESET
    all_step_result: AllStepResult
    environment_stats: Dict[str, Any]
    step_s: float  # the worker's own time for it


class Pumped(NamedTuple):
    """What one wait brought, handled whole (NOTE [ A wait is handled whole ]); ``pump`` fills
    the caller's."""

    landed: List[Landed]
    released: List[int]  # worker ids whose incarnation failed: what it sent before is void
    failures: List[BaseException]  # for the trainer, in order: no restart for these


class Supervisor:
    def __init__(
        self,
        settings: EnvManagerSettings,
        n_env: int,
        spec: Callable[[Slot], WorkerSpec],
        restarts: RestartPolicy,
        backend: Backend,
        owner: str,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
    ):
        """``settings`` resolved; ``spec`` makes a slot's next incarnation's WorkerSpec; ``owner``
        names the manager in messages. Starts no worker: ``launch_all`` does."""
        assert settings.startup_timeout_s is not None and settings.step_timeout_s is not None
        self.settings = settings
        self._startup_timeout_s: float = settings.startup_timeout_s
        self._step_timeout_s: float = settings.step_timeout_s
        self._spec = spec
        self._restarts = restarts
        self.backend = backend
        self._owner = owner
        self._clock = clock
        self.watched = WatchedClock(clock, cpu_clock)  # the deadlines': NOTE [ Time nobody watched ]
        self.health = HealthStats(n_env, clock)
        self._slots = [Slot(i) for i in range(n_env)]
        self._decoders = Decoders()
        self._outbox: List[Message] = []
        self._parameter_calls: List[ParameterCall] = []  # env_parameters, as a worker applies them
        self.closed = False

    # --------------------------------------------------------------------------- views

    @property
    def workers(self) -> List[WorkerView]:
        return [slot.view() for slot in self._slots]

    def idle(self) -> List[int]:
        return [slot.worker_id for slot in self._slots if slot.state is WorkerState.IDLE]

    def stepping(self) -> List[Tuple[int, float]]:
        """(worker id, watched time its STEP went) of every worker whose step is outstanding."""
        return [
            (slot.worker_id, slot.sent_at)
            for slot in self._slots
            if slot.state is WorkerState.BUSY and slot.awaiting is EnvironmentCommand.STEP
        ]

    def knows_behaviors(self) -> bool:
        """Has a worker reported a behaviour, or is none of them still starting?"""
        return any(s.behavior_specs for s in self._slots) or all(
            s.state is not WorkerState.STARTING for s in self._slots
        )

    def behavior_specs(self) -> Dict[BehaviorName, BehaviorSpec]:
        """Every behaviour any worker reported."""
        result: Dict[BehaviorName, BehaviorSpec] = {}
        for slot in self._slots:
            result.update(slot.behavior_specs)
        return result

    @property
    def placements(self) -> Dict[int, Placement]:
        return {
            s.worker_id: (s.placement or Placement(s.worker_id, None, "localhost"))._replace(pid=s.known_pid)
            for s in self._slots
            if s.live and s.known_pid is not None
        }

    # ------------------------------------------------------------------------ sending

    def launch_all(self) -> None:
        for slot in self._slots:
            self._launch(slot)

    def send(self, worker_id: int, cmd: EnvironmentCommand, payload: Any = None) -> None:
        """Send a request without a reply, if the worker is live (delivered at ``flush``)."""
        slot = self._slots[worker_id]
        if slot.live:
            self._send(slot, cmd, payload)

    def request(self, worker_id: int, cmd: EnvironmentCommand, payload: Any = None) -> None:
        """Send a request that has a reply (STEP, RESET), and start its clock."""
        slot = self._slots[worker_id]
        slot.request(cmd, self.watched.now(), self._step_timeout_s)
        self._send(slot, cmd, payload)

    def reset_all(self) -> None:
        """RESET every live worker that has nothing outstanding."""
        for slot in self._slots:
            if slot.live and slot.awaiting is None:
                self.request(slot.worker_id, EnvironmentCommand.RESET)

    def set_parameters(self, calls: List[ParameterCall]) -> None:
        """The env parameters every worker applies, now and after each restart."""
        self._parameter_calls = calls
        for slot in self._slots:
            self.send(slot.worker_id, EnvironmentCommand.ENVIRONMENT_PARAMETERS, calls)

    def flush(self) -> None:
        """Deliver what was sent since the last flush (Backend.deliver: one call per Ray actor;
        also when nothing was, so that a Ray host sends what waited for its call in flight)."""
        with signals.deferred():  # NOTE [ Trainer signals ]: what is taken out is delivered
            outbox, self._outbox = self._outbox, []
            self.backend.deliver(outbox)

    def _send(self, slot: Slot, cmd: EnvironmentCommand, payload: Any = None) -> None:
        slot.sent(cmd)
        data = pack(EnvironmentRequest(cmd, slot.worker_id, slot.incarnation, payload))
        self._outbox.append(Message(self._ref(slot), cmd, data))

    def _ref(self, slot: Slot) -> WorkerRef:
        """The slot's current incarnation, as a backend is told of it (it never gets the slot)."""
        return WorkerRef(
            slot.worker_id,
            slot.incarnation,
            slot.label,
            slot.awaiting or slot.last_command,
            self._decoders.segment_name(slot.worker_id),
        )

    # ------------------------------------------------------------------------- events

    def check_usable(self) -> None:
        if self.closed:
            raise ManagerClosedError(f"This {self._owner} is closed.")
        if not any(s.live or s.state is WorkerState.RESTARTING for s in self._slots):
            raise AllWorkersFailedError(
                "Every env worker has failed (their errors were raised earlier); close this "
                f"{self._owner} and create a new one."
            )

    def pump(self, pumped: Pumped, limit_s: float = MAX_WAIT_S) -> None:
        """Deliver what was sent, wait once (at most ``limit_s``) for replies, deaths and
        deadlines, and handle every one of them into ``pumped`` (NOTE [ A wait is handled
        whole ]): the caller's, so that what was handled stays handled. An interrupt ends the
        wait at once; what the wait returned is handled before it is raised, and so is each
        failure and each restart (NOTE [ Trainer signals ])."""
        self.check_usable()
        self.flush()
        self.watched.entered()
        try:
            bound_s, started = min(limit_s, self._time_to_next_deadline()), self._clock()
            events = self.backend.wait(bound_s)
            with signals.deferred():
                self.watched.waited(bound_s, started)
                self._handle_events(events, pumped)
            self.backend.advance()
            self._check_deadlines(pumped)
            self._start_due_restarts()
            self.flush()
            if CHECK_INVARIANTS:
                for slot in self._slots:
                    slot.check()
        finally:
            self.watched.left()

    def _handle_events(self, events: List[Event], pumped: Pumped) -> None:
        for event in events:
            if isinstance(event, WorkerTimers):
                merge_worker_timers(event.timer_root)
                continue
            slot = self._slots[event.worker_id]
            if slot.live and slot.incarnation == event.incarnation:  # else: from a replaced one
                if isinstance(event, Reply):
                    self._handle(slot, event, pumped)
                elif isinstance(event, Placed):
                    slot.placed(event.placement)
                else:
                    self._fail(slot, event.error, pumped)

    def _time_to_next_deadline(self) -> float:
        watched_now, now = self.watched.now(), self._clock()
        waits = [s.deadline - watched_now for s in self._slots if s.deadline is not None]  # watched time
        waits += [  # a restart waiting for its predecessor to go waits on the backend's deadline
            s.restart_at - now
            for s in self._slots
            if s.state is WorkerState.RESTARTING and not self.backend.departing(s.worker_id)
        ]
        backend_deadline = self.backend.next_deadline()
        if backend_deadline is not None:
            waits.append(backend_deadline - now)
        if not waits:
            return MAX_WAIT_S
        return min(MAX_WAIT_S, max(0.0, min(waits)))

    def _handle(self, slot: Slot, reply: Reply, pumped: Pumped) -> None:
        response = reply.response
        if response.cmd is EnvironmentCommand.READY:
            hello: WorkerHello = response.payload
            slot.ready(hello.pid, hello.behavior_specs or {}, self.watched.now(), self._step_timeout_s)
        elif response.cmd in (EnvironmentCommand.STEP, EnvironmentCommand.RESET):
            payload: StepPayload = response.payload
            if payload.timer_root is not None:
                merge_worker_timers(payload.timer_root)
            if response.cmd is EnvironmentCommand.STEP:
                # the worker's own time: from sending, a step's time would include the trainer's
                # work while the step waited to be read (NOTE [ Actions as steps land ])
                self.health.stepped(slot.worker_id, payload.step_s)
            result = self._decoders.decode(slot.worker_id, payload.all_step_result)
            slot.answered(payload.behavior_specs or {})
            pumped.landed.append(
                Landed(slot.worker_id, response.cmd, result, payload.environment_stats, payload.step_s)
            )
        elif response.cmd is EnvironmentCommand.ENV_EXITED:
            self._fail(slot, exception_from_envelope(response.payload, slot.label), pumped)
        elif response.cmd is EnvironmentCommand.STOPPED:
            self._fail(slot, error_from_stop(response.payload, slot.label, slot.worker_id, slot.pid), pumped)

    def _check_deadlines(self, pumped: Pumped) -> None:
        now = self.watched.now()
        for slot in self._slots:
            if slot.live and slot.deadline is not None and now >= slot.deadline:
                if slot.state is WorkerState.STARTING:
                    setting = "startup_timeout_s"
                    what = (
                        f"did not finish building its env within startup_timeout_s="
                        f"{self.settings.startup_timeout_s} s{self.backend.startup_hint()}"
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
                self._fail(slot, error, pumped, Reason.HUNG)

    def _fail(self, slot: Slot, exc: BaseException, pumped: Pumped, reason: Reason = Reason.CLOSE) -> None:
        """A worker failed: its incarnation is released, then restarted or failed for good as the
        restart policy decides (a failure for good goes into ``pumped.failures``).

        Only this worker restarts; the others keep stepping. What it sent is void (the caller
        drops its steps not yet returned, and its partial trajectories). Released and moved on as
        one step (NOTE [ Trainer signals ]: an interrupt between the two would leave a live slot
        whose process the backend no longer has).
        """
        with signals.deferred():
            self._release(slot, reason)
            pumped.released.append(slot.worker_id)
            decision = self._restarts.decide(
                slot.worker_id,
                exc,
                env_worker_id=slot.env_worker_id,
                ever_started=slot.ever_started,
                port_holder=self.backend.port_holder,
            )
            self._carry_out(slot, exc, decision, pumped)

    def _carry_out(self, slot: Slot, exc: BaseException, decision: Decision, pumped: Pumped) -> None:
        worker_id = slot.worker_id
        if isinstance(decision, MovePort):
            self.health.moved_port(worker_id)
            logger.warning(decision.message)
            slot.restart(self._clock(), decision.env_worker_id)
        elif isinstance(decision, Fail):
            self.health.failed(worker_id, decision.cause, False)
            for note in decision.notes:
                add_note(exc, note)
            slot.fail()
            logger.error(f"Env worker {worker_id} failed: {type(exc).__name__}: {exc}")
            pumped.failures.append(exc)
        elif decision.cause is Cause.FORK_SERVER:
            self.health.failed(worker_id, decision.cause, True)
            logger.info(f"Restarting env worker {worker_id} from a new fork server: {exc}")
            slot.restart(self._clock())
        else:
            self.health.failed(worker_id, decision.cause, True)
            logger.warning(
                f"Restarting env worker {worker_id} in {decision.delay_s:.1f} s after "
                f"{type(exc).__name__}: {exc}"
            )
            slot.restart(self._clock() + decision.delay_s)

    def _start_due_restarts(self) -> None:
        now = self._clock()
        for slot in self._slots:
            if (
                slot.state is WorkerState.RESTARTING
                and now >= slot.restart_at
                and not self.backend.departing(slot.worker_id)  # one incarnation at a time
            ):
                with signals.deferred():  # launched with its parameters and RESET, or not at all
                    self._launch(slot)
                    if self._parameter_calls:
                        self._send(slot, EnvironmentCommand.ENVIRONMENT_PARAMETERS, self._parameter_calls)
                    self.request(slot.worker_id, EnvironmentCommand.RESET)

    # ------------------------------------------------------------------ worker lifecycle

    def _launch(self, slot: Slot) -> None:
        with signals.deferred():  # NOTE [ Trainer signals ]: no process nobody knows of
            slot.launch(self.watched.now(), self._startup_timeout_s)
            try:
                placement = self.backend.launch(self._spec(slot))
                if placement is not None:
                    slot.placed(placement)
            except BaseException:
                slot.close()  # nothing of it runs: nothing to release
                raise

    def _release(self, slot: Slot, reason: Reason) -> None:
        """The backend lets the slot's incarnation go; its step results' segment is unmapped."""
        try:
            self.backend.release(self._ref(slot), reason)
        finally:
            self._decoders.forget(slot.worker_id)

    # -------------------------------------------------------------------------- close

    def close(self) -> None:
        """Close every worker, bounded: CLOSE, then the backend's ladder. Idempotent; never
        raises. A first interrupt while closing hurries the close along (workers still busy get
        SIGTERM, which makes them close their envs now; envs already closing finish); a second
        one kills every worker at once (NOTE [ Trainer signals ])."""
        if self.closed:
            return
        self.closed = True
        try:
            try:
                self._close_workers(signals.interrupted_twice())
            except KeyboardInterrupt:
                if signals.interrupted_twice() or not self.backend.hurry():
                    raise
                logger.warning(
                    "Interrupted while closing: env workers still busy are asked to stop (SIGTERM) "
                    "and close their envs now; envs already closing finish. Ctrl-C again kills them."
                )
                self._close_workers(False)
        except KeyboardInterrupt:
            self._kill_workers()
        except Exception:
            logger.exception(f"Closing the env workers of this {self._owner} failed.")
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
                logger.exception(f"Killing the env workers of this {self._owner} failed.")
                return

    def _summarize(self) -> None:
        """One line per worker: how it did, and how its last process ended. Never raises: an
        interrupt now would only cut the summary short."""
        try:
            for slot in self._slots:
                slot.close()
                self._decoders.forget(slot.worker_id)  # released or not (an interrupt cut the close)
                logger.info(
                    f"Env worker {slot.worker_id}: {self.health.summary(slot.worker_id)}; "
                    f"its last process {self.backend.outcome(slot.worker_id)}."
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
        for timers in self.backend.close(interrupted):
            merge_worker_timers(timers.timer_root)


def merge_worker_timers(timer_root: Any) -> None:
    """Add a worker's timer tree to the trainer's, under ``workers`` (as upstream does)."""
    if timer_root is None:
        return
    with hierarchical_timer("workers") as main_timer_node:
        main_timer_node.merge(timer_root, root_name="worker_root", is_parallel=True)


# NOTE [ A wait is handled whole ]
# One wait returns every event that is ready: replies, deaths, a worker's last words. Reading an
# event consumes its bytes from the pipe, so an event left unhandled is lost: had a failure, or a
# Ctrl-C, been raised in the middle of the batch, a sibling's reply read in the same wait would be
# dropped, its slot left BUSY, and that worker declared hung step_timeout_s later (the manager
# promises to stay usable after one worker fails for good). So ``pump`` handles the whole wait
# with the stop signals held, then its deadlines and due restarts (each failure and each restart,
# launch, env parameters and RESET, as one step: a worker restarted without them would start
# with neither), and returns what it brought as a value (``Pumped``): the steps that landed,
# the workers whose incarnation failed, the failures for the trainer. The manager keeps the steps,
# returned by the next ``get_steps`` before any new request goes out, and raises the first
# failure (the others' are logged, their slots FAILED). CPython's process pool returns failures
# as values for the same reason.
