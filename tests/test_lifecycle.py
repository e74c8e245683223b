"""The fast tier: the manager's decisions, driven by an in-memory backend and a fake clock
(tests/fake_backend.py). Deadlines, restart quotas and backoff, port moves, a failed worker's
steps, resets during restarts, stale replies, close, and random fault schedules; the slots'
invariants are checked after every pump (MLAGENTS_PLUGIN_CHECK, set by conftest.py)."""
import logging
import os
import re
import signal
import sys
from typing import List

import pytest
from fake_backend import FAULTS, Behavior, FakeBackend, FakeClock, behave
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlagents.trainers.policy.torch_policy import TorchPolicy
from mlagents.trainers.settings import NetworkSettings, RunOptions
from mlagents.trainers.torch_entities.networks import SimpleActor
from mlagents_envs.exception import UnityCommunicationException, UnityTimeOutException

from mlagents_plugin.core import lifecycle, signals
from mlagents_plugin.core.backend import Reply
from mlagents_plugin.core.errors import (
    AllWorkersFailedError,
    ManagerClosedError,
    RemoteWorkerError,
    WorkerDiedError,
    WorkerTimeoutError,
)
from mlagents_plugin.core.lifecycle import InvariantError, Reason, Slot, WorkerState
from mlagents_plugin.core.manager import SupervisedManagerBase
from mlagents_plugin.core.protocol import EnvironmentCommand
from mlagents_plugin.core.restart import MAX_PORT_MOVES
from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.testing import SimpleEnvironment, make_factory

pytestmark = pytest.mark.fast


def test_the_suite_checks_invariants():
    assert lifecycle.CHECK_INVARIANTS


@pytest.mark.parametrize("start", [
    lambda: __import__("subprocess").run(["true"]),
    lambda: __import__("multiprocessing").get_context("spawn").Process(target=print).start(),
    lambda: os.fork(),
], ids=["subprocess", "multiprocessing", "fork"])
def test_the_fast_tier_starts_no_process(start):
    """tests/conftest.py refuses every way of starting a process in a ``fast`` test."""
    with pytest.raises(AssertionError, match="is marked fast but starts a process"):
        start()


class Harness:
    def __init__(self, script=None, n_env=2, run_options=None, departure_s=0.05, cpu_clock=None, **settings):
        self.clock = FakeClock()  # the trainer's CPU time too, unless a test gives its own (cpu_clock)
        self.run_options = run_options or RunOptions()
        self.backends: List[FakeBackend] = []

        def backend(setup):
            self.backends.append(FakeBackend(setup, script or behave(), departure_s))
            return self.backends[-1]

        self.manager = SupervisedManagerBase(
            make_factory(SimpleEnvironment), self.run_options, n_env,
            EnvManagerSettings(**settings), backend, self.clock, cpu_clock or self.clock,
        )
        self.backend = self.backends[0]

    def step_until(self, condition, limit=2000):
        for _ in range(limit):
            if condition():
                return
            self.manager.get_steps()
        pytest.fail("condition not reached")

    def launch_times(self, worker_id):
        return [t for w, _, _, t in self.backend.launches if w == worker_id]


@pytest.fixture
def harness():
    made = []

    def make(*args, **kwargs):
        made.append(Harness(*args, **kwargs))
        return made[-1]

    yield make
    for h in made:
        h.manager.close()


def quota(run_options=None, lifetime=10, rate_n=1, period_s=60):
    run_options = run_options or RunOptions()
    env = run_options.env_settings
    env.max_lifetime_restarts, env.restarts_rate_limit_n, env.restarts_rate_limit_period_s = lifetime, rate_n, period_s
    return run_options


# ------------------------------------------------------------------------------ stepping


def test_reset_gives_one_step_per_worker_and_steps_flow(harness):
    h = harness(n_env=3)
    assert h.manager.reset() == 3
    stepped = set()
    for _ in range(20):
        stepped |= {s.worker_id for s in h.manager.get_steps()}
    assert stepped == {0, 1, 2}
    assert set(h.manager.training_behaviors) == {"Simple"}


def test_an_error_never_costs_a_sibling_its_reply_from_the_same_wait(harness):
    """NOTE [ A wait is handled whole ]: worker 0's error (not restartable) and worker 1's reply
    arrive in one wait; the caller catches the error and steps on, and worker 1 is never hung."""
    h = harness(behave(w0=Behavior(step_s=0.1, fault=("raise", 3)), w1=Behavior(step_s=0.1)), step_timeout_s=5.0)
    h.manager.reset()
    with pytest.raises(RuntimeError, match="injected"):
        h.step_until(lambda: False)
    last = h.backend.batches[-1]
    assert {e.worker_id for e in last} == {0, 1} and isinstance(last[1], Reply)  # one wait, both
    stepped = []
    while h.clock.now < 1000 + 30:  # six times step_timeout_s
        stepped += [s.worker_id for s in h.manager.get_steps()]
    assert stepped and set(stepped) == {1}
    assert [r for r in h.backend.released if r[0] == 1] == [] and h.manager.restart_counts == {}


