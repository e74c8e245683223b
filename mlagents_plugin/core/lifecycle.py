"""A worker slot's lifecycle, as one explicit state machine.

A slot is one of the ``n_env`` places a worker runs in; the worker in it is replaced on restart
(a new incarnation). Every change of state is one of the transition methods below, and each
keeps the state, the deadline and the outstanding request consistent:

    CLOSED ──launch──▶ STARTING ──ready──▶ IDLE ◀──answered── BUSY
                          │   (a request sent while STARTING     ▲
                          │    waits; ready makes it BUSY)       │ request
                          ▼                                      │
  (any live state) ──restart──▶ RESTARTING ──launch──▶ STARTING      IDLE ─┘
                   └──fail────▶ FAILED               (any) ──close──▶ CLOSED

``check`` states the invariants; the supervisor runs it after every pump in test and debug runs
(``MLAGENTS_PLUGIN_CHECK=1``, which the test suite sets).
"""
import enum
import os
from typing import Dict, NamedTuple, Optional

from mlagents_envs.base_env import BehaviorName, BehaviorSpec

from mlagents_plugin.core.names import worker_label
from mlagents_plugin.core.placement import Placement
from mlagents_plugin.core.protocol import EnvironmentCommand

CHECK_INVARIANTS = os.environ.get("MLAGENTS_PLUGIN_CHECK") == "1"


class WorkerState(enum.Enum):
    STARTING = "starting"  # an incarnation runs; its env is being built
    IDLE = "idle"  # no request outstanding
    BUSY = "busy"  # a STEP or RESET is outstanding
    RESTARTING = "restarting"  # failed; the next incarnation starts at ``restart_at``
    FAILED = "failed"  # failed for good; its error went to the trainer
    CLOSED = "closed"  # not started yet, or closed


LIVE = (WorkerState.STARTING, WorkerState.IDLE, WorkerState.BUSY)
WITH_REPLY = (EnvironmentCommand.STEP, EnvironmentCommand.RESET)


class Reason(enum.Enum):
    """Why a worker is taken down, which decides how (NOTE [ Shutdown ladder ])."""

    CLOSE = "close"  # CLOSE was sent, or it reported a failure and closes its env by itself
    HUNG = "hung"  # past its deadline: it would not read CLOSE
    BUILDING = "building"  # still building its env: it reads nothing until the env exists
    INTERRUPTED = "interrupted"  # a second Ctrl-C: NOTE [ Trainer signals ]


class InvariantError(AssertionError):
    """A slot's fields contradict its state: a bug in the manager."""


class WorkerView(NamedTuple):
    """A slot as it is now, read-only (``SupervisedManagerBase.workers``)."""

    worker_id: int
    incarnation: int
    state: WorkerState
    awaiting: Optional[EnvironmentCommand]  # the outstanding STEP or RESET
    pid: Optional[int]
    env_worker_id: int

    @property
    def live(self) -> bool:
        return self.state in LIVE


