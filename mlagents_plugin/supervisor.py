"""SupervisedEnvManager: ML-Agents' EnvManager over supervised worker processes.

A drop-in for ``mlagents.trainers.subprocess_env_manager.SubprocessEnvManager``: same
constructor, same behaviour, but every wait is bounded, every failure is explained, what can be
recovered is, and the workers are always reaped. docs/architecture.md has the picture and
docs/faults.md what happens on each fault.
"""
import atexit
import contextlib
import enum
import multiprocessing
import os
import secrets
import sys
import time
import types
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Callable, Dict, Iterator, List, Optional, Set

from mlagents.trainers.action_info import ActionInfo
from mlagents.trainers.env_manager import EnvironmentStep, EnvManager
from mlagents.trainers.settings import RunOptions, TrainerSettings
from mlagents_envs import logging_util
from mlagents_envs.base_env import BaseEnv, BehaviorName, BehaviorSpec
from mlagents_envs.exception import UnityWorkerInUseException
from mlagents_envs.side_channel.side_channel import SideChannel
from mlagents_envs.timers import hierarchical_timer, timed

from mlagents_plugin import compat, processes, python_envs, signals, wire
from mlagents_plugin.errors import (
    RemoteWorkerError,
    WorkerDiedError,
    WorkerTimeoutError,
    exception_from_envelope,
)
from mlagents_plugin.protocol import (
    EnvironmentCommand,
    EnvironmentRequest,
    EnvironmentResponse,
    StepPayload,
    WorkerHello,
    pack,
    qualified_name,
    unpack_response,
)
from mlagents_plugin.readiness import Readiness
from mlagents_plugin.restart import Cause, RestartPolicy
from mlagents_plugin.settings import EnvManagerSettings
from mlagents_plugin.shutdown import Ladder
from mlagents_plugin.stats import HealthStats
from mlagents_plugin.wire import Decoder
from mlagents_plugin.worker import WorkerSpec, worker_main

logger = logging_util.get_logger(__name__)

# An upper bound on any single wait, so that a wait never outlives a deadline computed late.
MAX_WAIT_S = 1.0
# How many times one worker may move to another worker id because its port is taken.
MAX_PORT_MOVES = 8


class WorkerState(enum.Enum):
    STARTING = "starting"  # the process runs; its env is being built
    IDLE = "idle"  # no request outstanding
    BUSY = "busy"  # a STEP or RESET is outstanding
    RESTARTING = "restarting"  # failed; the next incarnation starts at ``restart_at``
    FAILED = "failed"  # failed for good; its error went to the trainer
    CLOSED = "closed"


class _Slot:
    """One worker slot; the process in it is replaced on restart (a new incarnation)."""

    def __init__(self, worker_id: int):
        self.worker_id = worker_id
        self.env_worker_id = worker_id  # what the env factory gets; changes if the port is taken
        self.incarnation = -1
        self.state = WorkerState.CLOSED
        self.process: Optional[BaseProcess] = None
        self.conn: Optional[Connection] = None
        self.awaiting: Optional[EnvironmentCommand] = None
        self.sent_at = 0.0
        self.deadline: Optional[float] = None
        self.restart_at = 0.0
        self.last_command: Optional[EnvironmentCommand] = None
        self.previous_step = EnvironmentStep.empty(worker_id)
        self.previous_all_action_info: Dict[BehaviorName, ActionInfo] = {}
        self.behavior_specs: Dict[BehaviorName, BehaviorSpec] = {}
        self.decoder = Decoder()  # of the current incarnation's step results

    @property
    def label(self) -> str:
        pid = self.process.pid if self.process is not None else None
        return f"env worker {self.worker_id} (pid {pid})"

    @property
    def live(self) -> bool:
        return self.process is not None


