"""The shutdown ladder: take worker processes down, politely first, always in bounded time.

# NOTE [ Shutdown ladder ]
# A worker leaves in one of four ways, and the ladder gives each a bounded path to "reaped":
#   asked    CLOSE was sent, or the worker reported an error and is closing its env by itself:
#            wait up to ``shutdown_timeout_s`` for it to exit (draining its pipe meanwhile, so a
#            worker blocked writing a large reply into a full pipe can still read CLOSE);
#   term     SIGTERM, which the worker turns into SystemExit to close its env and player
#            (NOTE [ Worker signals ]): wait up to ``kill_grace_s``;
#   kill     SIGKILL: wait at most ``KILL_WAIT_S`` for the kernel to reap it. A process that
#            survives even that (uninterruptible sleep in a driver) is reported and abandoned
#            rather than waited for: nothing here ever blocks without a deadline;
#   dead     it already exited: just reap it.
# A hung worker starts at ``term``: it would not read CLOSE. So does one still building its env
# (the factory, a Unity handshake, the wait for the Editor): it reads nothing until the env
# exists, and closing should not wait for that. Every other SIGTERM or SIGKILL is logged as a
# zombie-worker report naming the worker, its pid and the last command it was sent, since a
# worker that needs one is a bug worth seeing. After a worker is reaped, its pipe and the
# Process object's sentinel are closed, so create/close cycles do not leak descriptors.
#
# Upstream waits for CLOSED on a shared multiprocessing.Queue. A Queue has a feeder thread per
# writer: a worker killed while its feeder holds the queue's lock leaves the lock held and the
# pipe half-written, and the trainer's ``get`` then waits forever. Per-worker pipes and process
# sentinels have no shared lock and no thread, and waiting on them (readiness.py) takes a timeout.
"""
import enum
import signal
import time
from multiprocessing.process import BaseProcess
from typing import Any, Callable, Dict, List, Optional

import psutil
from mlagents_envs import logging_util

from mlagents_plugin.core import signals
from mlagents_plugin.core.lifecycle import Reason
from mlagents_plugin.core.names import command_name, zombie_report
from mlagents_plugin.core.protocol import EnvironmentCommand, unpack_response
from mlagents_plugin.local import processes
from mlagents_plugin.local.readiness import Readiness, WorkerConnection

logger = logging_util.get_logger(__name__)

KILL_WAIT_S = 0.5


class Stage(enum.Enum):
    ASKED = "asked"
    TERM = "term"
    KILL = "kill"


def _outcome(stage: Stage, exitcode: Optional[int]) -> str:
    """How a reaped worker went, for the close summary."""
    if stage is Stage.KILL:
        return "was killed with SIGKILL"
    if stage is Stage.TERM and exitcode in (-signal.SIGTERM, 128 + signal.SIGTERM):
        return "exited on SIGTERM"
    if exitcode == 0:
        return "exited"
    return processes.describe_exit(exitcode, hint=False)


class _Departure:
    def __init__(
        self,
        key: Any,
        process: BaseProcess,
        conn: Optional[WorkerConnection],
        label: str,
        owner_tag: str,
        last_command: Optional[EnvironmentCommand],
        on_closed: Callable[[Any], None],
    ):
        self.key = key
        self.process = process
        self.conn = conn
        self.label = label
        self.owner_tag = owner_tag
        self.last_command = last_command
        self.on_closed = on_closed
        self.stage = Stage.ASKED
        self.deadline = 0.0
        self.descendants: List[psutil.Process] = []  # snapshots taken before each signal