# ----------------------------------------------------------------------------- deadlines


def test_a_message_sent_while_a_step_is_outstanding_is_delivered_as_itself(harness):
    """A backend is told the command it carries, not the one outstanding (the Ray backend counts
    the replies an env owes by it: a parameter change mid-step was counted as a STEP)."""
    h = harness(n_env=2)
    h.manager.reset()
    h.manager.stepper.send_actions()
    h.manager.set_env_parameters({})
    assert [c for _, c, _ in h.backend.deliveries[-2:]] == [EnvironmentCommand.ENVIRONMENT_PARAMETERS] * 2
    assert all(s.awaiting is EnvironmentCommand.STEP for s in h.manager.workers)


@pytest.mark.parametrize("step_timeout_s", [0.5, 7.0, 70.0])
def test_a_hung_step_is_declared_hung_exactly_at_step_timeout(harness, step_timeout_s):
    script = behave(w0=Behavior(step_s=0.25), w1=Behavior(fault=("hang", 3)))
    h = harness(script, run_options=quota(lifetime=0), step_timeout_s=step_timeout_s)
    h.manager.reset()
    with pytest.raises(WorkerTimeoutError, match=f"did not answer STEP within step_timeout_s={step_timeout_s}") as info:
        h.step_until(lambda: False)
    assert "raise env_manager.step_timeout_s" in str(info.value)
    assert h.backend.released[-1] == (1, 0, Reason.HUNG)
    hung_step_sent = [t for w, c, t in h.backend.deliveries if w == 1 and c is EnvironmentCommand.STEP][-1]
    assert h.clock.now == pytest.approx(hung_step_sent + step_timeout_s)  # the wait was bounded by the deadline


@pytest.mark.parametrize("in_next_wait", [True, False], ids=["stopped-in-a-wait", "stopped-between-waits"])
def test_ctrl_z_of_the_whole_group_is_nobodys_hang(harness, in_next_wait):
    """Trainer and workers stopped together for 4x step_timeout_s, then resumed: no worker was
    silent while the trainer watched (NOTE [ Time nobody watched ])."""
    cpu = FakeClock()  # the trainer's CPU time: it does not run while stopped
    h = harness(lambda w, i: Behavior(step_s=0.2 + 0.07 * w), step_timeout_s=10.0, cpu_clock=cpu)
    h.manager.reset()
    h.step_until(lambda: h.clock.now > 1005)
    stopped_at = h.clock.now
    h.backend.stop_everything(40.0, in_next_wait)
    h.step_until(lambda: h.clock.now > stopped_at + 40 + 12)
    assert h.backend.released == [] and h.manager.restart_counts == {}


def test_a_trainer_busy_between_waits_still_sees_a_hang(harness):
    """Time the trainer spent working (its CPU time advanced) is watched time: a worker that
    hung meanwhile is declared hung at the trainer's next wait."""
    cpu = FakeClock()
    h = harness(behave(w1=Behavior(fault=("hang", 3))), run_options=quota(lifetime=0), step_timeout_s=10.0,
                cpu_clock=cpu)
    h.manager.reset()
    h.step_until(lambda: h.manager.workers[1].awaiting is EnvironmentCommand.STEP and h.backend.deliveries[-1][0] == 0)
    h.clock.now += 30.0  # a long policy update
    cpu.now += 30.0
    with pytest.raises(WorkerTimeoutError, match="did not answer STEP within step_timeout_s=10.0"):
        h.manager.get_steps()


def test_a_worker_stopped_alone_is_hung_though_the_trainer_was_stopped_before(harness):
    """A gap delays deadlines only by its own length: worker 1 stops alone after the group was
    resumed, and is declared hung step_timeout_s after its last request."""
    cpu = FakeClock()
    h = harness(behave(w0=Behavior(step_s=0.25), w1=Behavior(fault=("hang", 30))), run_options=quota(lifetime=0),
                step_timeout_s=10.0,
                cpu_clock=cpu)
    h.manager.reset()
    h.backend.stop_everything(40.0)
    with pytest.raises(WorkerTimeoutError):
        h.step_until(lambda: False)
    hung_step_sent = [t for w, c, t in h.backend.deliveries if w == 1 and c is EnvironmentCommand.STEP][-1]
    assert h.clock.now == pytest.approx(hung_step_sent + 10.0)


def test_a_worker_hung_while_building_times_out_at_startup_timeout(harness):
    h = harness(behave(w0=Behavior(fault=("hang", 0))), run_options=quota(lifetime=0), startup_timeout_s=33.0)
    started = h.clock.now
    with pytest.raises(
        WorkerTimeoutError, match="did not finish building its env within startup_timeout_s=33.0"
    ) as info:
        h.manager.reset()
    assert 33.0 <= h.clock.now - started <= 33.0 + 1.0
    assert "raise env_manager.startup_timeout_s" in str(info.value)


