"""RayBackend: the supervised env manager's workers as Ray actors anywhere in a cluster.

Every decision is core's (core/supervision.py), as for the subprocess backend; RayEnvManager
(manager.py) runs it over this backend. ``RayBackend`` is the transport: an actor hosts
``envs_per_worker`` worker processes (actor.py, NOTE [ Ray actors host worker processes ]);
the trainer's messages to one actor go in one call, whose result is what its workers said
(NOTE [ Hosts ]); the trainer blocks in ``ray.wait`` on every call out; a lost actor or
node is the death of its workers; a hung worker is killed by its actor's shutdown ladder.
docs/ray.md says how to run it on a cluster and what fails how. About 400 lines: the hosts'
records have one writer, this class, so their calls, answers and losses stay together.
"""
import math
import os
import time
from typing import Any, Callable, Dict, FrozenSet, List, NamedTuple, Optional, Sequence, Set

import attr
from mlagents_envs import logging_util

from mlagents_plugin.core.backend import (
    Backend,
    BackendSetup,
    Death,
    Event,
    Message,
    Placed,
    Reply,
    WorkerRef,
    WorkerTimers,
)
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
# What k changes is the transport: the trainer's messages to one host's envs travel in one actor
# call (``exchange``). What one ``deliver`` gives a host goes at once if no call of the host is in
# flight, else in the next call, sent at the first wait after the one in flight returned (the
# manager delivers what it has before each wait, and the actions of the steps it returns before it
# returns them: NOTE [ Actions as steps land ] in core/stepper.py). The call answers for all of
# them at once, so the trainer's cost of a Ray round trip (about 1-2 ms of CPU) is paid per call,
# not per env. A host has at most one exchange in flight: Ray runs an actor's calls one at a time
# anyway, and one at a time keeps each env's replies in order. (A release is sent at once, in a
# call that returns nothing, so that a hung env goes down even while the trainer is busy elsewhere;
# Ray runs it after the calls sent before it, and the env counts as departing until an exchange
# sent after it reports on it.) An exchange returns once the envs it asked (that are ready)
# answered (at once if it asked none), or after CALL_WAIT_S, with whatever the host's envs said
# meanwhile; an env still starting, or slow, answers in a later call. Hosts are independent: each
# host's call returns on its own, and its envs get their next actions as soon as the trainer has
# them (no env waits for another host's slowest env).
# Polling remains here, and only here: an actor answers only calls, so while a host has nothing to
# send but still owes replies (a starting or hung env) or has envs on their way out, the trainer
# sends it an empty exchange that waits up to POLL_WAIT_S in the actor (a long poll: it returns as
# soon as the actor has something to report). It is short because what the trainer has for that
# host meanwhile waits for it to return.
# A hung env is killed by its actor's shutdown ladder and its neighbours go on; a dead actor
# (ray.kill, a lost node) is a death of all its envs, and the first of them to restart starts a new
# actor for the host. A ``_Host`` is a record that RayBackend alone writes; every answer is read in
# one place (``RayBackend._answer``), where a failed call (a ``RayError``) becomes its envs' deaths.
CALL_WAIT_S = 1.0
POLL_WAIT_S = 0.1

# NOTE [ Answered is not fetched ]
# A call has answered once its actor returned, wherever its result is. A result too big to travel
# inline (a report of k envs' observations over Ray's 100 KiB) stays in the object store of the
# actor's node, and ``ray.wait`` with its default ``fetch_local=True`` counts it ready only once it
# has been copied to the trainer's node: with ``timeout=0`` (a pump whose deadline has passed)
# never. After a trainer update longer than an exchange's bound, a finished call on another node
# was then taken for a wedged actor, which was killed with its envs. So every wait asks whether a
# call has answered (``fetch_local=False``), and ``_answer`` fetches its result, bounded.
ANSWERS = (EnvironmentCommand.READY, *WITH_REPLY)  # each pays off one reply an env owes


class _Env(NamedTuple):
    """A live env worker incarnation on a host, as the trainer's backend knows it."""

    ref: WorkerRef  # as the manager last described it; its label once the host placed it
    pid: Optional[int] = None  # once its actor reported it
    owed: int = 1  # replies it owes: READY at first, then one per STEP or RESET