class SupervisedEnvManager(EnvManager):
    def __init__(
        self,
        env_factory: Callable[[int, List[SideChannel]], BaseEnv],
        run_options: RunOptions,
        n_env: int = 1,
        settings: Optional[EnvManagerSettings] = None,
    ):
        super().__init__()
        self.run_options = run_options
        self.settings = (settings or EnvManagerSettings()).resolved(run_options)
        self.env_parameters: Optional[Dict] = None
        self._context = multiprocessing.get_context(self.settings.start_method)
        if self.settings.start_method == "forkserver":
            self._context.set_forkserver_preload([worker_main.__module__])
        self._pickled_factory = python_envs.dumps_factory(env_factory)
        token = secrets.token_hex(4)
        self._owner = f"mlagents-plugin/{os.getpid()}-{token}/"
        self._segments = wire.manager_prefix(os.getpid(), token)
        wire.sweep()  # shared memory left by trainers that were killed
        self._restarts = RestartPolicy(
            run_options.env_settings, self.settings.restart_on, self.settings.restart_backoff_s
        )
        self._readiness = Readiness()
        self._ladder = Ladder(
            self.settings.shutdown_timeout_s, self.settings.kill_grace_s, self._readiness
        )
        self._slots = [_Slot(i) for i in range(n_env)]
        self._spare_env_worker_id = n_env
        self._completed: List[EnvironmentStep] = []
        self._health = HealthStats(n_env)
        self._closed = False
        _open_managers.add(self)
        try:
            for slot in self._slots:
                self._start(slot)
        except BaseException:
            self.close()
            raise

    # ----------------------------------------------------------------- EnvManager interface

    def _step(self) -> List[EnvironmentStep]:
        self._queue_steps()
        while not self._completed:  # one wait returns every worker that is ready by then
            self._pump(block=True)
        steps, self._completed = self._completed, []
        return self._with_health_stats(steps)

    def _reset_env(self, config: Optional[Dict] = None) -> List[EnvironmentStep]:
        # Steps in flight belong to the episodes being reset: let them land, then drop them.
        self._pump_until(lambda: all(s.awaiting is not EnvironmentCommand.STEP for s in self._slots))
        self._completed.clear()
        self.set_env_parameters(config)
        for slot in self._slots:
            if slot.live and slot.awaiting is None:
                self._request(slot, EnvironmentCommand.RESET)
        # A worker that fails now is restarted and reset on its own; its reset step then
        # arrives through _step, like any other.
        self._pump_until(
            lambda: all(s.awaiting is not EnvironmentCommand.RESET or not s.live for s in self._slots)
        )
        steps, self._completed = self._completed, []
        return steps

    def set_env_parameters(self, config: Optional[Dict] = None) -> None:
        self.env_parameters = config
        for slot in self._slots:
            if slot.live:
                self._send(slot, EnvironmentCommand.ENVIRONMENT_PARAMETERS, config)

    def on_training_started(self, behavior_name: str, trainer_settings: TrainerSettings) -> None:
        for slot in self._slots:
            if slot.live:
                self._send(
                    slot, EnvironmentCommand.TRAINING_STARTED, (behavior_name, trainer_settings)
                )

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
    def worker_pids(self) -> Dict[int, int]:
        """The pid of each running worker, by worker id."""
        return {s.worker_id: s.process.pid for s in self._slots if s.live}

    @property
    def restart_counts(self) -> Dict[str, int]:
        """Restarts so far, by cause (``died``, ``hung``, ``unity``, ``restart_on``)."""
        counts: Dict[str, int] = {}
        for health in self._health.workers:
            for cause, n in health.restarts.items():
                counts[cause.value] = counts.get(cause.value, 0) + n
        return counts

    def close(self) -> None:
        """CLOSE every worker, then the ladder (NOTE [ Shutdown ladder ]). Idempotent.

        Returns within shutdown_timeout_s + kill_grace_s (plus the moment SIGKILL takes), or at
        once after a second interrupt (NOTE [ Trainer signals ]).
        """
        if self._closed:
            return
        self._closed = True
        _open_managers.discard(self)
        for slot in self._slots:
            if slot.live:
                self._send(slot, EnvironmentCommand.CLOSE)
                self._retire(slot, hung=False)  # reported as doing what it was asked before CLOSE
            slot.state = WorkerState.CLOSED
        try:
            if signals.interrupted_twice():
                self._ladder.force()
            self._ladder.run()
        except KeyboardInterrupt:
            logger.warning("Interrupted again while closing: killing the env workers now.")
            self._ladder.force()
            raise
        finally:
            self._readiness.close()
            self._kill_orphans(self._owner)
            wire.remove_segments(self._segments)
            for slot in self._slots:
                outcome = self._ladder.outcomes.get(slot.worker_id, "was not running")
                logger.info(
                    f"Env worker {slot.worker_id}: {self._health.summary(slot.worker_id)}; "
                    f"at close it {outcome}."
                )

    # ------------------------------------------------------------------------ stepping

    def _queue_steps(self) -> None:
        for slot in self._slots:
            if slot.state is WorkerState.IDLE:
                all_action_info = self._take_step(slot.previous_step)
                slot.previous_all_action_info = all_action_info
                env_actions = {
                    name: info.env_action
                    for name, info in all_action_info.items()
                    if len(info.agent_ids) > 0
                }
                self._request(slot, EnvironmentCommand.STEP, env_actions)

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

    def _start(self, slot: _Slot) -> None:
        slot.incarnation += 1
        parent_conn, child_conn = self._context.Pipe(duplex=True)
        spec = WorkerSpec(
            worker_id=slot.worker_id,
            incarnation=slot.incarnation,
            env_worker_id=slot.env_worker_id,
            pickled_env_factory=self._pickled_factory,
            run_options=self.run_options,
            log_level=logger.getEffectiveLevel(),
            trainer_pid=os.getpid(),
            owner_tag=self._owner_tag(slot),
            segment_prefix=self._segment_prefix(slot),
        )
        process = self._context.Process(
            target=worker_main,
            args=(child_conn, spec),
            name=f"mlagents-plugin-env-worker-{slot.worker_id}",
        )
        with _main_module_hidden():
            process.start()
        child_conn.close()  # so that the worker's death is an EOF here, too
        slot.process, slot.conn = process, parent_conn
        self._readiness.watch(process.sentinel, (slot, slot.incarnation, _SENTINEL))
        self._readiness.watch(parent_conn, (slot, slot.incarnation, _PIPE))
        slot.state = WorkerState.STARTING
        slot.awaiting, slot.last_command = None, None
        slot.deadline = time.monotonic() + self.settings.startup_timeout_s
        slot.previous_step = EnvironmentStep.empty(slot.worker_id)
        slot.previous_all_action_info = {}

    def _owner_tag(self, slot: _Slot) -> str:
        """What the slot's current incarnation tags its descendants with (NOTE [ No orphans ])."""
        return f"{self._owner}{slot.worker_id}.{slot.incarnation}/"

    def _segment_prefix(self, slot: _Slot) -> str:
        return wire.segment_prefix(self._segments, slot.worker_id, slot.incarnation)

    def _send(self, slot: _Slot, cmd: EnvironmentCommand, payload: Any = None) -> None:
        slot.last_command = cmd
        if slot.conn is None:
            return  # the worker closed its pipe; its sentinel or deadline reports it
        try:
            slot.conn.send_bytes(pack(EnvironmentRequest(cmd, slot.worker_id, slot.incarnation, payload)))
        except (OSError, EOFError):
            pass  # the worker is gone; its sentinel reports how, on the next wait

    def _request(self, slot: _Slot, cmd: EnvironmentCommand, payload: Any = None) -> None:
        """Send a request that has a reply (STEP, RESET), and start its clock."""
        self._send(slot, cmd, payload)
        slot.awaiting = cmd
        slot.sent_at = time.monotonic()
        if slot.state is not WorkerState.STARTING:  # a starting worker's clock runs already
            slot.state = WorkerState.BUSY
            slot.deadline = slot.sent_at + self.settings.step_timeout_s

    def _retire(self, slot: _Slot, hung: bool) -> None:
        """Hand the slot's process to the shutdown ladder; drop its shared memory."""
        slot.decoder.close()
        slot.decoder = Decoder()
        wire.remove_segments(self._segment_prefix(slot))
        self._readiness.forget(slot.process.sentinel)
        if slot.conn is not None:
            self._readiness.forget(slot.conn)
        self._ladder.add(
            slot.worker_id,
            slot.process,
            slot.conn,
            slot.label,
            self._owner_tag(slot),
            slot.awaiting or slot.last_command,
            hung=hung,
            on_closed=self._merge_worker_timers,
        )
        slot.process, slot.conn = None, None
        slot.awaiting, slot.deadline = None, None

    def _kill_orphans(self, owner_tag: str) -> None:
        orphans = processes.find_tagged(owner_tag)
        if orphans:
            logger.warning(
                "Killing processes left behind by env workers: "
                + ", ".join(f"pid {p.pid}" for p in orphans)
            )
            processes.kill_processes(orphans, self.settings.kill_grace_s)

    # ------------------------------------------------------------------------- events

    def _pump_until(self, done: Callable[[], bool]) -> None:
        while not done():
            self._pump(block=True)

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("This SupervisedEnvManager is closed.")
        if not any(s.live or s.state is WorkerState.RESTARTING for s in self._slots):
            raise RuntimeError(
                "Every env worker has failed (their errors were raised earlier); close this "
                "SupervisedEnvManager and create a new one."
            )

    def _pump(self, block: bool) -> None:
        """Wait once (bounded) for worker messages, deaths and deadlines, and handle them.

        The trainer sleeps on every worker's pipe *and* process sentinel at once
        (readiness.py): a reply and a death both wake it at once, and nothing is polled.
        Shutting-down processes are in the same set; their readiness needs no handling beyond
        the ladder's ``advance``.
        """
        self._check_usable()
        timeout = self._time_to_next_deadline() if block else 0.0
        readable: Dict[int, _Slot] = {}
        exited: Dict[int, _Slot] = {}
        for _, data in self._readiness.wait(timeout):
            if data is None:
                continue  # the ladder's
            slot, incarnation, kind = data
            if slot.live and slot.incarnation == incarnation:
                (exited if kind is _SENTINEL else readable)[slot.worker_id] = slot
        for worker_id, slot in {**readable, **exited}.items():
            self._service(slot, worker_id in readable, worker_id in exited)
        self._ladder.advance()
        self._check_deadlines()
        self._start_due_restarts()

    def _time_to_next_deadline(self) -> float:
        deadlines = [s.deadline for s in self._slots if s.deadline is not None]
        deadlines += [s.restart_at for s in self._slots if s.state is WorkerState.RESTARTING]
        ladder_deadline = self._ladder.next_deadline()
        if ladder_deadline is not None:
            deadlines.append(ladder_deadline)
        if not deadlines:
            return MAX_WAIT_S
        return min(MAX_WAIT_S, max(0.0, min(deadlines) - time.monotonic()))

    def _service(self, slot: _Slot, readable: bool, exited: bool) -> None:
        """Read what the worker sent; if its sentinel fired, everything, then report its death.

        A live worker gets one ``recv`` per wait: a second message makes the next wait return
        at once, and not polling here saves a system call on every step.
        """
        incarnation = slot.incarnation
        try:
            while slot.conn is not None and (readable or slot.conn.poll()):
                self._handle(slot, unpack_response(slot.conn.recv_bytes()))
                if not slot.live or slot.incarnation != incarnation:
                    return  # it failed and was handed to the ladder
                if not exited:
                    break
                readable = False
        except (EOFError, OSError):
            # The worker's end is closed: it died or is about to. Stop watching the pipe (it
            # would stay readable and spin the wait); the sentinel or the deadline decides.
            self._readiness.forget(slot.conn)
            slot.conn.close()
            slot.conn = None
        if exited:
            self._fail(
                slot,
                WorkerDiedError(
                    f"{slot.label} {processes.describe_exit(slot.process.exitcode)} "
                    f"(last command: {_name(slot.last_command)}).",
                    slot.worker_id,
                    slot.process.pid,
                    slot.process.exitcode,
                ),
            )

    def _handle(self, slot: _Slot, response: EnvironmentResponse) -> None:
        if response.incarnation != slot.incarnation:
            logger.debug(f"Dropped a {response.cmd.name} from a replaced {slot.label}.")
            return
        if response.cmd is EnvironmentCommand.READY:
            hello: WorkerHello = response.payload
            slot.behavior_specs.update(hello.behavior_specs or {})
            if slot.awaiting is None:
                slot.state, slot.deadline = WorkerState.IDLE, None
            else:  # the queued request starts being served now
                slot.state = WorkerState.BUSY
                slot.sent_at = time.monotonic()
                slot.deadline = slot.sent_at + self.settings.step_timeout_s
        elif response.cmd in (EnvironmentCommand.STEP, EnvironmentCommand.RESET):
            payload: StepPayload = response.payload
            if payload.behavior_specs:
                slot.behavior_specs.update(payload.behavior_specs)
            if payload.timer_root is not None:
                self._merge_worker_timers(payload.timer_root)
            if response.cmd is EnvironmentCommand.RESET:
                slot.previous_all_action_info = {}
            else:
                self._health.stepped(slot.worker_id, time.monotonic() - slot.sent_at)
            step = EnvironmentStep(
                slot.decoder.decode(payload.all_step_result),
                slot.worker_id,
                slot.previous_all_action_info,
                payload.environment_stats,
            )
            slot.previous_step = step
            slot.state, slot.awaiting, slot.deadline = WorkerState.IDLE, None, None
            self._completed.append(step)
        elif response.cmd is EnvironmentCommand.ENV_EXITED:
            self._fail(slot, exception_from_envelope(response.payload, slot.label))

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for slot in self._slots:
            if slot.live and slot.deadline is not None and now > slot.deadline:
                if slot.state is WorkerState.STARTING:
                    what = (
                        f"did not finish building its env within startup_timeout_s="
                        f"{self.settings.startup_timeout_s} s"
                    )
                else:
                    what = (
                        f"did not answer {_name(slot.awaiting)} within step_timeout_s="
                        f"{self.settings.step_timeout_s} s"
                    )
                self._fail(
                    slot,
                    WorkerTimeoutError(
                        f"{slot.label} {what}; it is hung, or the env is slower than the "
                        "timeout allows (raise env_manager.step_timeout_s or --timeout-wait).",
                        slot.worker_id,
                        slot.process.pid,
                    ),
                    hung=True,
                )

    def _fail(self, slot: _Slot, exc: BaseException, hung: bool = False) -> None:
        """A worker failed: restart it if the policy allows, else raise ``exc`` to the trainer.

        Only this worker restarts; the others keep stepping. Its steps not yet returned, and
        its partial trajectories, are dropped: they came from the env that failed.
        """
        worker_id = slot.worker_id
        self._completed = [s for s in self._completed if s.worker_id != worker_id]
        self._retire(slot, hung=hung)
        compat.drop_worker_trajectories(self.agent_managers, worker_id)
        if _is_port_in_use(exc) and self._health.workers[worker_id].port_moves < MAX_PORT_MOVES:
            self._move_to_another_port(slot)
            return
        cause = self._restarts.classify(exc)
        restart = cause is not Cause.OTHER and self._restarts.has_quota(worker_id)
        self._health.failed(worker_id, cause, restart)
        if restart:
            delay = self._restarts.record(worker_id, cause, exc)
            logger.warning(
                f"Restarting env worker {worker_id} in {delay:.1f} s after "
                f"{type(exc).__name__}: {exc}"
            )
            slot.state = WorkerState.RESTARTING
            slot.restart_at = time.monotonic() + delay
            return
        slot.state = WorkerState.FAILED
        if cause is not Cause.OTHER:
            exc.add_note(self._restarts.explain_refusal(worker_id))
        logger.error(f"Env worker {worker_id} failed: {type(exc).__name__}: {exc}")
        raise exc

    def _move_to_another_port(self, slot: _Slot) -> None:
        """Restart the worker with a worker id nobody uses: a Unity build's port is
        base_port + worker id, and something (often a player left from an earlier run)
        holds this one."""
        base_port = self.run_options.env_settings.base_port
        old, new = slot.env_worker_id, self._spare_env_worker_id
        self._spare_env_worker_id += 1
        slot.env_worker_id = new
        self._health.moved_port(slot.worker_id)
        logger.warning(
            f"Env worker {slot.worker_id}: port {base_port + old} (worker id {old}) is in use, "
            f"often by a Unity player left from an earlier run; moving to worker id {new} "
            f"(port {base_port + new})."
        )
        slot.state = WorkerState.RESTARTING
        slot.restart_at = time.monotonic()

    def _start_due_restarts(self) -> None:
        now = time.monotonic()
        for slot in self._slots:
            if (
                slot.state is WorkerState.RESTARTING
                and now >= slot.restart_at
                and slot.worker_id not in self._ladder  # one incarnation alive at a time
            ):
                self._start(slot)
                if self.env_parameters is not None:
                    self._send(slot, EnvironmentCommand.ENVIRONMENT_PARAMETERS, self.env_parameters)
                self._request(slot, EnvironmentCommand.RESET)

    @staticmethod
    def _merge_worker_timers(timer_root: Any) -> None:
        if timer_root is None:
            return
        with hierarchical_timer("workers") as main_timer_node:
            main_timer_node.merge(timer_root, root_name="worker_root", is_parallel=True)


