"""ProcessBackend: env workers as processes on this machine, on pipes and sentinels.

The subprocess backend's transport (core/backend.py says what a backend is): it starts worker
processes (worker.py), waits on their pipes and process sentinels at once, and hands them to the
shutdown ladder (shutdown.py). SupervisedEnvManager (supervisor.py) runs it in the trainer, and
each Ray actor runs one on its node (ray/actor.py). It imports neither torch nor ML-Agents'
trainers: an actor that loads it stays light.
"""
import contextlib
import glob
import multiprocessing
import multiprocessing.util
import os
import secrets
import signal
import socket
import sys
from multiprocessing.process import BaseProcess
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import attr
import psutil
from mlagents_envs import logging_util

from mlagents_plugin.core import factories, platform, wire
from mlagents_plugin.core.backend import Backend, BackendSetup, Death, Event, Message, Reply, WorkerRef, WorkerTimers
from mlagents_plugin.core.errors import ForkServerDiedError, WorkerDiedError
from mlagents_plugin.core.lifecycle import Reason
from mlagents_plugin.core.names import command_name, worker_label
from mlagents_plugin.core.placement import Placement
from mlagents_plugin.core.protocol import (
    LAST_WORDS,
    EnvironmentCommand,
    EnvironmentRequest,
    WorkerSpec,
    pack,
    unpack_response,
)
from mlagents_plugin.local import fork_server, hardening, processes
from mlagents_plugin.local.readiness import WorkerConnection
from mlagents_plugin.local.shutdown import Ladder
from mlagents_plugin.local.worker import ProcessOptions, start_worker

logger = logging_util.get_logger(__name__)


@attr.s(auto_attribs=True, slots=True)
class _Worker:
    """A running worker incarnation, as this backend knows it (it is this record's one writer)."""

    process: BaseProcess
    conn: Optional[WorkerConnection]  # the trainer's end of its pipe; None once the worker closed it
    incarnation: int
    label: str
    last_command: Optional[EnvironmentCommand] = None  # the last one delivered, for its death's message
    # the generation of the fork server it was forked from, and the process itself as psutil
    # names it (pid reuse safe), to take it down if that server dies (NOTE [ A fork server dies ])
    server: Optional[int] = None
    psutil_process: Optional[psutil.Process] = None


class Host(NamedTuple):
    """The process the backend runs in: the trainer's (the default), or a Ray actor's."""

    # Whether workers may put large arrays in shared memory: not when the steps travel on to
    # a trainer on another machine (a Ray actor's process backend).
    shared_memory: bool = True
    # Where the workers run, as a Placement says it after the worker id and pid: node address,
    # node id, hosting actor's pid (a Ray actor's process backend names its node and itself).
    where: Tuple[str, Optional[str], Optional[int]] = ("localhost", None, None)
    # Whether this process may be forked to make workers from (not a Ray worker, whose threads
    # a fork would copy: NOTE [ A fork server forked from the trainer ]).
    forkable: bool = True


TRAINER = Host()  # workers of the trainer's own process