class Ladder:
    """Processes on their way out. ``advance`` never blocks; ``run`` blocks, with a deadline."""

    def __init__(
        self,
        shutdown_timeout_s: float,
        kill_grace_s: float,
        readiness: Readiness,
        clock: Callable[[], float] = time.monotonic,
    ):
        """``clock`` is the manager's (the fast tier's is fake)."""
        self.clock = clock
        self.shutdown_timeout_s = shutdown_timeout_s
        self.kill_grace_s = kill_grace_s
        self.readiness = readiness  # shared with the supervisor: one wait covers both
        self.departures: List[_Departure] = []
        self.outcomes: Dict[Any, str] = {}  # how the last process under each key went

    def add(
        self,
        key: Any,
        process: BaseProcess,
        conn: Optional[WorkerConnection],
        label: str,
        owner_tag: str,
        last_command: Optional[EnvironmentCommand],
        reason: Reason = Reason.CLOSE,
        on_closed: Callable[[Any], None] = lambda payload: None,
    ) -> None:
        """Start taking ``process`` down, where ``reason`` says (NOTE above). Once it is reaped,
        whatever it left running (its tagged processes, its snapshotted children) is killed."""
        item = _Departure(key, process, conn, label, owner_tag, last_command, on_closed)
        item.deadline = self.clock() + self.shutdown_timeout_s
        self.departures.append(item)
        self.readiness.watch(process.sentinel, None)
        if conn is not None:
            self.readiness.watch(conn, None)
        if reason is Reason.HUNG:
            self._escalate(item, f"did not answer {command_name(last_command)}")
        elif reason is Reason.BUILDING:
            logger.info(f"{label} is still building its env; stopping it with SIGTERM.")
            self._signal(item, Stage.TERM)
        elif reason is Reason.INTERRUPTED:
            self._kill_now(item)

    def __contains__(self, key: Any) -> bool:
        return any(item.key == key for item in self.departures)

    def next_deadline(self) -> Optional[float]:
        return min((item.deadline for item in self.departures), default=None)

    def advance(self) -> None:
        """Drain pipes, escalate what is past its deadline, reap what exited."""
        now = self.clock()
        for item in list(self.departures):
            self._drain(item)
            if not item.process.is_alive():
                self._reap(item, _outcome(item.stage, item.process.exitcode))
            elif now >= item.deadline:
                if item.stage is Stage.KILL:
                    logger.error(
                        f"{item.label} survived SIGKILL for {KILL_WAIT_S} s (uninterruptible "
                        "sleep in the kernel?); giving up on it. Check it with `ps`."
                    )
                    self._reap(item, "survived SIGKILL")
                else:
                    reason = (
                        f"did not exit within shutdown_timeout_s={self.shutdown_timeout_s} s"
                        if item.stage is Stage.ASKED
                        else f"ignored SIGTERM for kill_grace_s={self.kill_grace_s} s"
                    )
                    self._escalate(item, reason)

    def run(self) -> None:
        """Drive every process to reaped. Returns within shutdown_timeout_s + kill_grace_s + KILL_WAIT_S.
        An interrupt lands in the wait, never halfway through a step (NOTE [ Trainer signals ])."""
        while self.departures:
            with signals.deferred():
                self.advance()
            deadline = self.next_deadline()
            if deadline is None:
                break
            self.readiness.wait(deadline - self.clock())

    def hurry(self) -> None:
        """A first interrupt while closing: SIGTERM to every worker not past ``asked``, which
        stops one still serving a request and has it close its env now (a worker already closing
        its env ignores it and finishes), within the deadline it had."""
        for item in self.departures:
            if item.process.is_alive() and item.stage is Stage.ASKED:
                deadline = item.deadline
                self._signal(item, Stage.TERM)
                item.deadline = max(deadline, item.deadline)

    def force(self) -> None:
        """SIGKILL everything now (a second Ctrl-C), then reap within KILL_WAIT_S."""
        for item in self.departures:
            if item.process.is_alive() and item.stage is not Stage.KILL:
                self._kill_now(item)
        self.run()

    def _kill_now(self, item: _Departure) -> None:
        logger.warning(f"{item.label} was killed at once on a second interrupt.")
        self._signal(item, Stage.KILL)

    def _escalate(self, item: _Departure, reason: str) -> None:
        stage = Stage.TERM if item.stage is Stage.ASKED else Stage.KILL
        action = "sending SIGTERM" if stage is Stage.TERM else "sending SIGKILL"
        logger.warning(zombie_report(item.label, reason, item.last_command, action))
        self._signal(item, stage)

    def _signal(self, item: _Departure, stage: Stage) -> None:
        assert item.process.pid is not None  # started
        item.descendants += processes.descendants(item.process.pid)
        try:
            if stage is Stage.TERM:
                item.process.terminate()
            else:
                item.process.kill()
        except (OSError, ValueError):
            pass  # already gone
        item.stage = stage
        item.deadline = self.clock() + (
            self.kill_grace_s if stage is Stage.TERM else KILL_WAIT_S
        )

    def _drain(self, item: _Departure) -> None:
        conn = item.conn
        try:
            while conn is not None and conn.poll():
                message = unpack_response(conn.recv_bytes())
                if message.cmd is EnvironmentCommand.CLOSED:
                    item.on_closed(message.payload)
        except Exception:  # EOF from a dead worker, or a reply too broken to matter now
            self._close_conn(item)

    def _reap(self, item: _Departure, outcome: str) -> None:
        self.outcomes[item.key] = outcome
        self.readiness.forget(item.process.sentinel)
        item.process.join(timeout=0)
        if item.process.exitcode is not None:
            item.process.close()
        self._close_conn(item)
        self.departures.remove(item)
        leftovers = processes.kill_leftovers(item.owner_tag, item.descendants)
        if leftovers:
            logger.warning(
                f"Killed what {item.label} left running: "
                + ", ".join(f"pid {p.pid}" for p in leftovers)
            )

    def _close_conn(self, item: _Departure) -> None:
        if item.conn is not None:
            self.readiness.forget(item.conn)
            item.conn.close()
            item.conn = None
