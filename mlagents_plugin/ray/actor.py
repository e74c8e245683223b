"""The Ray actor that hosts ``envs_per_worker`` env workers: a node-local process backend.

The actor does not run envs itself. It runs the subprocess backend (local/supervisor.py) on its
own node, over the envs the trainer gives it, and answers the trainer's calls with what those
workers said. See NOTE [ Ray actors host worker processes ] and, for how the trainer batches its
calls, NOTE [ Hosts ] in backend.py.

This module does not import Ray at module level: backend.py turns ``EnvHostActor`` into an
actor class.
"""
import os
import threading
import time
from typing import Any, Dict, FrozenSet, List, NamedTuple, Optional, Sequence, Set, Tuple, Union

import attr
from mlagents_envs import logging_util

from mlagents_plugin.core import platform
from mlagents_plugin.core.backend import BackendSetup, Death, Event, Reply, WorkerTimers
from mlagents_plugin.core.errors import WorkerDiedError
from mlagents_plugin.core.lifecycle import WITH_REPLY, Reason, Slot
from mlagents_plugin.core.names import Placement
from mlagents_plugin.core.protocol import EnvironmentCommand, EnvironmentResponse, WorkerSpec
from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.local.backend import ProcessBackend

logger = logging_util.get_logger(__name__)

# What a worker says last before it exits by itself.
LAST_WORDS = (EnvironmentCommand.ENV_EXITED, EnvironmentCommand.STOPPED)

# How often a departing worker's ladder is advanced between calls (it needs no call to finish).
HOUSEKEEPING_S = 0.05


# NOTE [ Ray actors host worker processes ]
# A Ray actor could run an env in its own process, as RLlib's env runners do. It would then lose
# what the subprocess backend guarantees: a Unity build is started in its own session, and when
# the actor is killed (a lost node, the trainer's SIGKILL) nothing would take the build down with
# it. Instead each actor runs the subprocess backend on its node: one worker process per env
# (from the actor's own fork server), the same pipes, sentinels, shutdown ladder, and the actor's
# reaper, which kills the workers and what they started when the actor dies (NOTE [ No orphans ]).
# So a hung env is killed by the ladder of its actor, and its k-1 neighbours go on; a dead actor
# takes its k envs with it, and the trainer restarts them on a new actor. The k workers step in
# parallel (k Unity players run at once), and the actor answers for all of them in one call: the
# trainer pays one Ray round trip per call, not per env. Steps do not use shared memory here: the
# trainer may be on another machine.
class Launch(NamedTuple):
    spec: WorkerSpec


class Deliver(NamedTuple):
    worker_id: int
    incarnation: int
    command: EnvironmentCommand
    data: bytes  # a packed EnvironmentRequest, passed on as it is


class Release(NamedTuple):
    worker_id: int
    incarnation: int
    reason: Reason
    last_command: Optional[EnvironmentCommand]


Item = Union[Launch, Deliver, Release]


class EnvEvent(NamedTuple):
    """What one env worker said (``response``) or how it ended (``error``)."""

    worker_id: int
    incarnation: int
    response: Optional[EnvironmentResponse]
    error: Optional[WorkerDiedError]


class HostReport(NamedTuple):
    """The answer to every call: what happened since the last one."""

    events: List[EnvEvent]
    where: Tuple[str, str, int]  # node id, node address, actor pid
    pids: Dict[Tuple[int, int], int]  # (worker id, incarnation) -> pid, for launches since
    departing: FrozenSet[int]  # worker ids whose processes are still on their way out
    outcomes: Dict[int, str]  # how each worker's last process ended, once it did
    timers: List[Any]  # timer trees of workers that closed since


