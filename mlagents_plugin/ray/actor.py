"""The Ray actor that hosts one env worker incarnation: a node-local supervisor of one process.

The actor does not run the env itself. It starts the same worker process the subprocess backend
uses (worker.py), on its own node, and relays packed messages between the trainer and that
worker's pipe without unpacking them. See NOTE [ Ray actors host a worker process ].

This module does not import Ray: ray_backend.py turns ``EnvWorkerActor`` into an actor class.
"""
import multiprocessing
import os
import secrets
from multiprocessing.connection import Connection, wait
from typing import Any, List, NamedTuple, Optional, Tuple, Union

from mlagents_envs import logging_util

from mlagents_plugin.core.protocol import EnvironmentCommand, EnvironmentRequest, WorkerSpec, pack
from mlagents_plugin.local import processes
from mlagents_plugin.local.readiness import Readiness
from mlagents_plugin.local.shutdown import Ladder
from mlagents_plugin.local.worker import start_worker

logger = logging_util.get_logger(__name__)

# The bound of each wait for the worker; the trainer's deadlines bound them all.
RELAY_WAIT_S = 1.0
# How long the actor waits to reap a worker whose sentinel fired, to learn its exit code.
EXIT_WAIT_S = 1.0


# NOTE [ Ray actors host a worker process ]
# A Ray actor could run the env in its own process, as RLlib's env runners do. It would then
# lose what the subprocess backend guarantees: a Unity build is started in its own session, and
# when the actor is killed (ray.kill on a hang, a lost node, the trainer's SIGKILL) nothing would
# take the build down with it. Instead each actor starts one worker process from worker.py and
# is that worker's "trainer": the worker watches the actor's pid and, when the actor dies, kills
# what it started and exits (NOTE [ No orphans ]); the actor's close runs the same shutdown ladder
# on its one worker (NOTE [ Shutdown ladder ]). Messages are relayed as the bytes they are on a
# pipe, so both ends speak protocol.py and the actor only forwards. The worker is started with
# spawn: an actor process runs Ray's threads, which a fork would copy in whatever state they are.
# The cost is one more process per env and one pipe hop per step, small beside a Ray round trip
# (docs/benchmarks.md).
class ActorReply(NamedTuple):
    """What an actor hands back for a request that has a reply."""

    message: Optional[bytes]  # the worker's reply, packed as on the pipe; None if it exited
    exitcode: Optional[int]  # set when the worker exited without (further) reply
    where: Optional[Tuple[str, str, int]] = None  # node id, node address, actor pid (start)


class EnvWorkerActor:
    def __init__(
        self,
        spec: WorkerSpec,
        shutdown_timeout_s: float,
        kill_grace_s: float,
    ):
        import ray  # this runs in a Ray worker; the module itself does not need Ray

        logging_util.set_log_level(spec.log_level)
        self.spec = spec._replace(
            owner_tag=f"{processes.owner_prefix(os.getpid())}{secrets.token_hex(4)}/"
            f"{spec.worker_id}.{spec.incarnation}/",
            segment_prefix=None,  # the trainer may be on another node
        )
        self.shutdown_timeout_s = shutdown_timeout_s
        self.kill_grace_s = kill_grace_s
        self.where = (ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), os.getpid())
        self.process, self.conn = start_worker(multiprocessing.get_context("spawn"), self.spec)
        assert self.process.pid is not None  # started
        processes.reaper.watch_worker(self.process.pid)  # NOTE [ No orphans ]

    def start(self) -> ActorReply:
        """Wait for the worker's READY (or its error, or its death)."""
        return self._next_reply()._replace(where=self.where)

    def call(self, data: bytes) -> ActorReply:
        """Forward a request that has a reply (STEP, RESET) and wait for the reply."""
        self.tell(data)
        return self._next_reply()

    def tell(self, data: bytes) -> None:
        """Forward a request that has no reply."""
        try:
            self.conn.send_bytes(data)
        except (OSError, EOFError):
            pass  # the worker is gone: the next reply says how

    def close(self) -> Any:
        """CLOSE the worker, then the ladder; return its timers (or None) and how it went."""
        spec = self.spec
        self.tell(pack(EnvironmentRequest(EnvironmentCommand.CLOSE, spec.worker_id, spec.incarnation)))
        timers: List[Any] = []
        readiness = Readiness()
        ladder = Ladder(self.shutdown_timeout_s, self.kill_grace_s, readiness)
        ladder.add(
            spec.worker_id,
            self.process,
            self.conn,
            f"env worker {spec.worker_id} (pid {self.process.pid})",
            spec.owner_tag,
            EnvironmentCommand.CLOSE,
            on_closed=timers.append,
        )
        try:
            ladder.run()
        finally:
            readiness.close()
        return (timers[0] if timers else None), ladder.outcomes.get(spec.worker_id)

    def _next_reply(self) -> ActorReply:
        """The worker's next message, or its exit code once it exited without one.

        Each wait is bounded; the whole is bounded by the trainer, which kills this actor when
        its deadline passes (startup_timeout_s, step_timeout_s).
        """
        watched: List[Union[Connection, int]] = [self.conn, self.process.sentinel]
        while True:
            ready = wait(watched, timeout=RELAY_WAIT_S)
            if self.conn in ready:
                try:
                    return ActorReply(self.conn.recv_bytes(), None)
                except (EOFError, OSError):
                    watched = [self.process.sentinel]  # gone without a word: wait for its exit
            elif ready:  # it exited; a last message may still be in the pipe
                if self.conn in watched and self.conn.poll():
                    continue
                self.process.join(EXIT_WAIT_S)
                return ActorReply(None, self.process.exitcode)

    def __repr__(self) -> str:  # Ray shows this in its logs and errors
        return f"EnvWorkerActor(worker {self.spec.worker_id}, incarnation {self.spec.incarnation})"

