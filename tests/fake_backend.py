"""An in-memory backend for the fast tier: the manager's logic in milliseconds, no processes.

Fake workers run the real env in this process and speak the real protocol (packed requests,
wire-encoded step results, exception envelopes); only the transport and time are simulated. A
``FakeClock`` only moves when the manager waits with nothing due: it jumps to the next due
event or to the end of the wait, so a 70 s step timeout passes in microseconds. Each worker
incarnation follows a ``Behavior``: how long it takes to start and to step, and what goes wrong
when (``faults``: (kind, step), step 0 meaning while it builds its env).
"""
import heapq
import itertools
import signal
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import cloudpickle
from mlagents_envs.exception import UnityWorkerInUseException

from mlagents_plugin.core.backend import Backend, BackendSetup, Death, Event, Message, Reply, WorkerRef, WorkerTimers
from mlagents_plugin.core.errors import WorkerDiedError
from mlagents_plugin.core.lifecycle import Reason
from mlagents_plugin.core.names import worker_label
from mlagents_plugin.core.placement import Placement
from mlagents_plugin.core.protocol import (
    EnvironmentCommand,
    EnvironmentResponse,
    StepPayload,
    WorkerHello,
    WorkerSpec,
    describe_stop,
    unpack_request,
    wrap_exception,
)
from mlagents_plugin.core.wire import Encoder

FAULTS = ("die", "reply_and_die", "reply_then_killed", "hang", "raise", "stop", "port")
KILLED_AFTER_S = 0.002  # "reply_then_killed": the OOM killer, this long after the reply went


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Behavior(NamedTuple):
    startup_s: float = 0.01
    step_s: float = 0.005
    fault: Optional[Tuple[str, int]] = None  # (kind, step); step 0: while building its env
    exception: type = RuntimeError  # what "raise" raises


Script = Callable[[int, int], Behavior]  # (worker id, incarnation) -> what it does


def behave(**by_worker: Behavior) -> Script:
    """Worker ``w{id}`` behaves as given in its first incarnation, then well."""
    return lambda worker_id, incarnation: (
        by_worker.get(f"w{worker_id}", Behavior()) if incarnation == 0 else Behavior()
    )


