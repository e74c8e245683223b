"""The Ray actor that hosts ``envs_per_worker`` env workers: a node-local process backend.

The actor does not run envs itself. It runs the subprocess backend (local/backend.py) on its
own node, over the envs the trainer gives it, and answers the trainer's calls with what those
workers said. See NOTE [ Ray actors host worker processes ] and, for how the trainer batches its
calls, NOTE [ Hosts ] in backend.py.

This module does not import Ray at module level: backend.py turns ``EnvHostActor`` into an
actor class.
"""
import os
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Dict, FrozenSet, List, NamedTuple, Optional, Sequence, Set, Tuple, Union

import attr
from mlagents_envs import logging_util

from mlagents_plugin.core import platform
from mlagents_plugin.core.backend import BackendSetup, Death, Event, Message, Reply, WorkerRef, WorkerTimers
from mlagents_plugin.core.errors import WorkerDiedError
from mlagents_plugin.core.lifecycle import WITH_REPLY, Reason
from mlagents_plugin.core.names import worker_label
from mlagents_plugin.core.protocol import LAST_WORDS, EnvironmentCommand, WorkerSpec
from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.local.backend import Host, ProcessBackend

logger = logging_util.get_logger(__name__)


# NOTE [ The actor's loop ]
# One thread of the actor's own, its loop, is the only user of its process backend, as CPython's
# process pool (concurrent/futures/process.py) has one management thread. A call from the
# trainer (``exchange``, ``apply``, ``close``), which Ray runs on a thread of its own, does not
# touch the backend: it posts its work to the loop through a queue, wakes the loop through the
# backend's waker (a socket pair in the same wait as the workers' pipes; the process pool wakes its
# management thread with a pipe the same way), and waits for the answer (a Future). Between calls
# the loop sleeps in the backend's wait, on the live workers' pipes and the departing processes'
# sentinels, until the shutdown ladder's next deadline or until a call wakes it: a departing
# worker goes down on time (NOTE [ Shutdown ladder ]: CLOSE, then SIGTERM, then SIGKILL) and is
# reaped when it exits, so its player and shared memory go, whether or not the trainer calls; what
# the live workers say meanwhile is kept for the next report. Nothing in the actor polls (with
# nothing departing, the loop's wait is bounded by IDLE_S only because a wait needs a bound).
IDLE_S = 3600.0


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


class HostReport(NamedTuple):
    """The answer to every exchange and to the close: what happened since the last one."""

    events: List[Union[Reply, Death]]  # what the envs said, or how they ended
    where: Tuple[str, str, int]  # node id, node address, actor pid
    pids: Dict[Tuple[int, int], int]  # (worker id, incarnation) -> pid, for launches since
    departing: FrozenSet[int]  # worker ids whose processes are still on their way out
    outcomes: Dict[int, str]  # how each worker's last process ended, once it did
    timers: List[Any]  # timer trees of workers that closed since


class _Posted(NamedTuple):
    """A call's work for the loop, and where its answer goes."""

    work: Callable[[], Any]
    answer: "Future[Any]"
    last: bool  # the close: the loop ends after it