class ProcessBackend(Backend):
    def __init__(self, setup: BackendSetup, host: Host = TRAINER):
        settings = setup.settings
        self._context = multiprocessing.get_context(settings.start_method)
        if settings.start_method == "forkserver":  # NOTE [ Worker start-up ]
            modules = factories.modules_to_load(setup.pickled_env_factory)
            fork_server.set_preload(modules, may_fork_this_process=host.forkable)
        token = secrets.token_hex(4)
        self._owner = f"{processes.owner_prefix(os.getpid())}{token}/"
        self._segments = wire.manager_prefix(os.getpid(), token) if host.shared_memory else None
        self._timers: List[WorkerTimers] = []  # of workers that closed since the last wait
        self._host = host.where
        self._kill_grace_s = settings.kill_grace_s
        self._hardening = hardening.layer(platform.hardened())  # NOTE [ Portable core, Linux hardening ]
        self._readiness = self._hardening.readiness()
        self._ladder = Ladder(settings.shutdown_timeout_s, settings.kill_grace_s, self._readiness, setup.clock)
        self._workers: Dict[int, _Worker] = {}  # by worker id: the live incarnations
        self._wakeup: Optional[socket.socket] = None  # see waker()
        self._wakeup_sender: Optional[socket.socket] = None
        # worker id -> (segment prefix, the last segment its replies named), until it is reaped
        self._segments_of_departing: Dict[int, Tuple[str, Optional[str]]] = {}

    def launch(self, spec: WorkerSpec) -> Placement:
        worker_id, incarnation = spec.worker_id, spec.incarnation
        options = ProcessOptions(
            owner_tag=self._owner_tag(worker_id, incarnation),
            hardened=self._hardening.hardened,
            segment_prefix=self._segment_prefix(worker_id, incarnation),
        )
        try:
            if self._context.get_start_method() == "forkserver":
                fork_server.ensure_running()  # NOTE [ The fork server's sys.path ]
            process, conn = start_worker(self._context, spec, options)
        except (FileNotFoundError, ConnectionRefusedError) as e:
            if self._context.get_start_method() != "forkserver" or _fork_server_socket_exists():
                raise
            self._context = _without_fork_server(e)
            process, conn = start_worker(self._context, spec, options)
        # read after the start: the server that forked it (NOTE [ A fork server dies ])
        server = fork_server.current() if self._context.get_start_method() == "forkserver" else None
        assert process.pid is not None  # started
        self._hardening.watch_worker(process.pid)  # NOTE [ No orphans ]
        placement = Placement(worker_id, process.pid, *self._host)
        label = worker_label(worker_id, process.pid, placement)
        self._workers[worker_id] = _Worker(
            process, conn, incarnation, label, server=server, psutil_process=_psutil_process(server, process.pid)
        )
        self._readiness.watch(process.sentinel, (worker_id, incarnation, _SENTINEL))
        self._readiness.watch(conn, (worker_id, incarnation, _PIPE))
        return placement

    def waker(self) -> Callable[[], None]:
        """A function that, from another thread, cuts the current (or next) ``wait`` short.
        Call it once, before that thread exists (ray/actor.py's calls, waking its loop)."""
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        theirs.setblocking(False)
        self._wakeup, self._wakeup_sender = ours, theirs
        self._readiness.watch(ours, _WAKE)

        def wake() -> None:
            try:
                theirs.send(b"\0")
            except OSError:  # full: a wait is woken already; closed: nothing waits any more
                pass

        return wake

    def _owner_tag(self, worker_id: int, incarnation: int) -> str:
        """What a worker incarnation tags its descendants with (NOTE [ No orphans ])."""
        return f"{self._owner}{worker_id}.{incarnation}/"

    def _segment_prefix(self, worker_id: int, incarnation: int) -> Optional[str]:
        if self._segments is None:
            return None
        return wire.segment_prefix(self._segments, worker_id, incarnation)

    def _current(self, ref: WorkerRef) -> Optional[_Worker]:
        worker = self._workers.get(ref.worker_id)
        return worker if worker is not None and worker.incarnation == ref.incarnation else None

    def deliver(self, messages: Sequence[Message]) -> None:
        for worker, command, data in messages:
            current = self._current(worker)
            if current is not None:
                current.last_command = command
                _send(current, data)

    def release(self, worker: WorkerRef, reason: Reason) -> None:
        """Hand the worker's process to the shutdown ladder (CLOSE first, if it may still read
        it); its shared memory goes once it is reaped."""
        current = self._current(worker)
        if current is None:  # never started (a launch that failed), or released already
            return
        del self._workers[worker.worker_id]
        if reason is Reason.CLOSE:
            close = EnvironmentRequest(EnvironmentCommand.CLOSE, worker.worker_id, worker.incarnation)
            _send(current, pack(close))
        # Not now: a worker still stepping may be creating a segment this very moment, and its
        # tracker registration could then arrive after our unregistration (a "leak" at exit).
        prefix = self._segment_prefix(worker.worker_id, worker.incarnation)
        if prefix is not None:
            self._segments_of_departing[worker.worker_id] = (prefix, worker.last_segment)
        self._readiness.forget(current.process.sentinel)
        if current.conn is not None:
            self._readiness.forget(current.conn)
        self._ladder.add(
            worker.worker_id,
            current.process,
            current.conn,
            worker.label,
            self._owner_tag(worker.worker_id, worker.incarnation),
            worker.last_command,
            reason,
            on_closed=lambda root: self._timers.append(WorkerTimers(root)),
        )

    def departing(self, worker_id: int) -> bool:
        return worker_id in self._ladder

    def next_deadline(self) -> Optional[float]:
        return self._ladder.next_deadline()

    def advance(self) -> None:
        self._ladder.advance()
        self._remove_segments_of_departed()

    def _remove_segments_of_departed(self) -> None:
        for worker_id, (prefix, last_seen) in list(self._segments_of_departing.items()):
            if worker_id not in self._ladder:  # reaped: nobody creates segments under it any more
                self._hardening.remove_segments(prefix, last_seen)
                del self._segments_of_departing[worker_id]

    def close(self, interrupted: bool) -> List[WorkerTimers]:
        """The ladder, to the end (NOTE [ Shutdown ladder ]): within shutdown_timeout_s +
        kill_grace_s (plus the moment SIGKILL takes), or at once when ``interrupted``. Then
        whatever the workers left."""
        if interrupted:
            self._ladder.force()
        self._ladder.run()
        self._readiness.close()
        for sock in (self._wakeup, self._wakeup_sender):
            if sock is not None:
                sock.close()  # a late wake() finds it closed: nothing waits any more
        self._kill_orphans()
        self._remove_segments_of_departed()
        timers, self._timers = self._timers, []
        return timers

    def port_holder(self, port: int) -> Optional[str]:
        return processes.port_holder(port)

    def hurry(self) -> bool:
        if sys.platform == "win32":  # its SIGTERM is TerminateProcess: it would cut envs' close short
            return False
        self._ladder.hurry()
        return True

    def outcome(self, worker_id: int) -> str:
        return self._ladder.outcomes.get(worker_id, "was not running")

    def _kill_orphans(self) -> None:
        orphans = processes.find_tagged(self._owner)
        if orphans:
            logger.warning(
                "Killing processes left behind by env workers: "
                + ", ".join(f"pid {p.pid}" for p in orphans)
            )
            processes.kill_processes(orphans, self._kill_grace_s)

    # ------------------------------------------------------------------------- events

    def wait(self, timeout: float) -> List[Event]:
        """The trainer sleeps on every worker's pipe *and* process sentinel at once
        (readiness.py): a reply and a death both wake it at once, and nothing is polled.
        Departing processes are in the same set; the ladder's ``advance`` handles them.
        """
        readable: Dict[int, _Worker] = {}
        exited: Dict[int, _Worker] = {}
        for _, data in self._readiness.wait(timeout):
            if data is None:
                continue  # the ladder's
            if data is _WAKE:
                assert self._wakeup is not None  # watched only once made
                _drain(self._wakeup)
                continue
            worker_id, incarnation, kind = data
            worker = self._workers.get(worker_id)
            if worker is not None and worker.incarnation == incarnation:
                (exited if kind is _SENTINEL else readable)[worker_id] = worker
        events: List[Event] = list(self._timers)
        self._timers = []
        for worker_id, worker in {**readable, **exited}.items():
            events += self._service(worker_id, worker, worker_id in readable, worker_id in exited)
        return events

    def _service(self, worker_id: int, worker: _Worker, readable: bool, exited: bool) -> List[Event]:
        """What the worker sent; if its sentinel fired, everything, then its death.

        A live worker gets one ``recv`` per wait: a second message makes the next wait return
        at once, and not polling here saves a system call on every step. Reading stops at a
        message that ends the worker (ENV_EXITED, STOPPED): the rest is the ladder's to drain.
        """
        events: List[Event] = []
        conn = worker.conn
        try:
            while conn is not None and (readable or conn.poll()):
                response = unpack_response(conn.recv_bytes())
                events.append(Reply(worker_id, worker.incarnation, response))
                if response.cmd in LAST_WORDS:
                    return events
                if not exited:
                    return events
                readable = False
        except (EOFError, OSError):
            # The worker's end is closed: it died or is about to. Stop watching the pipe (it
            # would stay readable and spin the wait); the sentinel or the deadline decides.
            assert conn is not None  # only reading it raises these
            self._readiness.forget(conn)
            conn.close()
            worker.conn = None
        if exited:
            # A fork's or spawn's sentinel fires when the worker's descriptors are closed, a moment
            # before the kernel has its exit status: join waits for that (multiprocessing's join
            # does the same: the process is already in the kernel's exit path).
            worker.process.join(SENTINEL_WAIT_S)
            exitcode = worker.process.exitcode
            if exitcode == FORK_SERVER_LOST:  # or the worker's own exit code (NOTE [ A fork server dies ])
                end = fork_server.ended(worker.server, within_s=SENTINEL_WAIT_S)
                if end is not None:
                    events.append(Death(worker_id, worker.incarnation, _orphaned(worker_id, worker, end)))
                    return events
            error = WorkerDiedError(
                f"{worker.label} {processes.describe_exit(exitcode)} "
                f"(last command: {command_name(worker.last_command)}){self._bus_error_hint(exitcode)}.",
                worker_id,
                worker.process.pid,
                exitcode,
            )
            events.append(Death(worker_id, worker.incarnation, error))
        return events

    def _bus_error_hint(self, exitcode: Optional[int]) -> str:
        """A worker killed by SIGBUS that writes into /dev/shm most likely found it full."""
        if sys.platform != "linux" or self._segments is None or exitcode != -signal.SIGBUS:
            return ""
        return (
            f"; it writes large observations into shared memory, and a full {wire.DEV_SHM} is the "
            f"usual cause ({wire.dev_shm_space()}; in Docker: `docker run --shm-size=2g`)"
        )


