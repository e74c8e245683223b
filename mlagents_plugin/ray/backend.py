"""RayBackend: the supervised env manager's workers as Ray actors anywhere in a cluster.

Every decision is the manager's (core/manager.py), as for the subprocess backend; RayEnvManager
(manager.py) runs it over this backend. ``RayBackend`` is the transport: an actor hosts
``envs_per_worker`` worker processes (actor.py, NOTE [ Ray actors host worker processes ]);
the trainer's messages to one actor go in one call, whose result is what its workers said
(NOTE [ Hosts ]); the trainer blocks in ``ray.wait`` on every call in flight; a lost actor or
node is the death of its workers; a hung worker is killed by its actor's shutdown ladder.
docs/ray.md says how to run it on a cluster and what fails how.
"""
import math
import os
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Set

from mlagents_envs import logging_util

from mlagents_plugin.core.backend import Backend, BackendSetup, Death, Event, Placed, Reply, WorkerRef, WorkerTimers
from mlagents_plugin.core.errors import WorkerDiedError
from mlagents_plugin.core.lifecycle import WITH_REPLY, Reason
from mlagents_plugin.core.names import command_name, worker_label, zombie_report
from mlagents_plugin.core.placement import Placement
from mlagents_plugin.core.protocol import EnvironmentCommand, WorkerSpec
from mlagents_plugin.ray import local as ray_local
from mlagents_plugin.ray.actor import Deliver, EnvHostActor, HostReport, Item, Launch, Release

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


# NOTE [ Hosts ]
# Each Ray actor hosts ``envs_per_worker`` (k) envs: worker ids h*k .. h*k+k-1 live on host h.
# Every env is still a slot of its own to the manager (its own worker id, incarnation, state,
# deadlines, restarts and health stats), so agent ids, trajectories and stats are as with k = 1.
# What k changes is the transport: the trainer's messages to one host's envs between two waits
# travel in one actor call (``exchange``; sent at the wait, or before it by ``send_now`` when the
# manager has sent the actions of the steps it returns, NOTE [ Actions as steps land ] in
# core/manager.py), and the call answers for all of them at once, so the
# trainer's cost of a Ray round trip (about 1-2 ms of CPU) is paid per call, not per env. A host
# has at most one exchange in flight: Ray runs an actor's calls one at a time anyway, and one at a
# time keeps each env's replies in order. (A release is sent at once, in a call that returns
# nothing, so that a hung env goes down even while the trainer is busy elsewhere; Ray runs it
# after the calls sent before it, and the env counts as departing until an exchange sent after it
# reports on it.) An exchange returns once the envs it asked (that are ready) answered (at once if
# it asked none), or after CALL_WAIT_S, with whatever the host's envs said meanwhile; an env still
# starting, or slow, answers in a later call. Hosts are independent: each host's call returns on
# its own, and its envs get their next actions as soon as the trainer has them (no env waits for
# another host's slowest env). While a host has nothing to send but still owes replies (a starting
# or hung env) or has envs on their way out, the trainer polls it every POLL_WAIT_S. A hung env is
# killed by its actor's shutdown ladder and its neighbours go on; a dead actor (ray.kill, a lost
# node) is a death of all its envs, and the first of them to restart starts a new actor for the
# host.
CALL_WAIT_S = 1.0
POLL_WAIT_S = 0.1
ANSWERS = (EnvironmentCommand.READY, *WITH_REPLY)  # each pays off one reply an env owes


class _Env(NamedTuple):
    """A live env worker incarnation on a host, as the trainer's backend knows it."""

    ref: WorkerRef  # as the manager last described it; its label once the host placed it
    pid: Optional[int] = None  # once its actor reported it
    owed: int = 1  # replies it owes: READY at first, then one per STEP or RESET