class EnvHostActor:
    def __init__(self, settings: EnvManagerSettings, pickled_env_factory: bytes, n_env: int):
        import ray  # this runs in a Ray worker; the module itself does not need Ray

        self._timers: List[Any] = []
        # The actor's threads would be copied by a fork: workers come from its fork server (or,
        # on the portable path, are spawned).
        settings = attr.evolve(settings, start_method=platform.default_start_method())
        self._backend = ProcessBackend(
            BackendSetup(
                settings, n_env, pickled_env_factory, time.monotonic, shared_memory=False,
            )
        )
        self._where = (ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), os.getpid())
        self._slots: Dict[int, Slot] = {}  # the live incarnations, as the process backend sees them
        self._ready: Set[int] = set()  # worker ids whose current incarnation has said READY
        self._known: Set[int] = set()  # every worker id launched here
        self._pids: Dict[Tuple[int, int], int] = {}
        self._events: List[EnvEvent] = []
        # Between calls, departing workers still go down on time (NOTE [ Shutdown ladder ]).
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._housekeeper = threading.Thread(target=self._keep_house, name="ladder", daemon=True)
        self._housekeeper.start()

    def exchange(self, items: List[Item], wait_s: float) -> HostReport:
        """Carry out ``items`` in order, then wait up to ``wait_s`` for the replies they ask
        from envs that are ready (envs still starting answer in a later call); without items
        (a poll), for anything to report."""
        with self._lock:
            return self._exchange(items, wait_s)

    def apply(self, items: List[Item]) -> None:
        """Carry out ``items`` in order; what the workers answer goes in the next report."""
        with self._lock:
            self._apply(items)

    def _apply(self, items: List[Item]) -> Set[int]:
        """Carry out ``items``; return the envs asked for a reply that are ready to give it."""
        awaited = set()
        for item in items:
            try:
                if isinstance(item, Launch):
                    self._launch(item.spec)
                elif isinstance(item, Deliver):
                    if self._deliver(item) and item.worker_id in self._ready:
                        awaited.add(item.worker_id)
                else:
                    self._release(item)
            except Exception as e:  # no fork server, no file descriptors left: the env's, not the rest's
                if not isinstance(item, Launch):
                    logger.exception(f"{type(item).__name__} of env worker {item.worker_id} failed.")
                    continue
                spec = item.spec
                error = WorkerDiedError(
                    f"env worker {spec.worker_id} could not be started in its Ray actor (pid "
                    f"{os.getpid()}): {type(e).__name__}: {e}",
                    spec.worker_id,
                    None,
                )
                self._events.append(EnvEvent(spec.worker_id, spec.incarnation, None, error))
        return awaited

    def _exchange(self, items: List[Item], wait_s: float) -> HostReport:
        awaited = self._apply(items)
        if items and not awaited:
            wait_s = 0.0  # nothing to wait for (messages without replies, envs still starting)
        departing = self._departing()
        deadline = time.monotonic() + wait_s
        answered: Set[int] = set()
        while True:
            if awaited <= answered and (awaited or self._events or self._departing() != departing):
                break
            timeout = deadline - time.monotonic()
            next_deadline = self._backend.next_deadline()
            if next_deadline is not None:
                timeout = min(timeout, next_deadline - time.monotonic())
            answered |= self._receive(self._backend.wait(max(0.0, timeout)))
            self._backend.advance()
            if time.monotonic() >= deadline:
                break
        return self._report()

    def close(self, interrupted: bool) -> HostReport:
        """Take every worker down (NOTE [ Shutdown ladder ]), bounded; report how they went."""
        self._closed.set()
        self._housekeeper.join(HOUSEKEEPING_S + 1.0)
        with self._lock:
            return self._close(interrupted)

    def _keep_house(self) -> None:
        """While no call runs: the ladder's next step for departing workers, and what the
        workers say meanwhile (kept for the next report)."""
        while not self._closed.wait(HOUSEKEEPING_S):
            if self._backend.next_deadline() is None or not self._lock.acquire(blocking=False):
                continue
            try:
                self._receive(self._backend.wait(0.0))
                self._backend.advance()
            finally:
                self._lock.release()

    def _close(self, interrupted: bool) -> HostReport:
        for slot in list(self._slots.values()):
            self._backend.release(slot, Reason.INTERRUPTED if interrupted else Reason.CLOSE)
        self._slots.clear()
        self._receive(self._backend.close(interrupted))  # the closed workers' timers
        return self._report()

    # ------------------------------------------------------------------------------ items

    def _launch(self, spec: WorkerSpec) -> None:
        # The actor's mirror of the trainer's slot: what the process backend reads (worker id,
        # incarnation, label, last command), kept up to date here rather than by transitions.
        logging_util.set_log_level(spec.log_level)
        slot = Slot(spec.worker_id)
        slot.incarnation = spec.incarnation
        placement = self._backend.launch(slot, spec)
        assert placement is not None and placement.pid is not None  # the process backend knows at once
        pid = placement.pid
        node_id, address, actor_pid = self._where  # for the labels of the actor's own reports
        slot.placement = Placement(slot.worker_id, pid, address, node_id, actor_pid)
        self._slots[spec.worker_id] = slot
        self._ready.discard(spec.worker_id)
        self._known.add(spec.worker_id)
        self._pids[(spec.worker_id, spec.incarnation)] = pid

    def _deliver(self, item: Deliver) -> bool:
        slot = self._slots.get(item.worker_id)
        if slot is None or slot.incarnation != item.incarnation:
            return False  # released meanwhile
        slot.last_command = item.command
        if item.command in WITH_REPLY:
            slot.awaiting = item.command
        self._backend.deliver(slot, item.command, item.data)
        return item.command in WITH_REPLY

    def _release(self, item: Release) -> None:
        slot = self._slots.get(item.worker_id)
        if slot is None or slot.incarnation != item.incarnation:
            return
        del self._slots[item.worker_id]
        self._ready.discard(item.worker_id)
        slot.last_command = item.last_command
        self._backend.release(slot, item.reason)

    # ----------------------------------------------------------------------------- events

    def _receive(self, events: Sequence[Event]) -> Set[int]:
        """Keep what the workers said for the report; return who answered a request."""
        answered = set()
        for event in events:
            if isinstance(event, WorkerTimers):
                self._timers.append(event.timer_root)
                continue
            slot = event.slot
            if self._slots.get(slot.worker_id) is not slot:
                continue  # from an incarnation released meanwhile
            if isinstance(event, Reply):
                response = event.response
                if response.cmd is EnvironmentCommand.READY:
                    self._ready.add(slot.worker_id)
                else:
                    slot.awaiting = None
                    answered.add(slot.worker_id)
                self._events.append(EnvEvent(slot.worker_id, event.incarnation, response, None))
                if response.cmd in LAST_WORDS:
                    self._let_go(slot)
            elif isinstance(event, Death):
                answered.add(slot.worker_id)
                self._events.append(EnvEvent(slot.worker_id, event.incarnation, None, event.error))
                self._let_go(slot)
        return answered

    def _let_go(self, slot: Slot) -> None:
        """A worker that died or is exiting goes to the ladder now, not when the trainer's
        Release comes (a call later): its sentinel, still watched, would wake every wait."""
        del self._slots[slot.worker_id]
        self._ready.discard(slot.worker_id)
        self._backend.release(slot, Reason.CLOSE)

    def _departing(self) -> FrozenSet[int]:
        return frozenset(w for w in self._known if self._backend.departing(w))

    def _report(self) -> HostReport:
        departing = self._departing()
        outcomes = {
            w: self._backend.outcome(w) for w in self._known if w not in self._slots and w not in departing
        }
        report = HostReport(self._events, self._where, self._pids, departing, outcomes, self._timers)
        self._events, self._pids, self._timers = [], {}, []
        return report

    def __repr__(self) -> str:  # Ray shows this in its logs and errors
        return f"EnvHostActor(pid {os.getpid()})"
