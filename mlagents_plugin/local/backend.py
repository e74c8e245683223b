"""ProcessBackend: env workers as processes on this machine, on pipes and sentinels.

The subprocess backend's transport (core/backend.py says what a backend is): it starts worker
processes (worker.py), waits on their pipes and process sentinels at once, and hands them to the
shutdown ladder (shutdown.py). SupervisedEnvManager (supervisor.py) runs it in the trainer, and
each Ray actor runs one on its node (ray/actor.py). It imports neither torch nor ML-Agents'
trainers: an actor that loads it stays light.
"""
import multiprocessing
import multiprocessing.util
import os
import secrets
import signal
import sys
from multiprocessing.process import BaseProcess
from typing import Dict, List, NamedTuple, Optional, Tuple

from mlagents_envs import logging_util

from mlagents_plugin.core import factories, platform, wire
from mlagents_plugin.core.backend import Backend, BackendSetup, Death, Event, Reply, WorkerTimers
from mlagents_plugin.core.errors import WorkerDiedError
from mlagents_plugin.core.lifecycle import Reason, Slot
from mlagents_plugin.core.names import Placement, command_name
from mlagents_plugin.core.protocol import (
    EnvironmentCommand,
    EnvironmentRequest,
    WorkerSpec,
    pack,
    unpack_response,
)
from mlagents_plugin.local import hardening, processes
from mlagents_plugin.local.readiness import WorkerConnection
from mlagents_plugin.local.shutdown import Ladder
from mlagents_plugin.local.worker import start_worker, worker_preload

logger = logging_util.get_logger(__name__)


class _Worker(NamedTuple):
    """A running worker process and the trainer's end of its pipe."""

    process: BaseProcess
    conn: Optional[WorkerConnection]  # None once the worker closed its end


