"""The Ray actor that hosts ``envs_per_worker`` env workers: a node-local process backend.

The actor does not run envs itself. It runs the subprocess backend (local/supervisor.py) on its
own node, over the envs the trainer gives it, and answers the trainer's calls with what those
workers said. See NOTE [ Ray actors host worker processes ] and, for how the trainer batches its
calls, NOTE [ Hosts ] in backend.py.

This module does not import Ray at module level: backend.py turns ``EnvHostActor`` into an
actor class.
"""
import contextlib
import os
import threading
import time
from typing import Any, Dict, FrozenSet, Iterator, List, NamedTuple, Optional, Sequence, Set, Tuple, Union

import attr
from mlagents_envs import logging_util

from mlagents_plugin.core import platform
from mlagents_plugin.core.backend import BackendSetup, Death, Event, Reply, WorkerRef, WorkerTimers
from mlagents_plugin.core.errors import WorkerDiedError
from mlagents_plugin.core.lifecycle import WITH_REPLY, Reason
from mlagents_plugin.core.names import worker_label
from mlagents_plugin.core.protocol import LAST_WORDS, EnvironmentCommand, EnvironmentResponse, WorkerSpec
from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.local.backend import ProcessBackend

logger = logging_util.get_logger(__name__)


# NOTE [ The actor's housekeeper ]
# The trainer calls an actor only when it has something to send or is owed something, but a
# departing worker must go down on time regardless (NOTE [ Shutdown ladder ]: CLOSE, then SIGTERM,
# then SIGKILL), and be reaped when it exits so its player and shared memory go. So a thread of
# the actor's own takes the ladder's steps between calls. It never polls: it sleeps in the
# process backend's wait, on the departing processes' sentinels and the live workers' pipes,
# until the ladder's next deadline; with nothing departing it sleeps on a condition until a call
# ends (a call is what adds a departure). The backend has one user at a time: a call that
# arrives while the housekeeper waits cuts that wait short through the backend's waker (a
# socket pair in the same wait; CPython's process pool wakes its manager thread the same way,
# with a pipe), takes the turn, and hands it back with a notify when it returns.
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
        self._where = (ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), os.getpid())
        node_id, address, actor_pid = self._where
        self._backend = ProcessBackend(
            BackendSetup(
                settings,
                n_env,
                pickled_env_factory,
                time.monotonic,
                shared_memory=False,
                host=(address, node_id, actor_pid),  # in its workers' labels
                forkable=False,
            )
        )
        self._envs: Dict[int, WorkerRef] = {}  # the live incarnations, as the actor tells its backend
        self._ready: Set[int] = set()  # worker ids whose current incarnation has said READY
        self._known: Set[int] = set()  # every worker id launched here
        self._pids: Dict[Tuple[int, int], int] = {}
        self._events: List[EnvEvent] = []
        # NOTE [ The actor's housekeeper ]: between calls, departing workers still go down on time.
        self._wake = self._backend.waker()
        self._turn = threading.Condition()  # who uses the backend: a call, or the housekeeper
        self._calls_waiting = 0  # calls that want the turn (written by the actor's one call thread)
        self._closed = False
        self._housekeeper = threading.Thread(target=self._keep_house, name="ladder", daemon=True)
        self._housekeeper.start()

    def exchange(self, items: List[Item], wait_s: float) -> HostReport:
        """Carry out ``items`` in order, then wait up to ``wait_s`` for the replies they ask
        from envs that are ready (envs still starting answer in a later call); without items
        (a poll), for anything to report."""
        with self._call():
            return self._exchange(items, wait_s)

    def apply(self, items: List[Item]) -> None:
        """Carry out ``items`` in order; what the workers answer goes in the next report."""
        with self._call():
            self._apply(items)

    @contextlib.contextmanager
    def _call(self) -> Iterator[None]:
        """The backend's turn for a call: the housekeeper's wait is cut short, and it waits
        until the call is over."""
        self._calls_waiting += 1
        self._wake()
        with self._turn:
            self._calls_waiting -= 1
            try:
                yield
            finally:
                self._turn.notify()

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
        with self._call():
            self._closed = True
        self._housekeeper.join()
        with self._turn:
            return self._close(interrupted)

    def _keep_house(self) -> None:
        """While no call runs and workers are departing: wait on their processes and the live
        workers' pipes until the ladder's next deadline, then take its next step; what the
        live workers say meanwhile is kept for the next report. With nothing departing, it
        sleeps until a call ends."""
        with self._turn:
            while not self._closed:
                deadline = self._backend.next_deadline()
                if self._calls_waiting or deadline is None:
                    self._turn.wait()
                    continue
                self._receive(self._backend.wait(max(0.0, deadline - time.monotonic())))
                self._backend.advance()

    def _close(self, interrupted: bool) -> HostReport:
        for ref in self._envs.values():
            self._backend.release(ref, Reason.INTERRUPTED if interrupted else Reason.CLOSE)
        self._envs.clear()
        self._receive(self._backend.close(interrupted))  # the closed workers' timers
        return self._report()

    # ------------------------------------------------------------------------------ items

    def _launch(self, spec: WorkerSpec) -> None:
        logging_util.set_log_level(spec.log_level)
        placement = self._backend.launch(spec)
        assert placement is not None and placement.pid is not None  # the process backend knows at once
        label = worker_label(spec.worker_id, placement.pid, placement)
        self._envs[spec.worker_id] = WorkerRef(spec.worker_id, spec.incarnation, label, None)
        self._ready.discard(spec.worker_id)
        self._known.add(spec.worker_id)
        self._pids[(spec.worker_id, spec.incarnation)] = placement.pid

    def _current(self, worker_id: int, incarnation: int) -> Optional[WorkerRef]:
        ref = self._envs.get(worker_id)
        return ref if ref is not None and ref.incarnation == incarnation else None  # else released

    def _deliver(self, item: Deliver) -> bool:
        ref = self._current(item.worker_id, item.incarnation)
        if ref is None:
            return False
        self._envs[item.worker_id] = ref = ref._replace(last_command=item.command)
        self._backend.deliver(ref, item.command, item.data)
        return item.command in WITH_REPLY

    def _release(self, item: Release) -> None:
        ref = self._current(item.worker_id, item.incarnation)
        if ref is None:
            return
        del self._envs[item.worker_id]
        self._ready.discard(item.worker_id)
        self._backend.release(ref._replace(last_command=item.last_command), item.reason)

    # ----------------------------------------------------------------------------- events

    def _receive(self, events: Sequence[Event]) -> Set[int]:
        """Keep what the workers said for the report; return who answered a request."""
        answered = set()
        for event in events:
            if isinstance(event, WorkerTimers):
                self._timers.append(event.timer_root)
                continue
            ref = self._current(event.worker_id, event.incarnation)
            if ref is None:
                continue  # from an incarnation released meanwhile
            if isinstance(event, Reply):
                response = event.response
                if response.cmd is EnvironmentCommand.READY:
                    self._ready.add(ref.worker_id)
                else:
                    answered.add(ref.worker_id)
                self._events.append(EnvEvent(ref.worker_id, ref.incarnation, response, None))
                if response.cmd in LAST_WORDS:
                    self._let_go(ref)
            elif isinstance(event, Death):
                answered.add(ref.worker_id)
                self._events.append(EnvEvent(ref.worker_id, ref.incarnation, None, event.error))
                self._let_go(ref)
        return answered

    def _let_go(self, ref: WorkerRef) -> None:
        """A worker that died or is exiting goes to the ladder now, not when the trainer's
        Release comes (a call later): its sentinel, still watched, would wake every wait."""
        del self._envs[ref.worker_id]
        self._ready.discard(ref.worker_id)
        self._backend.release(ref, Reason.CLOSE)

    def _departing(self) -> FrozenSet[int]:
        return frozenset(w for w in self._known if self._backend.departing(w))

    def _report(self) -> HostReport:
        departing = self._departing()
        outcomes = {
            w: self._backend.outcome(w) for w in self._known if w not in self._envs and w not in departing
        }
        report = HostReport(self._events, self._where, self._pids, departing, outcomes, self._timers)
        self._events, self._pids, self._timers = [], {}, []
        return report

    def __repr__(self) -> str:  # Ray shows this in its logs and errors
        return f"EnvHostActor(pid {os.getpid()})"
