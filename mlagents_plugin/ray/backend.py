"""RayEnvManager: the same supervised env manager, its workers Ray actors anywhere in a cluster.

Every decision is the manager's (core/manager.py), as for the subprocess backend. ``RayBackend``
here is the transport: a worker incarnation is an actor (actor.py, NOTE [ Ray actors host a
worker process ]); a request is an actor call whose result is the worker's reply; the trainer
blocks in ``ray.wait`` on every call in flight; a lost actor or node is a worker death; a hung
worker is killed with ``ray.kill``. docs/ray.md says how to run it on a cluster and what fails
how.
"""
import math
import os
import time
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from mlagents.trainers.settings import RunOptions
from mlagents_envs import logging_util

from mlagents_plugin.core.backend import Backend, BackendSetup, Death, Event, Reply
from mlagents_plugin.core.errors import WorkerDiedError
from mlagents_plugin.core.lifecycle import WITH_REPLY, Reason, Slot
from mlagents_plugin.core.manager import EnvFactory, SupervisedManagerBase, merge_worker_timers
from mlagents_plugin.core.names import Placement, command_name, zombie_report
from mlagents_plugin.core.protocol import EnvironmentCommand, WorkerSpec, unpack_response
from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.local.processes import describe_exit
from mlagents_plugin.ray import local as ray_local
from mlagents_plugin.ray.actor import ActorReply, EnvWorkerActor

INSTALL_HINT = (
    "The Ray backend needs Ray 2.60.0: pip install ray==2.60.0 (from a checkout of "
    "mlagents-plugin: pip install -e '.[ray]')."
)
try:
    import ray
    from ray.exceptions import RayActorError, RayError
except ImportError as e:  # pragma: no cover - exercised by a subprocess test
    raise ImportError(INSTALL_HINT) from e

logger = logging_util.get_logger(__name__)

# Slack on top of shutdown_timeout_s + kill_grace_s for an actor's own close ladder to answer.
CLOSE_SLACK_S = 5.0


class RayEnvManager(SupervisedManagerBase):
    def __init__(
        self,
        env_factory: EnvFactory,
        run_options: RunOptions,
        n_env: int = 1,
        settings: Optional[EnvManagerSettings] = None,
    ):
        super().__init__(env_factory, run_options, n_env, settings, RayBackend)


class _ActorDeparture(NamedTuple):
    """An actor on its way out: its close call, or after ray.kill, a probe that fails once it is dead."""

    actor: Any
    ref: Any
    deadline: float
    killed: bool
    label: str
    last_command: Optional[EnvironmentCommand]
    dropped: List[Any]  # its calls whose replies no longer matter; read at the end, so Ray
    # does not report their errors as unhandled