# NOTE [ A fork server gone ]
# The fork server listens on a socket in multiprocessing's temp dir (/tmp/pymp-*). Whatever
# cleans /tmp while a run goes on (systemd-tmpfiles after 10 days, tmpreaper, a user's rm -rf
# /tmp/pymp-*) removes that socket, and every worker started after it, a restart included, would
# fail with FileNotFoundError: the run could never replace a worker again. The fork server itself
# still runs and still reports its workers' exits, so it is kept; new workers are spawned
# instead (a slower start, as on macOS and Windows), and a warning says why. The temp dir is made
# again, for multiprocessing to remove at exit (it would print a traceback for a missing one).
def _fork_server_socket_exists() -> bool:
    """Whether multiprocessing's temp dir still holds a listening socket (``listener-*``)."""
    return bool(glob.glob(os.path.join(multiprocessing.util.get_temp_dir(), "listener-*")))


def _without_fork_server(error: OSError) -> multiprocessing.context.BaseContext:
    os.makedirs(multiprocessing.util.get_temp_dir(), mode=0o700, exist_ok=True)
    logger.warning(
        f"multiprocessing's fork server cannot be reached ({type(error).__name__}: {error}): its "
        "socket in the temp dir was removed (a /tmp cleaner?). New env workers are spawned instead, "
        "which takes longer per worker (NOTE [ A fork server gone ])."
    )
    return multiprocessing.get_context("spawn")