def test_a_request_queued_while_starting_gets_its_clock_when_the_worker_is_ready(harness):
    h = harness(behave(w0=Behavior(startup_s=50.0)), step_timeout_s=10.0, startup_timeout_s=90.0)
    h.manager.reset()  # the RESET waited 50 s for the start, more than step_timeout_s: no hang
    assert h.manager.restart_counts == {}


# --------------------------------------------------------------------- restarts, backoff


def backoffs(backend: FakeBackend, worker_id: int) -> List[float]:
    """How long each restart of the worker waited after its predecessor was released."""
    launches = [t for w, i, _, t in backend.launches if w == worker_id and i > 0]
    released = [t for (w, _, _), t in zip(backend.released, backend.released_at, strict=True) if w == worker_id]
    return [round(launched - gone, 3) for gone, launched in zip(released, launches, strict=False)]


@pytest.mark.parametrize("failure, error", [
    (Behavior(fault=("die", 2)), WorkerDiedError),
    (Behavior(fault=("raise", 2), exception=UnityTimeOutException), UnityTimeOutException),  # restarted as upstream
], ids=["death", "unity-exception"])
def test_backoff_is_zero_then_doubles_from_the_second_restart(harness, failure, error):
    always_fails = lambda worker_id, incarnation: failure if worker_id == 0 else Behavior()
    h = harness(always_fails, n_env=1, run_options=quota(lifetime=6, rate_n=-1), restart_backoff_s=0.5)
    h.manager.reset()
    with pytest.raises(error) as info:
        h.step_until(lambda: False)
    assert len(h.launch_times(0)) == 7  # the first incarnation, then 6 restarts
    # the first restart waits only for its predecessor to be gone (0.05 s here)
    assert backoffs(h.backend, 0) == [0.05, 0.5, 1.0, 2.0, 4.0, 8.0]
    assert "max_lifetime_restarts=6" in info.value.__notes__[-1] and "its 6 restart(s)" in info.value.__notes__[-1]


def test_the_backoff_is_capped_at_30_s(harness):
    always_dies = lambda worker_id, incarnation: Behavior(fault=("die", 1))
    h = harness(always_dies, n_env=1, run_options=quota(lifetime=10, rate_n=-1, period_s=3600),
                restart_backoff_s=4.0, departure_s=0.0)
    h.manager.reset()
    with pytest.raises(WorkerDiedError):
        h.step_until(lambda: False)
    assert backoffs(h.backend, 0) == [0.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0, 30.0, 30.0, 30.0]


def test_the_backoff_counts_only_restarts_within_the_rate_limit_period(harness):
    always_dies = lambda worker_id, incarnation: Behavior(fault=("die", 1))
    h = harness(always_dies, n_env=1, run_options=quota(lifetime=8, rate_n=-1, period_s=60),
                restart_backoff_s=4.0, departure_s=0.0)
    h.manager.reset()
    with pytest.raises(WorkerDiedError):
        h.step_until(lambda: False)
    # after 0+4+8+16+30 s the first restarts are more than 60 s old: the backoff shrinks again
    assert backoffs(h.backend, 0)[:7] == [0.0, 4.0, 8.0, 16.0, 30.0, 30.0, 4.0]


def test_the_backoff_is_counted_per_worker(harness):
    """Worker 1 fails for the first time after worker 0's second failure: its own first restart
    is still immediate."""

    def script(worker_id, incarnation):
        if worker_id == 0 and incarnation < 3:
            return Behavior(fault=("die", 2))
        return Behavior(fault=("die", 40)) if (worker_id, incarnation) == (1, 0) else Behavior()

    h = harness(script, n_env=2, run_options=quota(rate_n=-1), restart_backoff_s=0.5)
    h.manager.reset()
    h.step_until(lambda: len(h.launch_times(0)) == 4 and len(h.launch_times(1)) == 2)
    assert [w for w, _, _ in h.backend.released][:3] == [0, 0, 1]
    assert backoffs(h.backend, 0) == [0.05, 0.5, 1.0]
    assert backoffs(h.backend, 1) == [0.05]  # only its predecessor's departure


