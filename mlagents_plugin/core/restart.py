"""The restart policy: which failures a worker is restarted after, how soon, and how often.

Restartable: ML-Agents' four Unity exceptions (as upstream), a worker that died or hung, and the
exception types listed in ``env_manager.restart_on``. Quotas are ML-Agents' own ``env_settings``
(``--max-lifetime-restarts``, ``--restarts-rate-limit-n``, ``--restarts-rate-limit-period-s``),
counted per worker with upstream's meaning: -1 switches a limit off. A worker's first restart
within the rate-limit period is immediate, as upstream's; each further one waits twice as long
as the one before it (backoff from ``restart_backoff_s``), so a build that crashes at start does
not spin. A missing build is never restarted; a worker lost with its fork server is restarted at
once and not counted (NOTE [ A fork server dies ]). A worker whose port another process holds
moves to a worker id nobody uses, at once (up to MAX_PORT_MOVES times), except when it waits for
the Unity Editor, whose port is fixed.

``RestartPolicy.decide`` is the one place that decides: it returns a ``Restart``, a ``MovePort``
or a ``Fail``, and the supervisor carries the decision out.
"""
import datetime
import enum
import time
from collections import defaultdict
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

from mlagents.trainers.settings import EnvironmentSettings
from mlagents_envs.environment import UnityEnvironment
from mlagents_envs.exception import (
    UnityCommunicationException,
    UnityCommunicatorStoppedException,
    UnityEnvironmentException,
    UnityTimeOutException,
    UnityWorkerInUseException,
)

from mlagents_plugin.core.errors import (
    BuildNotFoundError,
    ForkServerDiedError,
    ListenAddressError,
    RemoteWorkerError,
    WorkerDiedError,
    WorkerTimeoutError,
)
from mlagents_plugin.core.protocol import qualified_name

# The exceptions upstream's SubprocessEnvManager restarts a worker after.
UNITY_RESTARTABLE = (
    UnityCommunicationException,
    UnityTimeOutException,
    UnityEnvironmentException,
    UnityCommunicatorStoppedException,
)
# Failures that starting the worker again cannot heal: never restarted.
PERMANENT = (BuildNotFoundError, ListenAddressError)
MAX_BACKOFF_S = 30.0
# How many times one worker may move to another worker id because its port is taken.
MAX_PORT_MOVES = 8


class Cause(enum.Enum):
    """Why a worker failed; restarts are counted by cause."""

    DIED = "died"
    HUNG = "hung"
    UNITY = "unity"
    LISTED = "restart_on"
    FORK_SERVER = "fork_server"  # not the worker's fault: restarted at once, not counted
    OTHER = "other"


def cause_of(exc: BaseException, restart_on: Sequence[str] = ()) -> Cause:
    if isinstance(exc, PERMANENT):
        return Cause.OTHER
    if isinstance(exc, ForkServerDiedError) and not exc.counted:
        return Cause.FORK_SERVER
    if isinstance(exc, WorkerDiedError):
        return Cause.DIED
    if isinstance(exc, WorkerTimeoutError):
        return Cause.HUNG
    if isinstance(exc, UNITY_RESTARTABLE):
        return Cause.UNITY
    names = {qualified_name(cls) for cls in type(exc).__mro__}
    names |= {cls.__name__ for cls in type(exc).__mro__}
    if isinstance(exc, RemoteWorkerError):  # it could not be rebuilt: match its original name
        names |= {exc.type_name, exc.type_name.rpartition(".")[2]}
    return Cause.LISTED if names & set(restart_on) else Cause.OTHER


class RestartRecord(NamedTuple):
    monotonic: float
    wall: datetime.datetime
    cause: Cause
    error: str


class Restart(NamedTuple):
    """Start the worker's next incarnation ``delay_s`` from now."""

    delay_s: float
    cause: Cause  # counted against its quota unless FORK_SERVER


class MovePort(NamedTuple):
    """Start it again at once, as ``env_worker_id`` (its port is base_port + that)."""

    env_worker_id: int
    message: str  # for the log: which port, who holds it, where it goes


class Fail(NamedTuple):
    """No restart: the error goes to the trainer, with ``notes`` added."""

    cause: Cause
    notes: Tuple[str, ...]


Decision = Union[Restart, MovePort, Fail]
PortHolder = Callable[[int], Optional[str]]  # a port -> who holds it, in words (Backend.port_holder)