class _Host:
    """One actor and the envs it hosts, as the trainer sees them (NOTE [ Hosts ]). Its fields
    change only through its own methods; RayBackend decides when to call them."""

    def __init__(self, index: int):
        self.index = index
        self.actor: Any = None
        self.answered = False  # has the actor answered any call (it is placed)?
        self.envs: Dict[int, _Env] = {}  # by worker id: the live incarnations on this actor
        self.departing: Set[int] = set()  # worker ids whose processes are on their way out
        self.call: Any = None  # the exchange in flight
        self.sent_at = 0.0  # when it was sent
        self._exchanges = 0  # exchanges sent so far; the one in flight is number _exchanges - 1
        self._outbox: List[Item] = []
        self._unreported: Dict[int, int] = {}  # worker id -> first exchange that reports its release
        self._deaths: List[Event] = []  # to report at the next wait (an actor killed here)
        self._applying: List[Any] = []  # calls that return nothing, read so Ray does not report
        # their errors as unhandled (a dead actor is reported by the exchange calls)

    def current(self, worker_id: int, incarnation: int) -> Optional[_Env]:
        env = self.envs.get(worker_id)
        return env if env is not None and env.ref.incarnation == incarnation else None

    # ----------------------------------------------------------------- what the trainer asks

    def launch(self, spec: WorkerSpec, new_actor: Callable[[], Any]) -> None:
        if self.actor is None:
            self.actor, self.answered = new_actor(), False
        label = worker_label(spec.worker_id, None)
        self.envs[spec.worker_id] = _Env(WorkerRef(spec.worker_id, spec.incarnation, label, None))
        self._outbox.append(Launch(spec))

    def deliver(self, worker: WorkerRef, command: EnvironmentCommand, data: bytes) -> None:
        env = self.current(worker.worker_id, worker.incarnation)
        if env is not None:
            self.envs[worker.worker_id] = env._replace(ref=worker, owed=env.owed + (command in WITH_REPLY))
            self._outbox.append(Deliver(worker.worker_id, worker.incarnation, command, data))

    def forget(self, worker_id: int) -> None:
        """The env is released where its actor cannot take it down (the actor is killed next)."""
        del self.envs[worker_id]

    def release(self, worker: WorkerRef, reason: Reason) -> None:
        """Sent now, not at the next wait: a hung worker and its player go down even if the
        trainer does not call again for a while. Ray runs it after the calls sent before it."""
        del self.envs[worker.worker_id]
        release = Release(worker.worker_id, worker.incarnation, reason, worker.last_command)
        items, self._outbox = self._outbox + [release], []
        self._applying.append(self.actor.apply.remote(items))
        self.departing.add(worker.worker_id)
        self._unreported[worker.worker_id] = self._exchanges

    def call_if_due(self, now: float) -> None:
        """One exchange in flight at a time: what it has to send (waiting up to CALL_WAIT_S for
        the replies), or a poll while it owes replies or has envs on their way out."""
        if self.actor is None or self.call is not None:
            return
        if self._outbox:
            self._send(self._outbox, CALL_WAIT_S, now)
            self._outbox = []
        elif self.departing or any(env.owed for env in self.envs.values()):
            self._send([], POLL_WAIT_S, now)

    def _send(self, items: List[Item], wait_s: float, now: float) -> None:
        self.call = self.actor.exchange.remote(items, wait_s)
        self.sent_at = now
        self._exchanges += 1

    def close_call(self, interrupted: bool) -> Any:
        """Ask the actor to close (after what it still has to apply); returns the call."""
        self._drop_calls()
        if self._outbox:
            self._applying.append(self.actor.apply.remote(self._outbox))
            self._outbox = []
        return self.actor.close.remote(interrupted)

    # --------------------------------------------------------------------- what it answers

    def take_call(self) -> Any:
        """The exchange in flight, which has answered (or failed)."""
        call, self.call = self.call, None
        return call

    def received(self, report: HostReport, exchange: Optional[int]) -> List[Event]:
        """What an answer says: where envs run, their replies and deaths, which are still
        departing; ``exchange``: the number of the exchange that reported (None: the close)."""
        self.answered = True
        events: List[Event] = []
        node_id, address, actor_pid = report.where
        for (worker_id, incarnation), pid in report.pids.items():
            env = self.current(worker_id, incarnation)
            if env is not None:
                placement = Placement(worker_id, pid, address, node_id, actor_pid)
                ref = env.ref._replace(label=worker_label(worker_id, pid, placement))
                self.envs[worker_id] = env._replace(ref=ref, pid=pid)
                events.append(Placed(worker_id, incarnation, placement))
        self._unreported = {
            w: first for w, first in self._unreported.items() if exchange is not None and exchange < first
        }
        self.departing = set(report.departing) | set(self._unreported)
        for event in report.events:
            env = self.current(event.worker_id, event.incarnation)
            if env is None:
                continue  # from an incarnation released meanwhile
            owed = env.owed - 1 if event.response is not None and event.response.cmd in ANSWERS else 0
            self.envs[event.worker_id] = env._replace(owed=max(0, owed))  # else it is ending
            if event.response is not None:
                events.append(Reply(event.worker_id, event.incarnation, event.response))
            else:
                assert event.error is not None
                events.append(Death(event.worker_id, event.incarnation, event.error))
        return events

    @property
    def last_exchange(self) -> int:
        return self._exchanges - 1

    def lose(self, message: Callable[[_Env], str]) -> List[int]:
        """Let go of the actor (killed, which does nothing to one that is dead already): each
        live env dies with ``message`` (reported at the next wait). Returns every worker id it
        had, live or departing."""
        if self.actor is not None:
            ray.kill(self.actor, no_restart=True)
        self._deaths += [
            Death(w, env.ref.incarnation, WorkerDiedError(message(env), w, env.pid)) for w, env in self.envs.items()
        ]
        had = [*self.envs, *self.departing]
        self._drop_calls()
        self.actor, self.envs, self._outbox, self.departing, self._unreported = None, {}, [], set(), {}
        return had

    def closed(self) -> None:
        """The actor closed: its workers are reaped; free its resources."""
        self.read_applied(timeout=1.0)  # Ray ran them before the close
        ray.kill(self.actor, no_restart=True)
        self.actor = None

    def take_deaths(self) -> List[Event]:
        deaths, self._deaths = self._deaths, []
        return deaths

    def read_applied(self, timeout: float = 0.0) -> None:
        if not self._applying:
            return
        done, self._applying = ray.wait(self._applying, num_returns=len(self._applying), timeout=timeout)
        for ref in done:
            try:
                ray.get(ref)
            except RayActorError:
                pass  # the actor's death is reported by its exchange
            except RayError as e:
                logger.warning(f"A call to the Ray actor of env workers {sorted(self.envs)} failed: {_first_line(e)}")

    def _drop_calls(self) -> None:
        """Forget the actor's calls; what they fail with is read later (see ``read_applied``)."""
        if self.call is not None:
            self._applying.append(self.call)
        self.call = None


