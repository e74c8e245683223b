"""What a backend is: how workers are started, reached, waited for and taken down.

core/ holds every decision; a backend only moves bytes and processes. It never sees a slot:
each call names the worker incarnation by a ``WorkerRef`` value (the slot's one writer is the
supervisor, supervision.py), and the backend reports what happened in ``wait`` (and ``close``)
as events, which the supervisor handles: a backend never calls back into core, nor imports the
manager.
local/backend.py is the process backend, ray/backend.py the Ray one, and the fast tests drive
the manager with an in-memory one (tests/fake_backend.py).
"""
import abc
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Union

from mlagents_plugin.core.errors import WorkerDiedError
from mlagents_plugin.core.lifecycle import Reason
from mlagents_plugin.core.placement import Placement
from mlagents_plugin.core.protocol import EnvironmentCommand, EnvironmentResponse, WorkerSpec
from mlagents_plugin.core.settings import EnvManagerSettings


class WorkerRef(NamedTuple):
    """A worker incarnation as the supervisor describes it to a backend, when it calls it."""

    worker_id: int
    incarnation: int
    label: str  # "env worker 2 (pid 1234)", for the backend's messages
    last_command: Optional[EnvironmentCommand]  # the outstanding request, else the last one sent
    last_segment: Optional[str] = None  # the last shared-memory segment its replies named


class Message(NamedTuple):
    """A packed request for a worker incarnation."""

    worker: WorkerRef
    command: EnvironmentCommand
    data: bytes


class Reply(NamedTuple):
    """A message from a worker incarnation."""

    worker_id: int
    incarnation: int
    response: EnvironmentResponse


class Death(NamedTuple):
    """A worker incarnation ended without a word (a signal, an exit, a lost actor)."""

    worker_id: int
    incarnation: int
    error: WorkerDiedError


class Placed(NamedTuple):
    """Where a worker incarnation runs, once the backend knows it (a Ray actor reports it)."""

    worker_id: int
    incarnation: int
    placement: Placement


class WorkerTimers(NamedTuple):
    """The timer tree a closing worker sent with its last message (CLOSED), for the trainer's."""

    timer_root: Any


Event = Union[Reply, Death, Placed, WorkerTimers]


class BackendSetup(NamedTuple):
    """What every backend is built from (a backend takes its own options besides: the process
    backend's ``Host``)."""

    settings: EnvManagerSettings  # resolved
    n_env: int
    pickled_env_factory: bytes
    clock: Callable[[], float]


class Backend(abc.ABC):
    # Whether workers may run on other machines (NOTE [ Shipping env factories ]).
    WORKERS_ON_OTHER_MACHINES = False

    @abc.abstractmethod
    def launch(self, spec: WorkerSpec) -> Optional[Placement]:
        """Start worker ``spec.worker_id``'s incarnation ``spec.incarnation``; what only this
        backend's workers need (the process backend's owner tag, shared memory) it adds.
        Returns where it runs if that is known at once; else a ``Placed`` event says so later."""

    @abc.abstractmethod
    def deliver(self, messages: Sequence[Message]) -> None:
        """Send packed requests, in order, now: as few transport calls as the backend can make
        of them (one per Ray actor). Never raise for a worker that is gone."""

    @abc.abstractmethod
    def wait(self, timeout: float) -> List[Event]:
        """Wait up to ``timeout`` seconds for replies and deaths; never longer."""

    @abc.abstractmethod
    def release(self, worker: WorkerRef, reason: Reason) -> None:
        """Start taking the worker incarnation down, in bounded time, as ``reason`` says."""

    @abc.abstractmethod
    def departing(self, worker_id: int) -> bool:
        """Whether an earlier incarnation of the worker is still on its way out."""

    def next_deadline(self) -> Optional[float]:
        """When the backend next needs ``advance``, if ever."""
        return None

    def advance(self) -> None:  # noqa: B027 (a hook most backends need not override)
        """Housekeeping after each wait (escalating departures that are overdue)."""

    @abc.abstractmethod
    def close(self, interrupted: bool) -> List[WorkerTimers]:
        """Finish every departure, bounded (``interrupted``: kill at once), and let go of
        everything the backend holds; return the timers of the workers that closed meanwhile.
        Called after every live worker was released; called again after ``hurry`` (or with
        ``interrupted``) when an interrupt stopped it."""

    def hurry(self) -> bool:
        """A first interrupt while closing: speed the departures up without cutting an env's
        own close short; False if this backend cannot (the manager then kills at once)."""
        return False

    @abc.abstractmethod
    def outcome(self, worker_id: int) -> str:
        """How the worker's last incarnation ended, for the close summary."""

    def port_holder(self, port: int) -> Optional[str]:
        """Which process holds ``port`` where the workers run, in words, if the backend can tell."""
        return None

    def startup_hint(self) -> str:
        """Added to a start-up timeout's message."""
        return ""