def test_the_others_step_on_while_one_worker_waits_out_its_backoff(harness):
    dies = lambda worker_id, incarnation: Behavior(fault=("die", 3)) if worker_id == 3 else Behavior()
    h = harness(dies, n_env=4, run_options=quota(rate_n=5), restart_backoff_s=2.0)
    h.manager.reset()
    h.step_until(lambda: h.manager.restart_counts.get("died") == 2)  # the first restart is immediate
    waiting_since, stepped, returned_at = h.clock.now, set(), []
    while 3 not in h.manager.worker_pids:  # the second waits restart_backoff_s
        stepped |= {step.worker_id for step in h.manager.get_steps()}
        returned_at.append(h.clock.now)
    assert stepped == {0, 1, 2}
    assert returned_at[-1] - waiting_since >= 2.0 - 0.05  # the backoff passed, with steps all along:
    assert max(b - a for a, b in zip([waiting_since, *returned_at[:-1]], returned_at, strict=True)) < 0.1


def test_the_rate_limit_refuses_a_second_restart_within_its_period_and_allows_it_after(harness):
    dies_twice = lambda worker_id, incarnation: Behavior(fault=("die", 3)) if incarnation < 2 else Behavior()
    h = harness(dies_twice, n_env=1, run_options=quota(rate_n=1, period_s=60))
    h.manager.reset()
    with pytest.raises(WorkerDiedError) as info:
        h.step_until(lambda: False)
    assert "restarts_rate_limit_n=1 per restarts_rate_limit_period_s=60" in info.value.__notes__[-1]
    h2 = harness(dies_twice, n_env=2, run_options=quota(rate_n=1, period_s=60), step_timeout_s=100.0)
    h2.manager.reset()
    h2.step_until(lambda: h2.manager.restart_counts.get("died") == 2)  # 60 s of two workers' steps pass first


def test_a_worker_that_never_built_its_env_is_retried_once(harness):
    never = lambda worker_id, incarnation: Behavior(fault=("raise", 0), exception=UnityTimeOutException)
    h = harness(never, n_env=1, run_options=quota(lifetime=10, rate_n=-1))
    with pytest.raises(UnityTimeOutException) as info:
        h.manager.reset()
    assert len(h.launch_times(0)) == 2
    assert "never once finished building its env" in info.value.__notes__[-1]


@pytest.mark.parametrize("n_env", [1, 4])
@pytest.mark.parametrize("kind, cause", [("die", "died"), ("stop", "died"), ("hang", "hung")])
def test_each_way_of_failing_is_restarted_under_its_cause(harness, kind, cause, n_env):
    """Only the failed worker is restarted; alone, it is waited for."""
    last = n_env - 1
    h = harness(behave(**{f"w{last}": Behavior(fault=(kind, 4))}), n_env=n_env, step_timeout_s=5.0,
                restart_backoff_s=0.0)
    h.manager.reset()
    h.step_until(lambda: h.manager.restart_counts == {cause: 1} and last in h.manager.worker_pids)
    h.step_until(lambda: any(s.worker_id == last for s in h.manager.get_steps()))
    assert [(w, i) for w, i, _, _ in h.backend.launches if i > 0] == [(last, 1)]


def test_an_exception_that_is_not_restartable_reaches_the_trainer_with_its_type(harness):
    h = harness(behave(w0=Behavior(fault=("raise", 3), exception=KeyError)))
    h.manager.reset()
    with pytest.raises(KeyError) as info:
        h.step_until(lambda: False)
    assert any("during STEP" in note for note in info.value.__notes__)
    assert h.manager.restart_counts == {}


def test_restart_on_names_make_an_exception_restartable(harness):
    h = harness(behave(w0=Behavior(fault=("raise", 3), exception=KeyError)), restart_on=["KeyError"])
    h.manager.reset()
    h.step_until(lambda: h.manager.restart_counts == {"restart_on": 1})


# -------------------------------------------------------------------------- port moves


def test_a_taken_port_moves_the_worker_and_is_not_a_restart(harness):
    taken_once = lambda worker_id, incarnation: (
        Behavior(fault=("port", 0)) if (worker_id, incarnation) == (1, 0) else Behavior()
    )
    h = harness(taken_once)
    assert h.manager.reset() == 2
    assert [(w, e) for w, _, e, _ in h.backend.launches] == [(0, 0), (1, 1), (1, 2)]  # moved to id 2
    assert h.manager.restart_counts == {}


def test_port_moves_stop_after_max_port_moves(harness):
    always_taken = lambda worker_id, incarnation: Behavior(fault=("port", 0)) if worker_id == 0 else Behavior()
    h = harness(always_taken, run_options=quota(lifetime=0))
    with pytest.raises(RemoteWorkerError) as info:
        h.manager.reset()
    assert info.value.type_name.endswith("UnityWorkerInUseException")
    env_ids = [e for w, _, e, _ in h.backend.launches if w == 0]
    assert env_ids == [0] + list(range(2, 2 + MAX_PORT_MOVES))  # each move to an id nobody uses


# ------------------------------------------------------------- a failed worker's steps