class RayBackend(Backend):
    WORKERS_ON_OTHER_MACHINES = True

    def __init__(self, setup: BackendSetup):
        settings = setup.settings
        ray_settings = settings.ray
        self._settings = settings
        self._pickled_env_factory = setup.pickled_env_factory
        self._k = settings.envs_per_worker
        self._clock = setup.clock
        self._hosts = [_Host(h) for h in range(math.ceil(setup.n_env / self._k))]
        self._outcomes: Dict[int, str] = {}
        self._timers: List[WorkerTimers] = []  # of workers that closed, reported by their actors
        # An actor that answered before but not this call within this long is wedged (its node
        # frozen, a worker stopped halfway through a reply it is reading): it is killed.
        self._call_bound_s = CALL_WAIT_S + settings.shutdown_timeout_s + settings.kill_grace_s + CLOSE_SLACK_S
        # A local Ray gets what the actors ask for: on one machine they share the cores
        # anyway, as subprocess workers do, and none may wait for a CPU or a resource.
        n_hosts = len(self._hosts)
        self._leave_ray = ray_local.connect(
            ray_settings.address,
            num_cpus=math.ceil(max(os.cpu_count() or 1, n_hosts * ray_settings.num_cpus_per_worker)),
            resources={k: v * n_hosts for k, v in ray_settings.resources.items()},
        )  # NOTE [ Sharing Ray in one process ]
        self._actor_class = ray.remote(EnvHostActor).options(
            num_cpus=ray_settings.num_cpus_per_worker,
            resources=dict(ray_settings.resources),
            runtime_env=ray_settings.runtime_env,
            scheduling_strategy=ray_settings.scheduling_strategy,
            max_restarts=0,  # restarts are the manager's, under its policy
            max_task_retries=0,
        )

    def _host(self, worker_id: int) -> _Host:
        return self._hosts[worker_id // self._k]

    def launch(self, spec: WorkerSpec) -> None:  # placed when its actor reports
        self._host(spec.worker_id).launch(
            spec, lambda: self._actor_class.remote(self._settings, self._pickled_env_factory, self._k)
        )

    def deliver(self, worker: WorkerRef, command: EnvironmentCommand, data: bytes) -> None:
        self._host(worker.worker_id).deliver(worker, command, data)

    def release(self, worker: WorkerRef, reason: Reason) -> None:
        """The worker goes down through its actor's shutdown ladder. An actor that never
        answered (not placed, or still starting) could not run it: it is killed, and the
        envs it hosts with it."""
        host = self._host(worker.worker_id)
        if host.current(worker.worker_id, worker.incarnation) is None:
            return
        if not host.answered:
            logger.info(f"{worker.label}: its Ray actor has not started; killing it.")
            host.forget(worker.worker_id)
            self._outcomes[worker.worker_id] = "was killed with its Ray actor"
            self._kill_host(host, f"its Ray actor was killed before it started, with {worker.label}")
            return
        if reason is Reason.HUNG:  # the actor's ladder reports it too, in the actor's log
            why = f"did not answer {command_name(worker.last_command)}"
            logger.warning(zombie_report(worker.label, why, worker.last_command, "its Ray actor is killing it"))
        host.release(worker, reason)

    def departing(self, worker_id: int) -> bool:
        return worker_id in self._host(worker_id).departing

    def _kill_host(self, host: _Host, why: str) -> None:
        """Kill the host's actor; its live envs die (reported at the next wait)."""
        self._lose_host(host, lambda env: f"{env.ref.label}: {why}.", "was killed with its Ray actor")

    def _lose_host(self, host: _Host, message: Callable[[_Env], str], outcome: str) -> None:
        """The one place where a host's actor is let go of, by us (killed) or by Ray (it died,
        a call failed): its live envs die, its departing ones ended with ``outcome``."""
        for worker_id in host.lose(message):
            self._outcomes[worker_id] = outcome

    def close(self, interrupted: bool) -> List[WorkerTimers]:
        """Every actor takes its workers down with its own ladder, bounded by shutdown_timeout_s
        + kill_grace_s + CLOSE_SLACK_S (at once when ``interrupted``); an actor that does not
        answer by then is killed. Then let go of Ray."""
        if not ray.is_initialized():
            # Ray's own exit handler ran first (interpreter exit): Ray killed the actors the
            # driver owned, and each actor's reaper took its workers and players down
            # (NOTE [ No orphans ]).
            logger.info("Ray was shut down before the env manager: its actors went with it.")
            self._leave_ray()
            return []
        try:
            closing: Dict[Any, _Host] = {}
            for host in self._hosts:
                if host.actor is None:
                    continue
                if not host.answered or interrupted:
                    self._kill_host(host, "closed")
                    continue
                closing[host.close_call(interrupted)] = host
            # The actor's close: its ladder (shutdown_timeout_s + kill_grace_s + a moment), then
            # what its workers left (up to 2 x kill_grace_s); after an exchange in flight.
            kill_grace_s = self._settings.kill_grace_s
            deadline = self._clock() + self._call_bound_s + 2 * kill_grace_s + CLOSE_SLACK_S
            while closing:
                ready, _ = ray.wait(list(closing), num_returns=len(closing), timeout=max(0.0, deadline - self._clock()))
                for ref in ready:
                    self._finish(closing.pop(ref), ref)
                if self._clock() >= deadline:
                    break
            for host in closing.values():
                logger.warning(f"Ray actor of env workers {sorted(host.departing)} did not close in time; killing it.")
                self._kill_host(host, "did not close in time")
            read_until = self._clock() + kill_grace_s  # what killed actors' calls failed with
            for host in self._hosts:
                host.read_applied(timeout=max(0.0, read_until - self._clock()))
        finally:
            self._leave_ray()
        timers, self._timers = self._timers, []
        return timers

    def _finish(self, host: _Host, ref: Any) -> None:
        try:
            self._absorb(host, ray.get(ref), None)
        except RayError as e:
            for worker_id in host.departing:
                self._outcomes[worker_id] = f"was lost with its actor ({_first_line(e)})"
        host.closed()

    def outcome(self, worker_id: int) -> str:
        return self._outcomes.get(worker_id, "was not running")

    def startup_hint(self) -> str:
        return (
            " (or its Ray actor was never placed: check that the cluster has the resources "
            "env_manager.ray asks for, with `ray status`)"
        )

    # ------------------------------------------------------------------------- events

    def send_now(self) -> None:
        """Each host whose actor has no call in flight sends what it has now (NOTE [ Hosts ])."""
        for host in self._hosts:
            host.call_if_due(self._clock())

    def wait(self, timeout: float) -> List[Event]:
        """Send each host what it has (NOTE [ Hosts ]), then block in ``ray.wait`` on every
        call in flight (no polling on this side)."""
        events: List[Event] = list(self._timers)
        self._timers = []
        for host in self._hosts:
            events += host.take_deaths()
            host.read_applied()
            host.call_if_due(self._clock())
        if events:
            return events
        calls = {host.call: host for host in self._hosts if host.call is not None}
        if not calls:
            time.sleep(timeout)
            return []
        ready, rest = ray.wait(list(calls), num_returns=1, timeout=timeout)
        if ready and rest:
            ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        for ref in ready:
            events += self._receive(calls[ref])
        return events

    def _receive(self, host: _Host) -> List[Event]:
        try:
            report: HostReport = ray.get(host.take_call())
        except RayError as e:
            what = "died" if isinstance(e, RayActorError) else f"failed ({type(e).__name__})"
            ray_says = _first_line(e)
            self._lose_host(
                host,
                lambda env: (
                    f"{env.ref.label}: its Ray actor {what} (last command: {command_name(env.ref.last_command)}); "
                    f"the node may have been lost. Ray says: {ray_says}"
                ),
                f"was lost with its actor ({ray_says})",
            )
            return host.take_deaths()
        return self._absorb(host, report, host.last_exchange)

    def next_deadline(self) -> Optional[float]:
        """When the oldest call of an actor that answered before becomes overdue."""
        sent = [host.sent_at for host in self._hosts if host.call is not None and host.answered]
        return min(sent) + self._call_bound_s if sent else None

    def advance(self) -> None:
        """Kill actors whose call is overdue: their envs die (and restart within quota)."""
        now = self._clock()
        for host in self._hosts:
            if host.call is not None and host.answered and now >= host.sent_at + self._call_bound_s:
                why = f"its Ray actor did not answer a call within {self._call_bound_s:.0f} s and was killed"
                logger.error(f"Ray actor of env workers {sorted(host.envs)}: {why}.")
                self._kill_host(host, why)

    def _absorb(self, host: _Host, report: HostReport, exchange: Optional[int]) -> List[Event]:
        """A host's answer: its events, and the outcomes and timers of its closed workers."""
        self._outcomes.update(report.outcomes)
        self._timers += [WorkerTimers(root) for root in report.timers]
        return host.received(report, exchange)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