@attr.s(auto_attribs=True, slots=True)
class _Host:
    """One actor and the envs it hosts, as the trainer sees them (NOTE [ Hosts ]): a record that
    RayBackend alone writes. A host whose actor is let go of starts again as a new record."""

    actor: Any = None
    answered: bool = False  # has the actor answered any call (it is placed)?
    envs: Dict[int, _Env] = attr.Factory(dict)  # by worker id: the live incarnations on this actor
    departing: Set[int] = attr.Factory(set)  # worker ids whose processes are on their way out
    outbox: List[Item] = attr.Factory(list)  # for the next exchange
    call: Any = None  # the exchange in flight
    exchanges: int = 0  # exchanges sent so far; the one in flight is number exchanges - 1
    unreported: Dict[int, int] = attr.Factory(dict)  # worker id -> first exchange that reports its release

    def current(self, worker_id: int, incarnation: int) -> Optional[_Env]:
        env = self.envs.get(worker_id)
        return env if env is not None and env.ref.incarnation == incarnation else None


class _Call(NamedTuple):
    """A call whose answer is not read yet."""

    host: int  # the index of the host it went to
    actor: Any  # the actor it went to: an answer of one the host no longer has is dropped
    sent_at: float
    exchange: Optional[int]  # an exchange's number; None: an ``apply`` or the ``close``


class HostView(NamedTuple):
    envs: FrozenSet[int]  # worker ids of its live envs
    calling: bool  # whether an exchange of it is in flight