def test_the_steps_of_a_worker_that_fails_in_the_same_wait_are_dropped(harness):
    h = harness(behave(w1=Behavior(fault=("reply_and_die", 3))), restart_backoff_s=10.0)
    h.manager.reset()
    for _ in range(50):
        steps = h.manager.get_steps()
        if h.manager.restart_counts:
            assert all(s.worker_id != 1 for s in steps), "a step of the failed worker came back"
            return
    pytest.fail("the worker never failed")


def test_reset_waits_for_a_worker_restarted_meanwhile(harness):
    h = harness(behave(w1=Behavior(fault=("raise", 0), exception=UnityCommunicationException)))
    assert h.manager.reset() == 2
    assert sorted(s.worker_id for s in h.manager.first_step_infos) == [0, 1]
    assert h.manager.restart_counts == {"unity": 1}


def test_replies_of_a_replaced_incarnation_never_reach_the_trainer(harness):
    """The fake backend hands over events of released incarnations too."""
    h = harness(behave(w1=Behavior(fault=("reply_and_die", 2), step_s=0.001)), restart_backoff_s=0.0)
    h.manager.reset()
    h.step_until(lambda: h.manager.restart_counts == {"died": 1})
    for _ in range(30):
        for step in h.manager.get_steps():
            assert h.manager.workers[step.worker_id].live


# ------------------------------------------------------------------------------- close


def test_close_releases_each_live_worker_the_way_its_state_calls_for(harness):
    h = harness(behave(w1=Behavior(startup_s=100.0)), n_env=2, startup_timeout_s=200.0)
    assert h.manager.training_behaviors  # worker 0 is up; worker 1 still builds its env
    assert [s.state for s in h.manager.workers] == [WorkerState.IDLE, WorkerState.STARTING]
    h.manager.close()
    assert sorted(h.backend.released) == [(0, 0, Reason.CLOSE), (1, 0, Reason.BUILDING)]
    assert h.backend.closed
    with pytest.raises(ManagerClosedError):
        h.manager.get_steps()


def test_a_second_interrupt_releases_every_worker_at_once(harness, monkeypatch):
    h = harness(n_env=2)
    h.manager.reset()
    monkeypatch.setattr(signals, "_interrupts", 2)
    h.manager.close()
    assert sorted(h.backend.released) == [(0, 0, Reason.INTERRUPTED), (1, 0, Reason.INTERRUPTED)]


# NOTE [ Trainer signals ]: a Ctrl-C at every point of construction and close. The fake backend
# raises a real SIGINT at the start of its n-th launch, release or close; held or not, the
# manager must end in order: every started worker released, the backend closed, no other error.


@pytest.mark.parametrize("n", [1, 2, 3])
def test_ctrl_c_while_the_workers_are_launched_releases_every_started_one(n):
    backends = []

    def backend(setup):
        backends.append(FakeBackend(setup, behave()))
        backends[-1].interrupt_at = {"launch": n}
        return backends[-1]

    with pytest.raises(KeyboardInterrupt):
        SupervisedManagerBase(make_factory(SimpleEnvironment), RunOptions(), 3, EnvManagerSettings(), backend,
                              FakeClock())
    fake = backends[0]
    assert len(fake.launches) == n  # the interrupted launch was finished, then the interrupt raised
    assert fake.workers == {} and len(fake.released) == n and fake.closed


def test_ctrl_c_while_a_worker_restarts_reaches_the_trainer_and_close_ends_in_order(harness):
    h = harness(behave(w0=Behavior(fault=("die", 3))), restart_backoff_s=0.0)
    h.backend.interrupt_at = {"launch": 3}  # the restart of worker 0
    h.manager.reset()
    with pytest.raises(KeyboardInterrupt):
        h.step_until(lambda: False)
    assert [w for w, *_ in h.backend.launches] == [0, 1, 0]  # the restart was launched whole
    h.manager.close()
    assert h.backend.workers == {} and h.backend.closed


def test_what_a_pump_handled_before_a_ctrl_c_is_not_lost(harness):
    """Worker 1's step lands in the wait that sees worker 0 die; the Ctrl-C comes while worker 0's
    restart is launched, at the end of that pump. The step is returned by the next get_steps, as
    it landed: not dropped, and not stepped again from the step before it (NOTE [ A wait is
    handled whole ])."""
    h = harness(behave(w0=Behavior(fault=("die", 3))), restart_backoff_s=0.0)
    h.backend.interrupt_at = {"launch": 3}  # the restart of worker 0
    h.manager.reset({"gravity": 2.0})
    with pytest.raises(KeyboardInterrupt):
        h.step_until(lambda: False)
    sent_to_1 = [w for w, c, _ in h.backend.deliveries if c is EnvironmentCommand.STEP].count(1)
    assert [s.worker_id for s in h.manager.get_steps()] == [1]
    assert [w for w, c, _ in h.backend.deliveries if c is EnvironmentCommand.STEP].count(1) == sent_to_1
    # the Ctrl-C was held until the restarted worker had its env parameters and its RESET too
    # (raised at the launch's end, it once left worker 0 IDLE and never reset: alone, a hang)
    relaunched = h.launch_times(0)[-1]
    assert [c for w, c, t in h.backend.deliveries if w == 0 and t >= relaunched][:2] == [
        EnvironmentCommand.ENVIRONMENT_PARAMETERS, EnvironmentCommand.RESET,
    ]