class RestartPolicy:
    def __init__(
        self,
        env_settings: EnvironmentSettings,
        restart_on: Sequence[str] = (),
        backoff_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        waits_for_the_editor: bool = False,
        n_env: int = 1,
    ):
        """``waits_for_the_editor``: mlagents-learn without --env, whose workers connect to the
        Editor's fixed port; ``n_env``: worker ids from it on are nobody's (a moved worker's)."""
        self.max_lifetime_restarts = env_settings.max_lifetime_restarts
        self.rate_limit_n = env_settings.restarts_rate_limit_n
        self.rate_limit_period_s = env_settings.restarts_rate_limit_period_s
        self.base_port = env_settings.base_port
        self.restart_on = tuple(restart_on)
        self.backoff_s = backoff_s
        self.clock = clock
        self.waits_for_the_editor = waits_for_the_editor
        self.history: Dict[int, List[RestartRecord]] = defaultdict(list)
        self.port_moves: Dict[int, int] = defaultdict(int)
        self._spare_env_worker_id = n_env

    def decide(
        self,
        worker_id: int,
        exc: BaseException,
        *,
        env_worker_id: int,
        ever_started: bool,
        port_holder: PortHolder,
    ) -> Decision:
        """What to do about worker ``worker_id`` (running as ``env_worker_id``), which failed with
        ``exc``. A restart is counted here. ``ever_started``: has any incarnation of it finished
        building its env?"""
        notes: Tuple[str, ...] = ()
        if is_port_in_use(exc) and self.waits_for_the_editor:
            notes = (self._editor_port_taken(port_holder),)
        elif is_port_in_use(exc) and self.port_moves[worker_id] < MAX_PORT_MOVES:
            return self._move_port(worker_id, env_worker_id, port_holder)
        cause = self.classify(exc)
        if cause is Cause.FORK_SERVER:  # not the worker's doing: at once, not counted
            return Restart(0.0, cause)
        if cause is Cause.OTHER:
            return Fail(cause, notes)
        if self.has_quota(worker_id, ever_started):
            return Restart(self.record(worker_id, cause, exc), cause)
        return Fail(cause, notes + (self.explain_refusal(worker_id, ever_started),))

    def _editor_port_taken(self, port_holder: PortHolder) -> str:
        """The Editor connects to one fixed port: moving elsewhere cannot help."""
        port = UnityEnvironment.DEFAULT_EDITOR_PORT
        return (
            f"mlagents-learn waits for the Unity Editor on port {port}, which "
            f"{port_holder(port) or 'another process'} holds: only one run at a time can wait for "
            "the Editor. Stop the other run, or train a build with --env."
        )

    def _move_port(self, worker_id: int, env_worker_id: int, port_holder: PortHolder) -> MovePort:
        """To a worker id nobody uses: a Unity build's port is base_port + worker id, and another
        process holds this one (NOTE [ One run per port ] in local/rpc_server.py)."""
        old, new = env_worker_id, self._spare_env_worker_id
        self._spare_env_worker_id += 1
        self.port_moves[worker_id] += 1
        holder = port_holder(self.base_port + old)
        message = (
            f"Env worker {worker_id}: port {self.base_port + old} (worker id {old}) is "
            + (f"held by {holder}" if holder else "in use (by another run on the same --base-port, or a "
               "Unity player left from an earlier run)")
            + f"; moving to worker id {new} (port {self.base_port + new})."
        )
        return MovePort(new, message)

    def classify(self, exc: BaseException) -> Cause:
        return cause_of(exc, self.restart_on)

    def has_quota(self, worker_id: int, ever_started: bool = True) -> bool:
        """May ``worker_id`` restart? One that never once finished building its env gets one
        retry at most: a build that cannot start does not heal by being started again."""
        history = self.history[worker_id]
        lifetime_ok = (
            self.max_lifetime_restarts == -1 or len(history) < self.max_lifetime_restarts
        )
        rate_ok = self.rate_limit_n == -1 or self._recent(worker_id) < self.rate_limit_n
        return lifetime_ok and rate_ok and (ever_started or not history)

    def record(self, worker_id: int, cause: Cause, exc: BaseException) -> float:
        """Count a restart of ``worker_id``; return how long to wait before starting it."""
        recent = self._recent(worker_id)
        delay = 0.0 if recent == 0 else min(MAX_BACKOFF_S, self.backoff_s * 2 ** (recent - 1))
        self.history[worker_id].append(
            RestartRecord(
                self.clock(), datetime.datetime.now(), cause, f"{type(exc).__name__}: {exc}"
            )
        )
        return delay

    def explain_refusal(self, worker_id: int, ever_started: bool = True) -> str:
        """Why ``worker_id`` gets no more restarts, with its restart history."""
        history = self.history[worker_id]
        if not ever_started and history:
            return (
                f"Env worker {worker_id} never once finished building its env, and was restarted "
                f"once already ({history[-1].wall:%H:%M:%S} after {history[-1].error}): it is "
                "not retried again."
            )
        limits = (
            f"max_lifetime_restarts={self.max_lifetime_restarts}, "
            f"restarts_rate_limit_n={self.rate_limit_n} per "
            f"restarts_rate_limit_period_s={self.rate_limit_period_s}"
        )
        if not history:
            past = "it was never restarted"
        else:
            past = f"its {len(history)} restart(s): " + "; ".join(
                f"{r.wall:%H:%M:%S} after {r.error}" for r in history
            )
        return f"Env worker {worker_id} has no restarts left ({limits}); {past}."

    def _recent(self, worker_id: int) -> int:
        since = self.clock() - self.rate_limit_period_s
        return sum(1 for record in self.history[worker_id] if record.monotonic > since)


def is_port_in_use(exc: BaseException) -> bool:
    """A Unity build's port is taken. A rebuilt UnityWorkerInUseException garbles its message,
    so it arrives by name."""
    return isinstance(exc, UnityWorkerInUseException) or (
        isinstance(exc, RemoteWorkerError)
        and exc.type_name == qualified_name(UnityWorkerInUseException)
    )