class RayBackend(Backend):
    WORKERS_ON_OTHER_MACHINES = True

    def __init__(self, setup: BackendSetup):
        settings = setup.settings
        ray_settings = settings.ray
        self._settings = settings
        self._pickled_env_factory = setup.pickled_env_factory
        self._k = settings.envs_per_worker
        self._clock = setup.clock
        self._hosts = [_Host() for _ in range(math.ceil(setup.n_env / self._k))]
        self._calls: Dict[Any, _Call] = {}  # by Ray's reference: every call whose answer is not read yet
        self._events: List[Event] = []  # for the next wait
        self._outcomes: Dict[int, str] = {}
        # An actor that answered before but not this call within this long is wedged (its node
        # frozen, a worker stopped halfway through a reply it is reading): it is killed.
        self._call_bound_s = CALL_WAIT_S + settings.shutdown_timeout_s + settings.kill_grace_s + CLOSE_SLACK_S
        # A local Ray gets what the actors ask for: on one machine they share the cores
        # anyway, as subprocess workers do, and none may wait for a CPU or a resource.
        n_hosts = len(self._hosts)
        self._leave_ray = ray_local.connect(
            ray_settings.address,
            num_cpus=math.ceil(max(os.cpu_count() or 1, n_hosts * ray_settings.num_cpus_per_worker)),
            resources={k: math.ceil(v * n_hosts) for k, v in ray_settings.resources.items()},  # Ray: whole
        )  # NOTE [ Sharing Ray in one process ]
        try:
            self._actor_class = ray.remote(EnvHostActor).options(
                num_cpus=ray_settings.num_cpus_per_worker,
                resources=dict(ray_settings.resources),
                runtime_env=ray_settings.runtime_env,
                scheduling_strategy=ray_settings.scheduling_strategy,
                max_restarts=0,  # restarts are the manager's, under its policy
                max_task_retries=0,
            )
        except BaseException:  # no backend, so nobody would close it: let go of Ray now
            self._leave_ray()
            raise

    @property
    def hosts(self) -> List[HostView]:  # read-only, for tests and tools
        return [HostView(frozenset(host.envs), host.call is not None) for host in self._hosts]

    def launch(self, spec: WorkerSpec) -> None:  # placed when its actor reports
        host = self._hosts[spec.worker_id // self._k]
        if host.actor is None:
            host.actor = self._actor_class.remote(self._settings, self._pickled_env_factory, self._k)
        label = worker_label(spec.worker_id, None)
        host.envs[spec.worker_id] = _Env(WorkerRef(spec.worker_id, spec.incarnation, label, None))
        host.outbox.append(Launch(spec))

    def deliver(self, messages: Sequence[Message]) -> None:
        """Into each host's outbox; then each host with something to send and no call in flight
        sends it now, what waited behind a call that has returned too (NOTE [ Hosts ])."""
        for worker, command, data in messages:
            host = self._hosts[worker.worker_id // self._k]
            env = host.current(worker.worker_id, worker.incarnation)
            if env is not None:
                host.envs[worker.worker_id] = env._replace(ref=worker, owed=env.owed + (command in WITH_REPLY))
                host.outbox.append(Deliver(worker.worker_id, worker.incarnation, command, data))
        for index, host in enumerate(self._hosts):
            if host.outbox:
                self._call_if_due(index)

    def release(self, worker: WorkerRef, reason: Reason) -> None:
        """The worker goes down through its actor's shutdown ladder, in a call sent now
        (NOTE [ Hosts ]). An actor that never answered (not placed, or still starting) could not
        run it: it is killed, and the envs it hosts with it."""
        index = worker.worker_id // self._k
        host = self._hosts[index]
        if host.current(worker.worker_id, worker.incarnation) is None:
            return
        del host.envs[worker.worker_id]
        if not host.answered:
            logger.info(f"{worker.label}: its Ray actor has not started; killing it.")
            self._outcomes[worker.worker_id] = "was killed with its Ray actor"
            self._kill_host(index, f"its Ray actor was killed before it started, with {worker.label}")
            return
        if reason is Reason.HUNG:  # the actor's ladder reports it too, in the actor's log
            why = f"did not answer {command_name(worker.last_command)}"
            logger.warning(zombie_report(worker.label, why, worker.last_command, "its Ray actor is killing it"))
        release = Release(worker.worker_id, worker.incarnation, reason, worker.last_command)
        items, host.outbox = [*host.outbox, release], []
        self._sent(index, host.actor.apply.remote(items))  # Ray runs it after the calls sent before it
        host.departing.add(worker.worker_id)
        host.unreported[worker.worker_id] = host.exchanges

    def departing(self, worker_id: int) -> bool:
        return worker_id in self._hosts[worker_id // self._k].departing

    def _call_if_due(self, index: int) -> None:
        """One exchange in flight at a time: what the host has to send (waiting up to CALL_WAIT_S
        for the replies), or a poll while it owes replies or has envs departing (NOTE [ Hosts ])."""
        host = self._hosts[index]
        if host.actor is None or host.call is not None:
            return
        if host.outbox:
            items, wait_s, host.outbox = host.outbox, CALL_WAIT_S, []
        elif host.departing or any(env.owed for env in host.envs.values()):
            items, wait_s = [], POLL_WAIT_S
        else:
            return
        host.call = self._sent(index, host.actor.exchange.remote(items, wait_s), host.exchanges)
        host.exchanges += 1

    def _sent(self, index: int, ref: Any, exchange: Optional[int] = None) -> Any:
        """Keep a call to host ``index``'s actor until its answer is read (``_answer``)."""
        self._calls[ref] = _Call(index, self._hosts[index].actor, self._clock(), exchange)
        return ref

    def _kill_host(self, index: int, why: str) -> None:
        """Kill the host's actor; its live envs die (reported at the next wait)."""
        self._lose_host(index, lambda env: f"{env.ref.label}: {why}.", "was killed with its Ray actor")

    def _lose_host(self, index: int, message: Callable[[_Env], str], outcome: str) -> None:
        """The one place where a host's actor is let go of, by us (killed) or by Ray (a call
        failed): its live envs die with ``message``, its departing ones ended with ``outcome``."""
        host = self._hosts[index]
        if host.actor is not None:
            ray.kill(host.actor, no_restart=True)  # does nothing to one that is dead already
        self._events += [
            Death(w, env.ref.incarnation, WorkerDiedError(message(env), w, env.pid)) for w, env in host.envs.items()
        ]
        for worker_id in [*host.envs, *host.departing]:
            self._outcomes[worker_id] = outcome
        self._hosts[index] = _Host()

    def close(self, interrupted: bool) -> List[WorkerTimers]:
        """Every actor takes its workers down with its own ladder, bounded by shutdown_timeout_s
        + kill_grace_s + CLOSE_SLACK_S (at once when ``interrupted``); an actor that does not
        answer by then is killed. Then let go of Ray."""
        if not ray.is_initialized():
            # Ray's own exit handler ran first (interpreter exit): Ray killed the actors the driver
            # owned, and each actor's reaper took its workers and players down (NOTE [ No orphans ]).
            logger.info("Ray was shut down before the env manager: its actors went with it.")
            self._leave_ray()
            return []
        try:
            closing: Dict[Any, int] = {}  # each close call, by the index of its host
            for index, host in enumerate(self._hosts):
                if host.actor is None:
                    continue
                if not host.answered or interrupted:
                    self._kill_host(index, "closed")
                    continue
                host.call = None  # read before the close's answer, as the actor's other calls
                if host.outbox:
                    items, host.outbox = host.outbox, []
                    self._sent(index, host.actor.apply.remote(items))
                closing[self._sent(index, host.actor.close.remote(interrupted))] = index
            # The actor's close: its ladder (shutdown_timeout_s + kill_grace_s + a moment), then
            # what its workers left (up to 2 x kill_grace_s); after an exchange in flight.
            kill_grace_s = self._settings.kill_grace_s
            deadline = self._clock() + self._call_bound_s + 2 * kill_grace_s + CLOSE_SLACK_S
            while closing:
                ready, _ = ray.wait(
                    list(closing), num_returns=len(closing), timeout=max(0.0, deadline - self._clock()),
                    fetch_local=False,
                )
                for ref in ready:
                    self._closed(closing.pop(ref), ref)
                if self._clock() >= deadline:
                    break
            for index in closing.values():
                departing = sorted(self._hosts[index].departing)
                logger.warning(f"Ray actor of env workers {departing} did not close in time; killing it.")
                self._kill_host(index, "did not close in time")
            self._read(list(self._calls), kill_grace_s)  # what the killed actors' calls failed with
        finally:
            self._leave_ray()
        timers = [event for event in self._events if isinstance(event, WorkerTimers)]
        self._events = []
        return timers

    def _closed(self, index: int, close: Any) -> None:
        """A host's close answered: the answers of its calls before it (Ray ran them first),
        then the close's; then its actor goes (its workers are reaped: free its resources)."""
        self._read([ref for ref, call in self._calls.items() if call.host == index and ref != close], timeout=1.0)
        self._answer(close)
        actor = self._hosts[index].actor
        if actor is not None:  # else lost: the close failed
            ray.kill(actor, no_restart=True)
            self._hosts[index] = _Host()

    def outcome(self, worker_id: int) -> str:
        return self._outcomes.get(worker_id, "was not running")

    def startup_hint(self) -> str:
        return (
            " (or its Ray actor was never placed: check that the cluster has the resources "
            "env_manager.ray asks for, with `ray status`)"
        )

    # ------------------------------------------------------------------------- events

    def wait(self, timeout: float) -> List[Event]:
        """Send each host what it has, then block in ``ray.wait`` until a call answers. Polling
        remains in what is sent: an empty exchange to a host that owes replies, at most every
        POLL_WAIT_S (NOTE [ Hosts ]). With no call out nothing can answer: it sleeps ``timeout``."""
        for index in range(len(self._hosts)):
            self._call_if_due(index)
        if not self._events and self._calls:
            ready, rest = ray.wait(list(self._calls), num_returns=1, timeout=timeout, fetch_local=False)
            if ready:
                self._answer(ready[0])
                self._read(rest, 0.0)
        elif not self._events:
            time.sleep(timeout)
        events, self._events = self._events, []
        return events

    def _read(self, refs: List[Any], timeout: float) -> None:
        """Read the answers of ``refs`` that are in within ``timeout``."""
        if refs:
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout, fetch_local=False)
            for ref in done:
                self._answer(ref)

    def _answer(self, ref: Any) -> None:
        """Read a call's answer: the one place where a ``RayError`` becomes events. A report
        becomes its host's events; a failed call is the loss of the host's actor, and so the
        death of its envs. The answer of an actor the host no longer has is dropped: its envs'
        deaths were reported when it was let go of (so it is not even fetched). The call stays
        out until its answer is read: an interrupt during the fetch leaves it for the next wait."""
        call = self._calls[ref]
        if self._hosts[call.host].actor is not call.actor:
            self._read_off(ref)
            return
        try:  # fetched now if it is on another node (NOTE [ Answered is not fetched ])
            report: Optional[HostReport] = ray.get(ref, timeout=self._call_bound_s)
        except RayError as e:  # GetTimeoutError too: a fetch that never ends is a lost node
            self._read_off(ref)
            what = "died" if isinstance(e, RayActorError) else f"failed ({type(e).__name__})"
            ray_says = (str(e).strip().splitlines() or [type(e).__name__])[0]
            self._lose_host(
                call.host,
                lambda env: (
                    f"{env.ref.label}: its Ray actor {what} (last command: {command_name(env.ref.last_command)}); "
                    f"the node may have been lost. Ray says: {ray_says}"
                ),
                f"was lost with its actor ({ray_says})",
            )
            return
        self._read_off(ref)
        if report is not None:
            self._absorb(call.host, report, call.exchange)

    def _read_off(self, ref: Any) -> None:
        """The call's answer is read: it is out no more."""
        host = self._hosts[self._calls.pop(ref).host]
        if host.call is not None and host.call == ref:
            host.call = None

    def _absorb(self, index: int, report: HostReport, exchange: Optional[int]) -> None:
        """A host's report: where its envs run, their replies and deaths, which are still
        departing, and the outcomes and timers of its closed workers; ``exchange``: the number
        of the exchange that reported (None: the close)."""
        host = self._hosts[index]
        host.answered = True
        self._outcomes.update(report.outcomes)
        self._events += [WorkerTimers(root) for root in report.timers]
        node_id, address, actor_pid = report.where
        for (worker_id, incarnation), pid in report.pids.items():
            env = host.current(worker_id, incarnation)
            if env is not None:
                placement = Placement(worker_id, pid, address, node_id, actor_pid)
                ref = env.ref._replace(label=worker_label(worker_id, pid, placement))
                host.envs[worker_id] = env._replace(ref=ref, pid=pid)
                self._events.append(Placed(worker_id, incarnation, placement))
        host.unreported = {
            w: first for w, first in host.unreported.items() if exchange is not None and exchange < first
        }
        host.departing = set(report.departing) | set(host.unreported)
        for event in report.events:
            env = host.current(event.worker_id, event.incarnation)
            if env is None:
                continue  # from an incarnation released meanwhile
            answers = isinstance(event, Reply) and event.response.cmd in ANSWERS  # else it is ending
            host.envs[event.worker_id] = env._replace(owed=max(0, env.owed - 1) if answers else 0)
            self._events.append(event)

    def next_deadline(self) -> Optional[float]:
        """When the oldest exchange of an actor that answered before becomes overdue."""
        sent = [self._calls[host.call].sent_at for host in self._hosts if host.call is not None and host.answered]
        return min(sent) + self._call_bound_s if sent else None

    def advance(self) -> None:
        """Kill actors whose exchange is overdue: their envs die (and restart within quota). An
        overdue call that has answered meanwhile (the trainer did not wait: its update, or a
        wait that returned other events) is read instead."""
        now = self._clock()

        def overdue(host: _Host) -> bool:
            if host.call is None or not host.answered:
                return False
            return now >= self._calls[host.call].sent_at + self._call_bound_s

        self._read([host.call for host in self._hosts if overdue(host)], 0.0)
        for index, host in enumerate(self._hosts):
            if overdue(host):
                why = f"its Ray actor did not answer a call within {self._call_bound_s:.0f} s and was killed"
                logger.error(f"Ray actor of env workers {sorted(host.envs)}: {why}.")
                self._kill_host(index, why)
