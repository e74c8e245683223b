"""What a backend is: how workers are started, reached, waited for and taken down.

The manager (manager.py) holds every decision; a backend only moves bytes and processes. It
gets the slot for each call and reads it (no module outside core/ writes a slot), and reports what happened in
``wait`` (and ``close``) as events, which the manager handles: a backend never calls back into
the manager, nor imports it.
local/supervisor.py is the process backend, ray/backend.py the Ray one, and the fast tests drive
the manager with an in-memory one (tests/fake_backend.py).
"""
import abc
from typing import Any, Callable, List, NamedTuple, Optional, Union

from mlagents_plugin.core.errors import WorkerDiedError
from mlagents_plugin.core.lifecycle import Reason, Slot
from mlagents_plugin.core.names import Placement
from mlagents_plugin.core.protocol import EnvironmentCommand, EnvironmentResponse, WorkerSpec
from mlagents_plugin.core.settings import EnvManagerSettings


class Reply(NamedTuple):
    """A message from a worker incarnation."""

    slot: Slot
    incarnation: int
    response: EnvironmentResponse


class Death(NamedTuple):
    """A worker incarnation ended without a word (a signal, an exit, a lost actor)."""

    slot: Slot
    incarnation: int
    error: WorkerDiedError


class Placed(NamedTuple):
    """Where a worker incarnation runs, once the backend knows it (a Ray actor reports it)."""

    slot: Slot
    incarnation: int
    placement: Placement


class WorkerTimers(NamedTuple):
    """The timer tree a closing worker sent with its last message (CLOSED), for the trainer's."""

    timer_root: Any


Event = Union[Reply, Death, Placed, WorkerTimers]


class BackendSetup(NamedTuple):
    """What a backend is built from."""

    settings: EnvManagerSettings  # resolved
    n_env: int
    pickled_env_factory: bytes
    clock: Callable[[], float]
    # Whether workers may put large arrays in shared memory: not when the steps travel on to
    # a trainer on another machine (a Ray actor's process backend).
    shared_memory: bool = True


class Backend(abc.ABC):
    # Whether workers may run on other machines (NOTE [ Shipping env factories ]).
    WORKERS_ON_OTHER_MACHINES = False

    @abc.abstractmethod
    def launch(self, slot: Slot, spec: WorkerSpec) -> Optional[Placement]:
        """Start the slot's new incarnation (``slot.incarnation``) from ``spec``; the backend
        fills in its part of the spec (owner tag, shared memory). Returns where it runs if that
        is known at once; else a ``Placed`` event says so later."""

    @abc.abstractmethod
    def deliver(self, slot: Slot, command: EnvironmentCommand, data: bytes) -> None:
        """Send a packed request to the slot's worker; never raise if the worker is gone."""

    @abc.abstractmethod
    def wait(self, timeout: float) -> List[Event]:
        """Wait up to ``timeout`` seconds for replies and deaths; never longer."""

    @abc.abstractmethod
    def release(self, slot: Slot, reason: Reason) -> None:
        """Start taking the slot's incarnation down, in bounded time, as ``reason`` says. Called
        while the slot still describes it (label, last command)."""

    @abc.abstractmethod
    def departing(self, worker_id: int) -> bool:
        """Whether an earlier incarnation of the slot is still on its way out."""

    def next_deadline(self) -> Optional[float]:
        """When the backend next needs ``advance``, if ever."""
        return None

    def advance(self) -> None:  # noqa: B027 (a hook most backends need not override)
        """Housekeeping after each wait (escalating departures that are overdue)."""

    @abc.abstractmethod
    def close(self, interrupted: bool) -> List[WorkerTimers]:
        """Finish every departure, bounded (``interrupted``: kill at once), and let go of
        everything the backend holds; return the timers of the workers that closed meanwhile.
        Called after every live slot was released; called again after ``hurry`` (or with
        ``interrupted``) when an interrupt stopped it."""

    def hurry(self) -> bool:
        """A first interrupt while closing: speed the departures up without cutting an env's
        own close short; False if this backend cannot (the manager then kills at once)."""
        return False

    @abc.abstractmethod
    def outcome(self, worker_id: int) -> str:
        """How the slot's last incarnation ended, for the close summary."""

    def port_holder(self, port: int) -> Optional[str]:
        """Which process holds ``port`` where the workers run, in words, if the backend can tell."""
        return None

    def startup_hint(self) -> str:
        """Added to a start-up timeout's message."""
        return ""