class _FakeWorker:
    def __init__(self, spec: WorkerSpec, behavior: Behavior, now: float):
        self.spec, self.behavior = spec, behavior
        self.free_at = now + behavior.startup_s  # it serves one request at a time, in order
        self.pid = 10000 + 100 * spec.worker_id + spec.incarnation
        self.env = None
        self.steps = 0
        self.encoder = Encoder(None)
        self.sent_specs = False

    def build(self) -> List[Tuple[float, Optional[Event]]]:
        """What building the env gives: (when, event) pairs; a None event is silence."""
        kind = self._fault(0)
        if kind == "hang":
            return []
        if kind == "port":
            return self._exited(UnityWorkerInUseException(self.spec.env_worker_id), None)
        if kind is not None:
            return self._fail(kind, None)
        factory = cloudpickle.loads(self.spec.pickled_env_factory)
        self.env = factory(self.spec.env_worker_id, [])
        hello = WorkerHello(self.pid, dict(self.env.behavior_specs))
        return [(self.free_at, self._reply(EnvironmentCommand.READY, hello))]

    def serve(self, data: bytes, now: float) -> List[Tuple[float, Optional[Event]]]:
        """What serving a request gives; requests are served in order, after the env exists."""
        self.free_at = max(now, self.free_at) + self.behavior.step_s
        request = unpack_request(data)
        if request.cmd is EnvironmentCommand.STEP:
            self.steps += 1
            kind = self._fault(self.steps)
            if kind == "hang":
                return []
            if kind is not None:
                return self._fail(kind, request.cmd)
            for name, action in request.payload.items():
                self.env.set_actions(name, action)
            self.env.step()
            return [(self.free_at, self._step_reply(request.cmd))]
        if request.cmd is EnvironmentCommand.RESET:
            self.env.reset()
            return [(self.free_at, self._step_reply(request.cmd))]
        return []  # parameters, analytics, CLOSE: no reply

    def _fault(self, step: int) -> Optional[str]:
        fault = self.behavior.fault
        if fault is None or fault[1] != step or (fault[0] == "port" and step != 0):
            return None  # a port can only be taken while the env is built
        return fault[0]

    def _fail(self, kind: str, command: Optional[EnvironmentCommand]) -> List[Tuple[float, Optional[Event]]]:
        if kind in ("die", "reply_and_die", "reply_then_killed"):
            label = worker_label(self.spec.worker_id, self.pid)
            error = WorkerDiedError(f"{label} was killed by SIGKILL", self.spec.worker_id, self.pid, -9)
            died_at = self.free_at + (KILLED_AFTER_S if kind == "reply_then_killed" else 0.0)
            death = (died_at, Death(self.spec.worker_id, self.spec.incarnation, error))
            if kind == "die" or command is None:  # while building there is no reply to send
                return [death]
            self.env.step()  # its step's reply is sent, then it dies (in the same instant, or later)
            return [(self.free_at, self._step_reply(command)), death]
        if kind == "stop":
            report = describe_stop(SystemExit(143), command, 15)
            return [(self.free_at, self._reply(EnvironmentCommand.STOPPED, report))]
        assert kind == "raise", kind
        return self._exited(self.behavior.exception("injected"), command)

    def _exited(self, exc: BaseException, command: Optional[EnvironmentCommand]) -> List[Tuple[float, Optional[Event]]]:
        try:
            raise exc
        except BaseException as raised:  # with a traceback, as a worker sends it
            envelope = wrap_exception(raised, command)
        return [(self.free_at, self._reply(EnvironmentCommand.ENV_EXITED, envelope))]

    def _step_reply(self, command: EnvironmentCommand) -> Reply:
        results = {name: self.env.get_steps(name) for name in self.env.behavior_specs}
        payload = StepPayload(self.encoder.encode(results), {}, None, None, self.behavior.step_s)
        return self._reply(command, payload)

    def _reply(self, command: EnvironmentCommand, payload: object) -> Reply:
        response = EnvironmentResponse(command, self.spec.worker_id, self.spec.incarnation, payload)
        return Reply(self.spec.worker_id, self.spec.incarnation, response)