class Slot:
    def __init__(self, worker_id: int):
        self.worker_id = worker_id
        self.env_worker_id = worker_id  # what the env factory gets; changes if the port is taken
        self.incarnation = -1
        self.state = WorkerState.CLOSED
        self.pid: Optional[int] = None  # reported by the worker with READY
        self.placement: Optional[Placement] = None  # where it runs, once the backend knows
        self.awaiting: Optional[EnvironmentCommand] = None  # the outstanding request
        self.sent_at = 0.0
        self.deadline: Optional[float] = None
        self.restart_at = 0.0
        self.ever_started = False  # has any incarnation finished building its env?
        self.last_command: Optional[EnvironmentCommand] = None
        self.behavior_specs: Dict[BehaviorName, BehaviorSpec] = {}  # every one it reported

    @property
    def live(self) -> bool:
        """Whether an incarnation runs (or starts) in this slot."""
        return self.state in LIVE

    @property
    def known_pid(self) -> Optional[int]:
        """The worker's pid: reported with READY, or known to the backend since launch."""
        if self.pid is None and self.placement is not None:
            return self.placement.pid
        return self.pid

    @property
    def label(self) -> str:
        return worker_label(self.worker_id, self.known_pid, self.placement)

    def view(self) -> WorkerView:
        return WorkerView(
            self.worker_id, self.incarnation, self.state, self.awaiting, self.known_pid, self.env_worker_id
        )

    # ------------------------------------------------------------------------- transitions

    def launch(self, now: float, startup_timeout_s: float) -> None:
        """The next incarnation starts: it has ``startup_timeout_s`` to build its env."""
        self._expect(WorkerState.CLOSED, WorkerState.RESTARTING)
        self.incarnation += 1
        self.state = WorkerState.STARTING
        self.deadline = now + startup_timeout_s
        self.pid, self.placement = None, None
        self.awaiting, self.last_command = None, None

    def placed(self, placement: Placement) -> None:
        """The backend says where the current incarnation runs."""
        self._expect(*LIVE)
        self.placement = placement

    def sent(self, command: EnvironmentCommand) -> None:
        self.last_command = command

    def request(self, command: EnvironmentCommand, now: float, step_timeout_s: float) -> None:
        """A request with a reply (STEP, RESET) was sent. A starting worker serves it once its
        env exists, so its clock starts at ``ready``."""
        self._expect(WorkerState.STARTING, WorkerState.IDLE)
        assert command in WITH_REPLY and self.awaiting is None, (command, self.awaiting)
        self.last_command = self.awaiting = command
        self.sent_at = now
        if self.state is WorkerState.IDLE:
            self.state = WorkerState.BUSY
            self.deadline = now + step_timeout_s

    def ready(
        self, pid: int, specs: Dict[BehaviorName, BehaviorSpec], now: float, step_timeout_s: float
    ) -> None:
        """The worker built its env; ``specs``: the behaviours it knows of."""
        self._expect(WorkerState.STARTING)
        self.pid = pid
        self.behavior_specs.update(specs)
        self.ever_started = True
        if self.awaiting is None:
            self.state, self.deadline = WorkerState.IDLE, None
        else:  # the queued request is being served from now on
            self.state = WorkerState.BUSY
            self.sent_at = now
            self.deadline = now + step_timeout_s

    def answered(self, specs: Dict[BehaviorName, BehaviorSpec]) -> None:
        """Its STEP or RESET came back; ``specs``: behaviours new since it last reported."""
        self._expect(WorkerState.BUSY)
        self.behavior_specs.update(specs)
        self.state, self.awaiting, self.deadline = WorkerState.IDLE, None, None

    def restart(self, at: float, env_worker_id: Optional[int] = None) -> None:
        """The incarnation was handed to the backend to go down; the next one starts at ``at``,
        as ``env_worker_id`` if given (its port was taken)."""
        self._expect(*LIVE)
        self._forget()
        self.state, self.restart_at = WorkerState.RESTARTING, at
        if env_worker_id is not None:
            self.env_worker_id = env_worker_id

    def fail(self) -> None:
        """The incarnation was handed to the backend to go down, for good."""
        self._expect(*LIVE)
        self._forget()
        self.state = WorkerState.FAILED

    def close(self) -> None:
        self._forget()
        self.state = WorkerState.CLOSED

    # --------------------------------------------------------------------------- invariants

    def check(self) -> None:
        """Raise InvariantError if the fields contradict the state."""
        state = self.state
        if state is WorkerState.STARTING:
            ok = self.deadline is not None and self.awaiting in (None,) + WITH_REPLY
        elif state is WorkerState.IDLE:
            ok = self.awaiting is None and self.deadline is None and self.pid is not None
        elif state is WorkerState.BUSY:
            ok = self.awaiting in WITH_REPLY and self.deadline is not None and self.pid is not None
        else:
            ok = self.awaiting is None and self.deadline is None
        if not ok:
            raise InvariantError(
                f"{self.label} is {state.name} with awaiting={self.awaiting}, "
                f"deadline={self.deadline}, pid={self.pid}"
            )

    def _expect(self, *states: WorkerState) -> None:
        if self.state not in states:
            raise InvariantError(f"{self.label}: a {self.state.name} slot cannot do this")

    def _forget(self) -> None:
        """What the trainer held of the incarnation that is going."""
        self.pid, self.placement, self.awaiting, self.deadline = None, None, None, None