def test_a_ctrl_c_while_a_failure_is_handled_drops_no_reply_of_the_same_wait(harness):
    """Worker 0's death and worker 1's step come in one wait, and the Ctrl-C while worker 0 is
    released: worker 1's step, already read, is handled before the Ctrl-C is raised (it once
    stayed awaited, and worker 1 was declared hung step_timeout_s later)."""
    h = harness(behave(w0=Behavior(fault=("die", 3))), restart_backoff_s=0.0, step_timeout_s=5.0)
    h.backend.interrupt_at = {"release": 1}
    h.manager.reset()
    with pytest.raises(KeyboardInterrupt):
        h.step_until(lambda: False)
    assert {e.worker_id for e in h.backend.batches[-1]} == {0, 1}  # one wait
    assert 1 in h.manager.stepper.completed_workers()
    start = h.clock.now
    while h.clock.now < start + 12.0:
        h.manager.get_steps()
    assert h.backend.released == [(0, 0, Reason.CLOSE)]  # worker 1: never released as hung


def test_a_ctrl_c_between_two_deliveries_sends_the_rest(harness):
    """A Ctrl-C after the first of two STEPs is written: the second is written too before it is
    raised (it was once taken out of the outbox and lost, its worker waiting for it until
    declared hung)."""
    h = harness(n_env=2, step_timeout_s=5.0)
    h.manager.reset()
    h.backend.interrupt_at = {"message": h.backend._calls.get("message", 0) + 2}
    with pytest.raises(KeyboardInterrupt):
        h.manager.get_steps()  # STEP to workers 0 and 1, in one flush
    steps = [(w, c) for w, c, _ in h.backend.deliveries if c is EnvironmentCommand.STEP]
    assert sorted(steps) == [(0, EnvironmentCommand.STEP), (1, EnvironmentCommand.STEP)]
    start = h.clock.now
    while h.clock.now < start + 12.0:
        h.manager.get_steps()
    assert h.backend.released == []


def test_a_reset_with_new_parameters_while_a_worker_restarts_resets_it_under_them(harness):
    """A lesson change (reset with new env parameters) while a restarted worker's RESET is still
    queued: that RESET lands first and is dropped, then the worker gets the new parameters and a
    RESET, as upstream orders them (the queued RESET once counted, under the old parameters)."""

    def script(worker_id, incarnation):
        if (worker_id, incarnation) == (1, 0):
            return Behavior(fault=("die", 2))
        return Behavior(startup_s=5.0) if worker_id == 1 else Behavior()

    h = harness(script, restart_backoff_s=0.0, startup_timeout_s=60.0)
    h.manager.reset({"gravity": 1.0})
    h.step_until(lambda: h.manager.workers[1].incarnation == 1)
    assert h.manager.workers[1].awaiting is EnvironmentCommand.RESET
    relaunched = h.launch_times(1)[-1]
    h.manager.reset({"gravity": 3.0})
    to_1 = [c for w, c, t in h.backend.deliveries if w == 1 and t >= relaunched]
    assert to_1 == [EnvironmentCommand.ENVIRONMENT_PARAMETERS, EnvironmentCommand.RESET] * 2


@pytest.mark.parametrize("method, n", [("release", 1), ("release", 2), ("close", 1)])
def test_a_first_ctrl_c_while_closing_hurries_the_close_and_it_ends_in_order(harness, method, n):
    h = harness(n_env=2)
    h.manager.reset()
    h.backend.interrupt_at = {method: n}
    h.manager.close()  # returns
    assert h.backend.workers == {} and sorted(r[0] for r in h.backend.released) == [0, 1]
    assert {r[2] for r in h.backend.released} == {Reason.CLOSE}
    assert h.backend.hurried == 1 and h.backend.closes[-1] is False and h.backend.closed


def test_a_second_ctrl_c_while_closing_kills_at_once(harness, monkeypatch):
    h = harness(n_env=2)
    h.manager.reset()
    monkeypatch.setattr(signals, "_interrupts", 1)  # the Ctrl-C that ended training
    previous = signal.signal(signal.SIGINT, signals._interrupt)
    try:
        h.backend.interrupt_at = {"release": 1}
        h.manager.close()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert h.backend.workers == {} and h.backend.hurried == 0
    assert h.backend.closes[-1] is True and h.backend.closed


def close_summaries(caplog):
    """The close summary line of each worker, by worker id."""
    return {
        int(r.getMessage().split(":")[0].split()[-1]): r.getMessage()
        for r in caplog.records
        if r.getMessage().startswith("Env worker ")
    }