_SENTINEL, _PIPE = "sentinel", "pipe"  # what woke the trainer, in Readiness data


# NOTE [ Worker start-up ]
# Under spawn and forkserver, multiprocessing makes every new process import the parent's main
# module again (as __mp_main__), so that functions defined there can be unpickled. The trainer's
# main module is ``mlagents-learn`` (or a user's script), which imports ML-Agents' trainers and
# torch: seconds of CPU per worker, and 10 s to start 8 workers on 2 cores. A worker needs none
# of it: its entry point lives in mlagents_plugin.worker, and env factories are cloudpickled,
# which ships anything defined in __main__ by value. So while a worker is being started,
# sys.modules["__main__"] is swapped for an empty module, and multiprocessing finds no main
# module to re-import. (The swap lasts for the ``start()`` call; the main module is untouched.)
@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _name(command: Optional[EnvironmentCommand]) -> str:
    return command.name if command is not None else "none yet"


def _is_port_in_use(exc: BaseException) -> bool:
    # A rebuilt UnityWorkerInUseException garbles its message, so it arrives by name.
    return isinstance(exc, UnityWorkerInUseException) or (
        isinstance(exc, RemoteWorkerError)
        and exc.type_name == qualified_name(UnityWorkerInUseException)
    )


# NOTE [ Interpreter exit ]
# Worker processes are not daemonic (a daemonic process may not start children, and envs may
# need to), so multiprocessing's own exit handler *joins* them, without a timeout. A trainer that
# never called close() would hang there. This handler is registered after multiprocessing's and
# therefore runs before it: it closes every manager still open, ladder included, so nothing is
# left for multiprocessing to wait for.
_open_managers: Set[SupervisedEnvManager] = set()


@atexit.register
def _close_open_managers() -> None:
    for manager in list(_open_managers):
        manager.close()