class RayBackend(Backend):
    WORKERS_ON_OTHER_MACHINES = True

    def __init__(self, setup: BackendSetup):
        settings = setup.settings
        ray_settings = settings.ray
        self._shutdown_timeout_s = settings.shutdown_timeout_s
        self._kill_grace_s = settings.kill_grace_s
        self._clock = setup.clock
        self._actors: Dict[int, Any] = {}  # by worker id: the live incarnations' actors
        self._in_flight: Dict[Any, Tuple[Slot, int]] = {}  # call -> slot, incarnation
        self._departures: Dict[int, _ActorDeparture] = {}
        self._outcomes: Dict[int, str] = {}
        # A local Ray gets what the workers ask for: on one machine they share the cores
        # anyway, as subprocess workers do, and none may wait for a CPU or a resource.
        n_env = setup.n_env
        self._leave_ray = ray_local.connect(
            ray_settings.address,
            num_cpus=math.ceil(max(os.cpu_count() or 1, n_env * ray_settings.num_cpus_per_worker)),
            resources={k: v * n_env for k, v in ray_settings.resources.items()},
        )  # NOTE [ Sharing Ray in one process ]
        self._actor_class = ray.remote(EnvWorkerActor).options(
            num_cpus=ray_settings.num_cpus_per_worker,
            resources=dict(ray_settings.resources),
            runtime_env=ray_settings.runtime_env,
            scheduling_strategy=ray_settings.scheduling_strategy,
            max_restarts=0,  # restarts are the manager's, under its policy
            max_task_retries=0,
        )

    def launch(self, slot: Slot, spec: WorkerSpec) -> None:
        # The actor fills in its own tags: NOTE [ Ray actors host a worker process ].
        actor = self._actor_class.remote(spec, self._shutdown_timeout_s, self._kill_grace_s)
        self._actors[slot.worker_id] = actor
        # Ray's stubs type an actor's methods as the class's plain functions, without .remote
        self._in_flight[actor.start.remote()] = (slot, slot.incarnation)  # type: ignore[attr-defined]

    def deliver(self, slot: Slot, command: EnvironmentCommand, data: bytes) -> None:
        # Ray runs one caller's calls on an actor in the order they were made. Calls without
        # a reply are kept in flight too: their failure is read, not left unhandled.
        actor = self._actors.get(slot.worker_id)
        if actor is None:
            return
        method = actor.call if command in WITH_REPLY else actor.tell
        self._in_flight[method.remote(data)] = (slot, slot.incarnation)

    def release(self, slot: Slot, reason: Reason) -> None:
        """A hung worker's actor is killed at once, as is one that has not finished starting
        (a close call would wait for the start); any other is asked to close its worker."""
        actor = self._actors.pop(slot.worker_id)
        label, placed = slot.label, slot.placement is not None
        dropped = [ref for ref, (owner, _) in self._in_flight.items() if owner is slot]
        for ref in dropped:
            del self._in_flight[ref]
        last_command = slot.awaiting or slot.last_command
        if reason is Reason.HUNG:
            self._kill(slot.worker_id, actor, label, last_command, "did not answer", dropped)
        elif reason is Reason.INTERRUPTED:
            why = "was killed at once on a second interrupt"
            self._kill(slot.worker_id, actor, label, last_command, why, dropped)
        elif reason is Reason.BUILDING or not placed:
            logger.info(f"{label} has not finished starting; killing its Ray actor.")
            self._kill(slot.worker_id, actor, label, last_command, None, dropped)
        else:
            deadline = self._shutdown_timeout_s + self._kill_grace_s + CLOSE_SLACK_S
            self._departures[slot.worker_id] = _ActorDeparture(
                actor, actor.close.remote(), self._clock() + deadline, False, label, last_command, dropped
            )

    def _kill(
        self,
        worker_id: int,
        actor: Any,
        label: str,
        last_command: Optional[EnvironmentCommand],
        why: Optional[str],
        dropped: List[Any],
    ) -> None:
        """Kill the actor; ``why`` it was needed goes into a zombie-worker report."""
        if why is not None:
            logger.warning(zombie_report(label, why, last_command, "killing its Ray actor"))
        ray.kill(actor, no_restart=True)
        probe = actor.start.remote()  # fails as soon as the actor is dead
        self._departures[worker_id] = _ActorDeparture(
            actor, probe, self._clock() + self._kill_grace_s, True, label, last_command, dropped + [probe]
        )

    def departing(self, worker_id: int) -> bool:
        return worker_id in self._departures

    def close(self, interrupted: bool) -> None:
        """Every departure to its end (each actor runs its own ladder), killing what does not
        answer within shutdown_timeout_s + kill_grace_s + CLOSE_SLACK_S, or at once when
        ``interrupted``; then let go of Ray."""
        if not ray.is_initialized():
            # Ray's own exit handler ran first (interpreter exit): Ray killed the actors the
            # driver owned, and each actor's reaper took its worker and player down
            # (NOTE [ No orphans ]).
            logger.info("Ray was shut down before the env manager: its actors went with it.")
            self._leave_ray()
            return
        try:
            if interrupted:
                for worker_id, departure in list(self._departures.items()):
                    if not departure.killed:
                        self._kill(
                            worker_id, departure.actor, departure.label, departure.last_command,
                            "was killed at once on a second interrupt", departure.dropped,
                        )
            while self._departures:
                self.wait(max(0.0, (self.next_deadline() or 0.0) - self._clock()))
                self.advance()
        finally:
            if not self._departures:
                self._leave_ray()

    def outcome(self, worker_id: int) -> str:
        return self._outcomes.get(worker_id, "was not running")

    def startup_hint(self) -> str:
        return (
            " (or its Ray actor was never placed: check that the cluster has the resources "
            "env_manager.ray asks for, with `ray status`)"
        )

    # ------------------------------------------------------------------------- events

    def wait(self, timeout: float) -> List[Event]:
        """Block in ``ray.wait`` on every call in flight and every departure (no polling)."""
        refs = list(self._in_flight) + [d.ref for d in self._departures.values()]
        if not refs:
            time.sleep(timeout)
            return []
        ready, rest = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready and rest:
            ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        events: List[Event] = []
        for ref in ready:
            if ref in self._in_flight:
                slot, incarnation = self._in_flight.pop(ref)
                if slot.worker_id in self._actors and slot.incarnation == incarnation:
                    events += self._receive(slot, ref)
        return events

    def _receive(self, slot: Slot, ref: Any) -> List[Event]:
        try:
            reply: Optional[ActorReply] = ray.get(ref)
        except RayError as e:
            what = "died" if isinstance(e, RayActorError) else f"failed ({type(e).__name__})"
            error = WorkerDiedError(
                f"{slot.label}: its Ray actor {what} (last command: {command_name(slot.last_command)}); "
                f"the node may have been lost. Ray says: {_first_line(e)}",
                slot.worker_id,
                slot.pid,
            )
            return [Death(slot, slot.incarnation, error)]
        if reply is None:
            return []  # a call without a reply went through
        if reply.where is not None:
            node_id, address, actor_pid = reply.where
            slot.placement = Placement(slot.worker_id, slot.pid, address, node_id, actor_pid)
        if reply.message is not None:
            return [Reply(slot, slot.incarnation, unpack_response(reply.message))]
        if reply.exitcode is not None:
            error = WorkerDiedError(
                f"{slot.label} {describe_exit(reply.exitcode)} "
                f"(last command: {command_name(slot.last_command)}).",
                slot.worker_id,
                slot.pid,
                reply.exitcode,
            )
            return [Death(slot, slot.incarnation, error)]
        return []

    def next_deadline(self) -> Optional[float]:
        return min((d.deadline for d in self._departures.values()), default=None)

    def advance(self) -> None:
        """Finish departures that are done; kill actors whose close is overdue."""
        now = self._clock()
        for worker_id, departure in list(self._departures.items()):
            done, _ = ray.wait([departure.ref], timeout=0)
            if done:
                del self._departures[worker_id]
                self._finish(worker_id, departure)
            elif now >= departure.deadline:
                del self._departures[worker_id]
                if departure.killed:
                    logger.error(
                        f"{departure.label}: its Ray actor was killed but Ray did not confirm "
                        f"it is gone within kill_grace_s={self._kill_grace_s} s."
                    )
                    self._outcomes[worker_id] = "was killed (not confirmed)"
                else:
                    self._kill(
                        worker_id, departure.actor, departure.label, departure.last_command,
                        "did not close within shutdown_timeout_s + kill_grace_s", departure.dropped,
                    )

    def _finish(self, worker_id: int, departure: _ActorDeparture) -> None:
        ready = (
            ray.wait(departure.dropped, num_returns=len(departure.dropped), timeout=0)[0] if departure.dropped else []
        )
        for ref in ready:
            try:
                ray.get(ref)
            except RayError:
                pass  # the actor was retired: what it failed with no longer matters
        if departure.killed:
            self._outcomes[worker_id] = "was killed with ray.kill"
            return
        try:
            timers, outcome = ray.get(departure.ref)
            merge_worker_timers(timers)
            self._outcomes[worker_id] = outcome or "exited"
        except RayError as e:
            self._outcomes[worker_id] = f"was lost with its actor ({_first_line(e)})"
        ray.kill(departure.actor, no_restart=True)  # its worker is reaped: free its resources


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
