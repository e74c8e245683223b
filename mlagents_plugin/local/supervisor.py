"""SupervisedEnvManager: ML-Agents' EnvManager over supervised worker processes.

A drop-in for ``mlagents.trainers.subprocess_env_manager.SubprocessEnvManager``: same
constructor, same behaviour, but every wait is bounded, every failure is explained, what can be
recovered is, and the workers are always reaped. docs/architecture.md has the picture and
docs/faults.md what happens on each fault.
"""
import multiprocessing
import multiprocessing.forkserver
import os
import secrets
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Callable, Dict, List, Optional

from mlagents.trainers.settings import RunOptions
from mlagents_envs import logging_util
from mlagents_envs.base_env import BaseEnv
from mlagents_envs.side_channel.side_channel import SideChannel

from mlagents_plugin.local import processes
from mlagents_plugin.core import factories
from mlagents_plugin.core import signals
from mlagents_plugin.core import wire
from mlagents_plugin.core.errors import WorkerDiedError
from mlagents_plugin.core.manager import Slot, SupervisedManagerBase, WorkerState, _name
from mlagents_plugin.core.protocol import EnvironmentCommand, unpack_response
from mlagents_plugin.local.readiness import Readiness
from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.local.shutdown import Ladder, Reason
from mlagents_plugin.local.worker import start_worker, worker_preload

logger = logging_util.get_logger(__name__)


def start_fork_server(factory_modules: List[str]) -> None:
    """Start the fork server now, preloading ``factory_modules`` besides what every worker
    imports, so that it loads them while the trainer is still setting up (NOTE [ Worker
    start-up ]). Returns at once; a server that runs already is kept."""
    multiprocessing.forkserver.set_forkserver_preload(worker_preload() + factory_modules)
    with signals.hangup_ignored():  # NOTE [ Trainer signals ]
        multiprocessing.forkserver.ensure_running()


class _ProcessSlot(Slot):
    def __init__(self, worker_id: int):
        super().__init__(worker_id)
        self.process: Optional[BaseProcess] = None
        self.conn: Optional[Connection] = None

    @property
    def live(self) -> bool:
        return self.process is not None