class EnvHostActor:
    def __init__(self, settings: EnvManagerSettings, pickled_env_factory: bytes, n_env: int):
        import ray  # this runs in a Ray worker; the module itself does not need Ray

        self._timers: List[Any] = []
        # The actor's threads would be copied by a fork: workers come from its fork server (or,
        # on the portable path, are spawned).
        settings = attr.evolve(settings, start_method=platform.default_start_method())
        self._where = (ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), os.getpid())
        node_id, address, actor_pid = self._where
        setup = BackendSetup(settings, n_env, pickled_env_factory, time.monotonic)
        self._clock = setup.clock  # the backend's ladder and the exchanges' waits read this one
        where = (address, node_id, actor_pid)  # in its workers' labels
        self._backend = ProcessBackend(setup, Host(shared_memory=False, where=where, forkable=False))
        self._envs: Dict[int, WorkerRef] = {}  # the live incarnations, as the actor tells its backend
        self._ready: Set[int] = set()  # worker ids whose current incarnation has said READY
        self._known: Set[int] = set()  # every worker id launched here
        self._pids: Dict[Tuple[int, int], int] = {}
        self._events: List[Union[Reply, Death]] = []
        # NOTE [ The actor's loop ]: the one thread that uses the backend; calls post to it.
        self._posted: "queue.SimpleQueue[_Posted]" = queue.SimpleQueue()
        self._wake = self._backend.waker()
        self._loop = threading.Thread(target=self._run, name="env-host-loop", daemon=True)
        self._loop.start()

    def exchange(self, items: List[Item], wait_s: float) -> HostReport:
        """Carry out ``items`` in order, then wait up to ``wait_s`` for the replies they ask
        from envs that are ready (envs still starting answer in a later call); without items
        (a poll), for anything to report."""
        return self._post(lambda: self._exchange(items, wait_s))

    def apply(self, items: List[Item]) -> None:
        """Carry out ``items`` in order; what the workers answer goes in the next report."""
        self._post(lambda: self._apply(items))

    def close(self, interrupted: bool) -> HostReport:
        """Take every worker down (NOTE [ Shutdown ladder ]), bounded; report how they went."""
        report: HostReport = self._post(lambda: self._close(interrupted), last=True)
        self._loop.join()
        return report

    def _post(self, work: Callable[[], Any], last: bool = False) -> Any:
        """Have the loop run ``work`` (NOTE [ The actor's loop ]); its value, or what it raised."""
        if not self._loop.is_alive():
            raise RuntimeError(f"{self!r} is closed")
        answer: "Future[Any]" = Future()
        self._posted.put(_Posted(work, answer, last))
        self._wake()
        return answer.result()

    def _run(self) -> None:
        """The loop: each posted call's work, in order; between calls, the workers and the
        ladder. Ends after the close. What the wait between calls raised (a bug) becomes the next
        call's answer, after that call's work ran (a close still takes the workers down); if the
        loop itself ends by an exception, every call waiting gets it."""
        trouble: Optional[Exception] = None  # what the loop raised between calls
        posted: Optional[_Posted] = None
        try:
            while True:
                try:
                    posted = self._posted.get(block=trouble is not None)
                except queue.Empty:
                    posted = None
                    try:
                        self._wait_once(None)
                    except Exception as e:  # a bug: the trainer hears of it in its next call
                        trouble = e
                    continue
                try:
                    result, error = posted.work(), trouble
                except Exception as e:  # the call raises it, in Ray's RayTaskError
                    result, error = None, trouble or e
                trouble = None
                if error is None:
                    posted.answer.set_result(result)
                else:
                    posted.answer.set_exception(error)
                if posted.last:
                    return
        except BaseException as e:
            if posted is not None and not posted.answer.done():
                posted.answer.set_exception(e)
            while not self._posted.empty():
                self._posted.get().answer.set_exception(e)
            raise

    def _wait_once(self, until: Optional[float]) -> Set[int]:
        """Wait on the workers until ``until`` (None: until a call wakes the loop) or the ladder's
        next deadline, whichever is first, then take the ladder's steps; return who answered a
        request. What the workers said is kept for the next report."""
        ends = [t for t in (until, self._backend.next_deadline()) if t is not None]
        timeout = min(ends) - self._clock() if ends else IDLE_S
        answered = self._receive(self._backend.wait(max(0.0, timeout)))
        self._backend.advance()
        return answered

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
                self._events.append(Death(spec.worker_id, spec.incarnation, error))
        return awaited

    def _exchange(self, items: List[Item], wait_s: float) -> HostReport:
        awaited = self._apply(items)
        if items and not awaited:
            wait_s = 0.0  # nothing to wait for (messages without replies, envs still starting)
        departing = self._departing()
        deadline = self._clock() + wait_s
        answered: Set[int] = set()
        while not (awaited <= answered and (awaited or self._events or self._departing() != departing)):
            answered |= self._wait_once(deadline)
            if self._clock() >= deadline:
                break
        return self._report()

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
        self._backend.deliver([Message(ref, item.command, item.data)])
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
                self._events.append(event)
                if response.cmd in LAST_WORDS:
                    self._let_go(ref)
            elif isinstance(event, Death):
                answered.add(ref.worker_id)
                self._events.append(event)
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