@pytest.mark.parametrize("failing, error, words", [
    ("release", OSError("injected: the worker's pipe is gone"), "Releasing env worker"),
    # as shutdown_timeout_s=inf once did
    ("close", OverflowError("injected: timeout value is too large"), "Closing the env workers of this"),
])
def test_an_error_while_closing_is_logged_and_close_returns(harness, caplog, failing, error, words):
    """mlagents-learn writes its run logs (timers.json, training_status.json) after close():
    nothing that fails inside close() may stop that, nor stop the other workers' release."""
    h = harness(n_env=2)
    h.manager.reset()
    setattr(h.backend, f"{failing}_error", error)
    with caplog.at_level(logging.INFO):
        h.manager.close()  # returns: it does not raise
    logged = [r for r in caplog.records if words in r.getMessage()]
    assert len(logged) == (2 if failing == "release" else 1)  # a failed release: each worker's
    assert all(r.levelno == logging.ERROR and r.exc_info[1] is error for r in logged)  # with its traceback
    assert h.backend.closed == (failing == "release")  # the backend is closed after failed releases
    assert sorted(close_summaries(caplog)) == [0, 1]  # every worker's summary is still said
    with pytest.raises(ManagerClosedError):
        h.manager.get_steps()
    h.manager.close()  # and closing again does nothing


def test_the_close_summary_gives_a_latency_only_for_a_worker_that_stepped(harness, caplog):
    """A worker that never stepped once printed "mean step latency nan ms"."""
    h = harness(behave(w1=Behavior(fault=("hang", 1))), step_timeout_s=600.0)
    h.manager.reset()
    for _ in range(5):  # worker 1 hangs in its first step: every step comes from worker 0
        assert [s.worker_id for s in h.manager.get_steps()] == [0]
    with caplog.at_level(logging.INFO):
        h.manager.close()
    summaries = close_summaries(caplog)
    assert summaries[0].startswith("Env worker 0: 5 steps, mean step latency 5.00 ms, restarts: none;")
    assert summaries[1].startswith("Env worker 1: 0 steps, restarts: none;")
    assert not any("nan" in line for line in summaries.values()), summaries


def test_a_manager_whose_workers_all_failed_says_so(harness):
    h = harness(behave(w0=Behavior(fault=("die", 2))), n_env=1, run_options=quota(lifetime=0))
    h.manager.reset()
    with pytest.raises(WorkerDiedError):
        h.step_until(lambda: False)
    with pytest.raises(AllWorkersFailedError):
        h.manager.get_steps()


# ------------------------------------------------------------------------- the machine


def test_transitions_refuse_what_the_state_does_not_allow():
    slot = Slot(0)
    with pytest.raises(InvariantError):
        slot.ready(123, {}, 0.0, 1.0)  # not starting
    slot.launch(0.0, 10.0)
    slot.request(EnvironmentCommand.RESET, 0.0, 5.0)
    assert slot.state is WorkerState.STARTING and slot.deadline == 10.0  # the start's clock
    slot.ready(123, {}, 1.0, 5.0)
    assert slot.state is WorkerState.BUSY and slot.deadline == 6.0
    slot.check()
    with pytest.raises(InvariantError):
        slot.launch(1.0, 10.0)  # one incarnation at a time
    slot.answered({})
    slot.deadline = 3.0  # a bug elsewhere
    with pytest.raises(InvariantError):
        slot.check()


# -------------------------------------------------------------- random fault schedules


behaviors = st.builds(
    Behavior,
    startup_s=st.sampled_from([0.001, 0.5, 20.0]),
    step_s=st.sampled_from([0.001, 0.05, 3.0]),
    fault=st.one_of(st.none(), st.tuples(st.sampled_from(FAULTS), st.integers(0, 6))),
    exception=st.sampled_from([RuntimeError, UnityCommunicationException]),
)


# The suite runs the same 400 schedules every time; LIFECYCLE_EXAMPLES=6000 explores new ones.
EXPLORE = int(os.environ.get("LIFECYCLE_EXAMPLES", "0"))


def timed_policy(clock: FakeClock, pass_s: float) -> TorchPolicy:
    """ML-Agents' TorchPolicy for SimpleEnvironment, whose forward passes take ``pass_s`` of ``clock``."""
    policy = TorchPolicy(
        0, SimpleEnvironment().behavior_specs["Simple"], NetworkSettings(), SimpleActor,
        {"conditional_sigma": False, "tanh_squash": False},
    )
    evaluate = policy.evaluate

    def timed(*args, **kwargs):
        clock.now += pass_s
        return evaluate(*args, **kwargs)

    policy.evaluate = timed
    return policy