class ProcessBackend(Backend):
    def __init__(self, setup: BackendSetup):
        settings = setup.settings
        self._context = multiprocessing.get_context(settings.start_method)
        if settings.start_method == "forkserver":  # NOTE [ Worker start-up ]
            self._context.set_forkserver_preload(
                worker_preload() + factories.modules_to_load(setup.pickled_env_factory)
            )
            processes.short_socket_dir()
        token = secrets.token_hex(4)
        self._owner = f"{processes.owner_prefix(os.getpid())}{token}/"
        self._segments = wire.manager_prefix(os.getpid(), token) if setup.shared_memory else None
        self._timers: List[WorkerTimers] = []  # of workers that closed since the last wait
        self._kill_grace_s = settings.kill_grace_s
        self._hardening = hardening.layer(platform.hardened())  # NOTE [ Portable core, Linux hardening ]
        self._readiness = self._hardening.readiness()
        self._ladder = Ladder(settings.shutdown_timeout_s, settings.kill_grace_s, self._readiness, setup.clock)
        self._workers: Dict[int, _Worker] = {}  # by worker id: the live incarnations
        # worker id -> (segment prefix, the last segment its replies named), until it is reaped
        self._segments_of_departing: Dict[int, Tuple[str, Optional[str]]] = {}

    def launch(self, slot: Slot, spec: WorkerSpec) -> Placement:
        spec = spec._replace(
            owner_tag=self._owner_tag(slot),
            hardened=self._hardening.hardened,
            segment_prefix=self._segment_prefix(slot),
        )
        process, conn = start_worker(self._context, spec)
        assert process.pid is not None  # started
        self._hardening.watch_worker(process.pid)  # NOTE [ No orphans ]
        if not self._workers and self._context.get_start_method() == "forkserver":
            # the fork server's socket lives in multiprocessing's temp dir, which only an exit
            # of this process removes: the reaper removes it after a SIGKILL too
            self._hardening.remove_with_me(multiprocessing.util.get_temp_dir())
        self._workers[slot.worker_id] = _Worker(process, conn)
        self._readiness.watch(process.sentinel, (slot, slot.incarnation, _SENTINEL))
        self._readiness.watch(conn, (slot, slot.incarnation, _PIPE))
        return Placement(slot.worker_id, process.pid, "localhost")

    def _owner_tag(self, slot: Slot) -> str:
        """What the slot's current incarnation tags its descendants with (NOTE [ No orphans ])."""
        return f"{self._owner}{slot.worker_id}.{slot.incarnation}/"

    def _segment_prefix(self, slot: Slot) -> Optional[str]:
        if self._segments is None:
            return None
        return wire.segment_prefix(self._segments, slot.worker_id, slot.incarnation)

    def deliver(self, slot: Slot, command: EnvironmentCommand, data: bytes) -> None:
        worker = self._workers.get(slot.worker_id)
        if worker is not None:
            _send(worker, data)

    def release(self, slot: Slot, reason: Reason) -> None:
        """Hand the slot's process to the shutdown ladder (CLOSE first, if it may still read
        it); its shared memory goes once it is reaped."""
        worker = self._workers.pop(slot.worker_id, None)
        if worker is None:  # never started (a launch that failed), or released already
            return
        if reason is Reason.CLOSE:
            close = EnvironmentRequest(EnvironmentCommand.CLOSE, slot.worker_id, slot.incarnation)
            _send(worker, pack(close))
        # Not now: a worker still stepping may be creating a segment this very moment, and its
        # tracker registration could then arrive after our unregistration (a "leak" at exit).
        prefix = self._segment_prefix(slot)
        if prefix is not None:
            self._segments_of_departing[slot.worker_id] = (prefix, slot.decoder.segment_name)
        self._readiness.forget(worker.process.sentinel)
        if worker.conn is not None:
            self._readiness.forget(worker.conn)
        self._ladder.add(
            slot.worker_id,
            worker.process,
            worker.conn,
            slot.label,
            self._owner_tag(slot),
            slot.awaiting or slot.last_command,
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
        readable: Dict[int, Slot] = {}
        exited: Dict[int, Slot] = {}
        for _, data in self._readiness.wait(timeout):
            if data is None:
                continue  # the ladder's
            slot, incarnation, kind = data
            if slot.worker_id in self._workers and slot.incarnation == incarnation:
                (exited if kind is _SENTINEL else readable)[slot.worker_id] = slot
        events: List[Event] = list(self._timers)
        self._timers = []
        for worker_id, slot in {**readable, **exited}.items():
            events += self._service(slot, worker_id in readable, worker_id in exited)
        return events

    def _service(self, slot: Slot, readable: bool, exited: bool) -> List[Event]:
        """What the worker sent; if its sentinel fired, everything, then its death.

        A live worker gets one ``recv`` per wait: a second message makes the next wait return
        at once, and not polling here saves a system call on every step. Reading stops at a
        message that ends the worker (ENV_EXITED, STOPPED): the rest is the ladder's to drain.
        """
        worker = self._workers[slot.worker_id]
        events: List[Event] = []
        conn = worker.conn
        try:
            while conn is not None and (readable or conn.poll()):
                response = unpack_response(conn.recv_bytes())
                events.append(Reply(slot, slot.incarnation, response))
                if response.cmd in _LAST_WORDS:
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
            self._workers[slot.worker_id] = worker._replace(conn=None)
        if exited:
            # A fork's or spawn's sentinel fires when the worker's descriptors are closed, a moment
            # before the kernel has its exit status: join waits for that (multiprocessing's join
            # does the same: the process is already in the kernel's exit path).
            worker.process.join(SENTINEL_WAIT_S)
            exitcode = worker.process.exitcode
            error = WorkerDiedError(
                f"{slot.label} {processes.describe_exit(exitcode)} "
                f"(last command: {command_name(slot.last_command)}){self._bus_error_hint(exitcode)}.",
                slot.worker_id,
                worker.process.pid,
                exitcode,
            )
            events.append(Death(slot, slot.incarnation, error))
        return events


    def _bus_error_hint(self, exitcode: Optional[int]) -> str:
        """A worker killed by SIGBUS that writes into /dev/shm most likely found it full."""
        if sys.platform != "linux" or self._segments is None or exitcode != -signal.SIGBUS:
            return ""
        return (
            f"; it writes large observations into shared memory, and a full {wire.DEV_SHM} is the "
            f"usual cause ({wire.dev_shm_space()}; in Docker: `docker run --shm-size=2g`)"
        )


def _send(worker: _Worker, data: bytes) -> None:
    """Never raises: a worker that is gone reports how through its sentinel or its deadline."""
    if worker.conn is not None:
        try:
            worker.conn.send_bytes(data)
        except (OSError, EOFError):
            pass


SENTINEL_WAIT_S = 1.0  # what join waits for the sentinel, which has fired already
_SENTINEL, _PIPE = "sentinel", "pipe"  # what woke the trainer, in Readiness data
_LAST_WORDS = (EnvironmentCommand.ENV_EXITED, EnvironmentCommand.STOPPED)