def _psutil_process(server: Optional[int], pid: int) -> Optional[psutil.Process]:
    """The worker as psutil names it, where a fork server's death may leave it running."""
    if server is None:
        return None
    try:
        return psutil.Process(pid)
    except psutil.Error:  # gone already: its sentinel says so
        return None


def _orphaned(worker_id: int, worker: _Worker, end: fork_server.ServerEnd) -> ForkServerDiedError:
    """A worker whose fork server died: its exit status went with the server, and it may run on,
    so it is killed now; the ladder then finds it gone (NOTE [ A fork server dies ])."""
    if worker.psutil_process is not None:
        with contextlib.suppress(psutil.Error):
            worker.psutil_process.kill()  # psutil checks that the pid still names the worker
    return ForkServerDiedError(
        f"{worker.label} was lost with the fork server it was forked from (pid {end.pid}), "
        f"which {end.how} (last command: {command_name(worker.last_command)}).",
        worker_id,
        worker.process.pid,
        counted=not end.free,
    )


def _send(worker: _Worker, data: bytes) -> None:
    """Never raises: a worker that is gone reports how through its sentinel or its deadline."""
    if worker.conn is not None:
        try:
            worker.conn.send_bytes(data)
        except (OSError, EOFError):
            pass


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(4096):
            pass
    except OSError:  # nothing left (BlockingIOError)
        pass


SENTINEL_WAIT_S = 1.0  # what join waits for the sentinel, which has fired already
FORK_SERVER_LOST = 255  # multiprocessing's exit code for a worker whose fork server it cannot read
_SENTINEL, _PIPE, _WAKE = "sentinel", "pipe", "wake"  # what woke the trainer, in Readiness data