@settings(
    max_examples=EXPLORE or 400,
    derandomize=not EXPLORE,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    n_env=st.integers(1, 4),
    plan=st.lists(behaviors, min_size=16, max_size=16),
    restart_on=st.sampled_from([[], ["RuntimeError"]]),
    with_policy=st.booleans(),
)
def test_any_fault_schedule_keeps_the_manager_consistent(harness, n_env, plan, restart_on, with_policy):
    """Whatever fails when, and however: the invariants hold after every pump (checked by the
    manager), every step returned comes from a worker that is up, and the manager either
    steps or raises an error that says what failed; simulated time moves on. With a policy
    (whose passes take 20 ms), actions go out as steps land and the manager waits for workers
    about to answer (NOTE [ Actions as steps land ], NOTE [ Gathering a batch ])."""
    script = lambda worker_id, incarnation: plan[(4 * worker_id + incarnation) % 16] if incarnation < 4 else Behavior()
    h = harness(script, n_env=n_env, run_options=quota(lifetime=3, rate_n=-1), restart_on=restart_on,
                step_timeout_s=10.0, startup_timeout_s=30.0, restart_backoff_s=0.2)
    expected = (WorkerDiedError, WorkerTimeoutError, RuntimeError, UnityCommunicationException, RemoteWorkerError)
    try:
        h.manager.reset()
        if with_policy:
            h.manager.set_policy("Simple", timed_policy(h.clock, pass_s=0.02))
        for _ in range(40):
            before = h.clock.now
            steps = h.manager.get_steps()
            assert steps  # never an empty list: ML-Agents' loop would spin on it
            for step in steps:
                slot = h.manager.workers[step.worker_id]
                assert slot.state is WorkerState.IDLE or (with_policy and slot.awaiting is EnvironmentCommand.STEP)
            assert h.clock.now >= before
    except AllWorkersFailedError:
        pass
    except expected as error:  # it names the worker that failed, in its message or a note
        said = " ".join([str(error), *getattr(error, "__notes__", [])])
        assert re.search(r"env worker \d", said), said


def test_a_stop_signal_a_finalizer_swallowed_is_raised_at_the_next_step(harness, monkeypatch):
    """A SIGHUP whose KeyboardInterrupt is raised inside a ``__del__`` is lost to Python (printed
    as "Exception ignored"): the trainer asks for its next step, and gets it there."""
    h = harness(n_env=2)
    h.manager.reset()
    monkeypatch.setattr(signals, "_interrupts", 0)
    monkeypatch.setattr(signals, "_raised", None)
    swallowed = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: swallowed.append(u.exc_type))

    class LetGo:
        def __del__(self):
            signal.raise_signal(signal.SIGHUP)  # its handler runs here, inside the finalizer

    previous = signal.signal(signal.SIGHUP, signals._interrupt)
    try:
        LetGo()  # collected at once
        assert swallowed == [KeyboardInterrupt]
        with pytest.raises(KeyboardInterrupt, match="SIGHUP"):
            h.manager.get_steps()
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_an_interrupt_handled_before_the_manager_was_built_is_not_raised_again(harness, monkeypatch):
    """An earlier run in the process (a notebook, ``run_cli`` in a loop) was interrupted: this
    manager's steps are not."""
    monkeypatch.setattr(signals, "_interrupts", 1)
    monkeypatch.setattr(signals, "_raised", signal.SIGINT)
    h = harness(n_env=2)
    assert h.manager.reset() == 2  # one step per worker
    assert {step.worker_id for step in h.manager.get_steps()} <= {0, 1}


def test_a_taken_editor_port_is_not_moved_and_says_why():
    """mlagents-learn without --env waits for the Editor on its one port: a worker moved to
    another worker id would fail with mlagents-envs' "the worker-id must be 0"."""
    import inspect

    from mlagents.trainers.learn import create_environment_factory

    taken = lambda worker_id, incarnation: Behavior(fault=("port", 0))
    backend = []
    # ML-Agents 1.1.0 added no_graphics_monitor; 1.0.0 has the rest under the same names
    monitor = {"no_graphics_monitor": True} if "no_graphics_monitor" in inspect.signature(
        create_environment_factory).parameters else {}
    editor = create_environment_factory(
        env_path=None, no_graphics=True, seed=0, num_areas=1, timeout_wait=60, start_port=5005, env_args=[],
        log_folder=None, **monitor,
    )
    clock = FakeClock()
    manager = SupervisedManagerBase(
        editor, RunOptions(), 1, EnvManagerSettings(),
        lambda setup: backend.append(FakeBackend(setup, taken)) or backend[-1], clock, clock,
    )
    try:
        with pytest.raises(RemoteWorkerError) as info:
            manager.reset()
    finally:
        manager.close()
    assert info.value.type_name.endswith("UnityWorkerInUseException")
    assert [e for _, _, e, _ in backend[0].launches] == [0]  # never moved
    assert any("waits for the Unity Editor on port 5004" in note for note in info.value.__notes__)