class FakeBackend(Backend):
    """``FakeBackend.of(script)`` is what the manager's ``backend`` argument takes."""

    def __init__(self, setup: BackendSetup, script: Script, departure_s: float = 0.05):
        self.departure_s = departure_s  # how long a released worker takes to be gone
        self.clock = setup.clock
        self.script = script
        self.workers: Dict[int, _FakeWorker] = {}
        self.departures: Dict[int, float] = {}  # worker id -> when it is gone
        self.released: List[Tuple[int, int, Reason]] = []  # (worker id, incarnation, reason)
        self.released_at: List[float] = []
        self.launches: List[Tuple[int, int, int, float]] = []  # (worker id, incarnation, env worker id, when)
        self.deliveries: List[Tuple[int, EnvironmentCommand, float]] = []  # (worker id, command, when)
        self.outcomes: Dict[int, str] = {}
        self.closed = False
        # Raised by release() or close() when set: a backend that fails while closing.
        self.release_error: Optional[Exception] = None
        self.close_error: Optional[Exception] = None
        # A real SIGINT (Ctrl-C) at the start of the n-th call of a method: {"launch": 2}; "message":
        # before the n-th message that deliver writes (between two pipe writes)
        self.interrupt_at: Dict[str, int] = {}
        self._calls: Dict[str, int] = {}
        self.closes: List[bool] = []  # each close(interrupted)'s argument
        self.batches: List[List[Event]] = []  # what each wait returned, if anything
        self.hurried = 0
        self._due: List[Tuple[float, int, Event]] = []  # heap of (time, order, event)
        self._order = itertools.count()
        self._stop_in_next_wait_s = 0.0

    @classmethod
    def of(cls, script: Script) -> Callable[[BackendSetup], "FakeBackend"]:
        return lambda setup: cls(setup, script)

    def _maybe_interrupted(self, method: str) -> None:
        self._calls[method] = self._calls.get(method, 0) + 1
        if self.interrupt_at.get(method) == self._calls[method]:
            signal.raise_signal(signal.SIGINT)  # its handler runs now, or when it is no longer held

    def launch(self, spec: WorkerSpec) -> Placement:
        self._maybe_interrupted("launch")
        self.launches.append((spec.worker_id, spec.incarnation, spec.env_worker_id, self.clock.now))
        worker = _FakeWorker(spec, self.script(spec.worker_id, spec.incarnation), self.clock.now)
        self.workers[spec.worker_id] = worker
        self._schedule(worker.build())
        return Placement(spec.worker_id, worker.pid, "localhost")

    def deliver(self, messages: Sequence[Message]) -> None:
        for worker_ref, command, data in messages:
            self._maybe_interrupted("message")
            assert unpack_request(data).cmd is command
            self.deliveries.append((worker_ref.worker_id, command, self.clock.now))
            worker = self.workers.get(worker_ref.worker_id)
            if worker is not None and worker.spec.incarnation == worker_ref.incarnation and worker.env is not None:
                self._schedule(worker.serve(data, self.clock.now))

    def _schedule(self, events: List[Tuple[float, Optional[Event]]]) -> None:
        for when, event in events:
            if event is not None:
                heapq.heappush(self._due, (when, next(self._order), event))

    def stop_everything(self, seconds: float, in_next_wait: bool = True) -> None:
        """Ctrl-Z, then `fg` ``seconds`` later: the trainer and every worker stop together and go
        on where they were. The trainer stops in its next wait, or (``in_next_wait=False``) now,
        between two waits."""
        if in_next_wait:
            self._stop_in_next_wait_s = seconds
            return
        self.clock.now += seconds
        self._due = [(when + seconds, order, event) for when, order, event in self._due]
        for worker in self.workers.values():
            worker.free_at += seconds

    def wait(self, timeout: float) -> List[Event]:
        started = self.clock.now
        if self._stop_in_next_wait_s:
            self.stop_everything(self._stop_in_next_wait_s, in_next_wait=False)
            self._stop_in_next_wait_s = 0.0
        until = max(self.clock.now, started + timeout)
        if self._due and self._due[0][0] <= until:
            self.clock.now = max(self.clock.now, self._due[0][0])
        else:
            self.clock.now = until
        events = []  # stale ones too (from released incarnations): the manager must drop them
        while self._due and self._due[0][0] <= self.clock.now:
            events.append(heapq.heappop(self._due)[2])
        if events:
            self.batches.append(events)
        return events

    def release(self, worker_ref: WorkerRef, reason: Reason) -> None:
        self._maybe_interrupted("release")
        if self.release_error is not None:
            raise self.release_error
        worker = self.workers.pop(worker_ref.worker_id)
        assert worker.spec.incarnation == worker_ref.incarnation, (worker.spec, worker_ref)
        self.released.append((worker_ref.worker_id, worker_ref.incarnation, reason))
        self.released_at.append(self.clock.now)
        self.departures[worker_ref.worker_id] = self.clock.now + self.departure_s
        self.outcomes[worker_ref.worker_id] = f"went ({reason.value})"

    def departing(self, worker_id: int) -> bool:
        return self.departures.get(worker_id, 0.0) > self.clock.now

    def next_deadline(self) -> Optional[float]:
        pending = [t for t in self.departures.values() if t > self.clock.now]
        return min(pending, default=None)

    def close(self, interrupted: bool) -> List[WorkerTimers]:
        self.closes.append(interrupted)
        self._maybe_interrupted("close")
        if self.close_error is not None:
            raise self.close_error
        self.closed = True
        return []

    def hurry(self) -> bool:
        self.hurried += 1
        return True

    def outcome(self, worker_id: int) -> str:
        return self.outcomes.get(worker_id, "was not running")