class SupervisedEnvManager(SupervisedManagerBase):
    def __init__(
        self,
        env_factory: Callable[[int, List[SideChannel]], BaseEnv],
        run_options: RunOptions,
        n_env: int = 1,
        settings: Optional[EnvManagerSettings] = None,
    ):
        super().__init__(env_factory, run_options, n_env, settings)
        self._context = multiprocessing.get_context(self.settings.start_method)
        if self.settings.start_method == "forkserver":  # NOTE [ Worker start-up ]
            self._context.set_forkserver_preload(
                worker_preload() + factories.modules_to_load(self._pickled_factory)
            )
        token = secrets.token_hex(4)
        self._owner = f"{processes.owner_prefix(os.getpid())}{token}/"
        self._segments = wire.manager_prefix(os.getpid(), token)
        self._readiness = Readiness()
        self._ladder = Ladder(
            self.settings.shutdown_timeout_s, self.settings.kill_grace_s, self._readiness
        )
        self._start_all()

    def _new_slot(self, worker_id: int) -> _ProcessSlot:
        return _ProcessSlot(worker_id)

    # ------------------------------------------------------------------ worker lifecycle

    def _launch(self, slot: _ProcessSlot) -> None:
        spec = self._worker_spec(slot, self._owner_tag(slot), self._segment_prefix(slot))
        slot.process, slot.conn = start_worker(self._context, spec)
        slot.pid = slot.process.pid
        processes.reaper.watch_worker(slot.pid)  # NOTE [ No orphans ]
        self._readiness.watch(slot.process.sentinel, (slot, slot.incarnation, _SENTINEL))
        self._readiness.watch(slot.conn, (slot, slot.incarnation, _PIPE))

    def _owner_tag(self, slot: _ProcessSlot) -> str:
        """What the slot's current incarnation tags its descendants with (NOTE [ No orphans ])."""
        return f"{self._owner}{slot.worker_id}.{slot.incarnation}/"

    def _segment_prefix(self, slot: _ProcessSlot) -> str:
        return wire.segment_prefix(self._segments, slot.worker_id, slot.incarnation)

    def _deliver(self, slot: _ProcessSlot, cmd: EnvironmentCommand, data: bytes) -> None:
        if slot.conn is None:
            return  # the worker closed its pipe; its sentinel or deadline reports it
        try:
            slot.conn.send_bytes(data)
        except (OSError, EOFError):
            pass  # the worker is gone; its sentinel reports how, on the next wait

    def _take_down(self, slot: _ProcessSlot, reason: Reason) -> None:
        """Hand the slot's process to the shutdown ladder; drop its shared memory."""
        wire.remove_segments(self._segment_prefix(slot))
        self._readiness.forget(slot.process.sentinel)
        if slot.conn is not None:
            self._readiness.forget(slot.conn)
        self._ladder.add(
            slot.worker_id,
            slot.process,
            slot.conn,
            slot.label,
            self._owner_tag(slot),
            slot.awaiting or slot.last_command,
            reason,
            on_closed=self._merge_worker_timers,
        )
        slot.process, slot.conn = None, None

    def _leaving(self, slot: _ProcessSlot) -> bool:
        return slot.worker_id in self._ladder

    def _close_workers(self) -> None:
        """CLOSE every worker, then the ladder (NOTE [ Shutdown ladder ]).

        Returns within shutdown_timeout_s + kill_grace_s (plus the moment SIGKILL takes), or at
        once after a second interrupt (NOTE [ Trainer signals ]).
        """
        for slot in self._slots:
            if slot.live:
                self._send(slot, EnvironmentCommand.CLOSE)
                building = slot.state is WorkerState.STARTING
                self._retire(slot, Reason.BUILDING if building else Reason.CLOSE)
        try:
            if signals.interrupted_twice():
                self._ladder.force()
            self._ladder.run()
        except KeyboardInterrupt:
            self._ladder.force()
            raise
        finally:
            self._readiness.close()
            self._kill_orphans(self._owner)
            wire.remove_segments(self._segments)

    def _close_outcome(self, worker_id: int) -> str:
        return self._ladder.outcomes.get(worker_id, "was not running")

    def _kill_orphans(self, owner_tag: str) -> None:
        orphans = processes.find_tagged(owner_tag)
        if orphans:
            logger.warning(
                "Killing processes left behind by env workers: "
                + ", ".join(f"pid {p.pid}" for p in orphans)
            )
            processes.kill_processes(orphans, self.settings.kill_grace_s)

    # ------------------------------------------------------------------------- events

    def _wait(self, timeout: float) -> None:
        """The trainer sleeps on every worker's pipe *and* process sentinel at once
        (readiness.py): a reply and a death both wake it at once, and nothing is polled.
        Shutting-down processes are in the same set; their readiness needs no handling beyond
        the ladder's ``advance``.
        """
        readable: Dict[int, _ProcessSlot] = {}
        exited: Dict[int, _ProcessSlot] = {}
        for _, data in self._readiness.wait(timeout):
            if data is None:
                continue  # the ladder's
            slot, incarnation, kind = data
            if slot.live and slot.incarnation == incarnation:
                (exited if kind is _SENTINEL else readable)[slot.worker_id] = slot
        for worker_id, slot in {**readable, **exited}.items():
            self._service(slot, worker_id in readable, worker_id in exited)

    def _next_backend_deadline(self) -> Optional[float]:
        return self._ladder.next_deadline()

    def _advance_backend(self) -> None:
        self._ladder.advance()

    def _service(self, slot: _ProcessSlot, readable: bool, exited: bool) -> None:
        """Read what the worker sent; if its sentinel fired, everything, then report its death.

        A live worker gets one ``recv`` per wait: a second message makes the next wait return
        at once, and not polling here saves a system call on every step.
        """
        incarnation = slot.incarnation
        try:
            while slot.conn is not None and (readable or slot.conn.poll()):
                self._handle(slot, unpack_response(slot.conn.recv_bytes()))
                if not slot.live or slot.incarnation != incarnation:
                    return  # it failed and was handed to the ladder
                if not exited:
                    break
                readable = False
        except (EOFError, OSError):
            # The worker's end is closed: it died or is about to. Stop watching the pipe (it
            # would stay readable and spin the wait); the sentinel or the deadline decides.
            self._readiness.forget(slot.conn)
            slot.conn.close()
            slot.conn = None
        if exited:
            self._fail(
                slot,
                WorkerDiedError(
                    f"{slot.label} {processes.describe_exit(slot.process.exitcode)} "
                    f"(last command: {_name(slot.last_command)}).",
                    slot.worker_id,
                    slot.process.pid,
                    slot.process.exitcode,
                ),
            )


_SENTINEL, _PIPE = "sentinel", "pipe"  # what woke the trainer, in Readiness data
