"""The contract every backend keeps: one suite, run against the subprocess backend and the Ray
backend (on the session's loopback Ray). The restarts after a death, a SIGKILL and a hang are
tested here only, the subprocess backend's under each start method (the decision and its backoff:
test_restart.py and test_lifecycle.py). Backend-specific behaviour stays in test_supervisor.py,
test_faults.py, test_real_faults.py (processes, signals, the close ladder) and test_ray.py
(actors, nodes, placement)."""
import collections
import signal
import sys
import time
from typing import Dict, List, Tuple

import numpy as np
import psutil
import pytest
import torch
from helpers import SPAWN_ONLY, KillOnceBusy, alive_after, step_until
from mlagents.trainers.agent_processor import AgentManager
from mlagents.trainers.policy.torch_policy import TorchPolicy
from mlagents.trainers.settings import ConstantSettings, NetworkSettings
from mlagents.trainers.stats import StatsReporter
from mlagents.trainers.torch_entities.networks import SimpleActor
from mlagents_envs.exception import UnityCommunicationException

from mlagents_plugin.core.errors import RemoteTraceback, RemoteWorkerError, WorkerDiedError
from mlagents_plugin.core.protocol import EnvironmentCommand
from mlagents_plugin.testing import (
    HangingEnvironment,
    SimpleEnvironment,
    UnexpectedExceptionEnvironment,
    UnpicklableExceptionEnvironment,
    make_factory,
    raising_factory,
)
from mlagents_plugin.testing.training import check_environment_trains, train

RAY = [  # one xdist worker starts the session's Ray
    pytest.mark.ray,
    pytest.mark.xdist_group("ray"),

]
# For the restart tests: how a worker is started, noticed dead, killed and reaped differs between
# start methods (fork server, spawn, fork). A Ray actor starts its envs by the default method.
EACH_START_METHOD = pytest.mark.parametrize("backend", [
    pytest.param("subprocess-forkserver", marks=SPAWN_ONLY),
    "subprocess-spawn",
    pytest.param("subprocess-fork", marks=SPAWN_ONLY),
    pytest.param("ray", marks=RAY),
    pytest.param("ray-k2", marks=RAY),
])


class CustomTestOnlyException(Exception):
    pass


@pytest.fixture(params=["subprocess", pytest.param("ray", marks=RAY), pytest.param("ray-k2", marks=RAY)])
def backend(request) -> str:
    """The backend, and on Ray how many envs one actor hosts (``ray-k2``: envs_per_worker 2); a
    test may name the subprocess backend's start method (``subprocess-spawn``: EACH_START_METHOD)."""
    return request.param


@pytest.fixture
def manager_of(request, backend, env_manager_factory):
    """``make(env_factory, n_env, **settings)`` -> a manager of ``backend`` (the shipped fixture);
    after the test, none of its processes (workers, actors) may outlive close(), and on Ray no
    connection may have left loopback."""
    kind, _, variant = backend.partition("-")
    on_ray = kind == "ray"
    ray_cluster = request.getfixturevalue("ray_cluster") if on_ray else None
    managers = []

    def make(env_factory, n_env=1, **settings):
        if on_ray:
            settings.setdefault("ray", {"num_cpus_per_worker": 1})
            settings.setdefault("envs_per_worker", 2 if variant == "k2" else 1)
        elif variant:
            settings.setdefault("start_method", variant)
        managers.append(env_manager_factory(env_factory, n_env, backend=kind, **settings))
        return managers[-1]

    yield make
    pids = [pid for manager in managers for pid in hosts(manager)]
    for manager in managers:
        manager.close()
    left = alive_after(pids, 10.0)  # Ray reaps a killed actor asynchronously
    assert not left, f"outlived close(): {[describe(pid) for pid in left]}"
    if ray_cluster is not None:
        ray_cluster.assert_no_outside_connects()


def hosts(manager):
    """Every process that hosts a worker: the worker, and its Ray actor if it has one."""
    return [pid for p in manager.placements.values() for pid in (p.pid, p.actor_pid) if pid is not None]


def host_pid(manager, worker_id: int) -> int:
    """The process whose death takes the worker down, and only it: the worker process, or its
    Ray actor if the actor hosts no other env (test_ray.py kills an actor of several)."""
    placement = manager.placements[worker_id]
    if manager.settings.envs_per_worker > 1:
        return placement.pid
    return placement.actor_pid or placement.pid


def describe(pid: int) -> str:
    try:
        process = psutil.Process(pid)
        return f"{pid} {process.status()} {' '.join(process.cmdline())[:120]}"
    except psutil.NoSuchProcess:
        return f"{pid} (gone)"


# ---------------------------------------------------------------------------- training


@pytest.mark.timeout(300)
@pytest.mark.parametrize("num_envs", [1, 4])
def test_ppo_trains(manager_of, num_envs):
    manager = manager_of(make_factory(SimpleEnvironment), num_envs)
    check_environment_trains(manager, success_threshold=0.7, max_steps=3000)


def experiences(manager, policy, n_agents: int, each: int) -> Tuple[Dict[str, List[Tuple]], int, int]:
    """TrainerController's loop, its trainer never updating, until all ``n_agents`` have ``each``
    experiences: every agent's experiences, in order, how many steps ``get_steps`` returned, and
    how many of their workers were already stepping again."""
    agents = AgentManager(policy, "Simple", StatsReporter("contract-test"), 8, threaded=False)
    manager.set_agent_manager("Simple", agents)
    manager.set_policy("Simple", policy)
    seen: Dict[str, List[Tuple]] = collections.defaultdict(list)
    stepped = answered_early = 0
    while len(seen) < n_agents or min(len(e) for e in seen.values()) < each:
        steps = manager.get_steps()
        stepped += len(steps)
        answered_early += sum(manager.workers[s.worker_id].awaiting is EnvironmentCommand.STEP for s in steps)
        if manager.settings.early_actions and manager.settings.backend == "ray":  # delivered at once
            assert all(host.calling for host in manager.supervisor.backend.hosts if host.envs)
        manager.process_steps(steps)
        while not agents.trajectory_queue.empty():
            trajectory = agents.trajectory_queue.get_nowait()
            seen[trajectory.agent_id] += [
                (
                    e.obs[0], e.action.continuous, e.action.discrete, e.action_probs.continuous,
                    e.action_probs.discrete, e.prev_action, e.reward, e.done, e.interrupted,
                )
                for e in trajectory.steps
            ]
    return seen, stepped, answered_early


@pytest.mark.timeout(180)
def test_actions_sent_as_steps_land_leave_a_fixed_policys_experiences_as_they_were(manager_of):
    """NOTE [ Actions as steps land ]: with a deterministic policy that is not updated (weights
    and normaliser fixed), every agent's experiences are the same as in upstream's order
    (``early_actions: false``)."""
    factory = make_factory(SimpleEnvironment, num_agents=2, action="hybrid")
    runs = {}
    for early_actions in (False, True):
        manager = manager_of(factory, 3, early_actions=early_actions)
        manager.reset()
        torch.manual_seed(0)  # the same weights in both runs
        policy = TorchPolicy(
            0, manager.training_behaviors["Simple"], NetworkSettings(deterministic=True), SimpleActor,
            {"conditional_sigma": False, "tanh_squash": False},
        )
        runs[early_actions], stepped, answered_early = experiences(manager, policy, n_agents=3 * 2, each=48)
        assert answered_early == (stepped if early_actions else 0)
        manager.close()
    assert runs[False].keys() == runs[True].keys() == {f"agent_{w}-{a}" for w in range(3) for a in range(2)}
    for agent, upstream_order in runs[False].items():
        early = runs[True][agent]
        common = min(len(upstream_order), len(early))  # 48 or more: several episodes of 20
        for a, b in zip(upstream_order[:common], early[:common], strict=True):
            for x, y in zip(a, b, strict=True):
                np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(120)
def test_training_behaviors_lists_every_behavior(manager_of):
    names = ("Walker", "Runner")
    manager = manager_of(make_factory(SimpleEnvironment, behavior_names=names), 2)
    assert set(manager.training_behaviors) == set(names)
    manager.reset()
    steps = manager.first_step_infos
    assert {step.worker_id for step in steps} == {0, 1}
    assert all(set(step.current_all_step_result) == set(names) for step in steps)


@pytest.mark.timeout(120)
def test_env_parameters_reach_the_env_and_stats_come_back(manager_of):
    manager = manager_of(make_factory(SimpleEnvironment), 2)
    manager.reset()
    manager.set_env_parameters({"step_size": ConstantSettings(value=0.5)})
    stats = {}
    for _ in range(50):
        for step in manager.get_steps():
            stats.update(step.environment_stats)
        if "Environment/Param/step_size" in stats:
            break
    assert stats["Environment/Param/step_size"][0][0] == pytest.approx(0.5)


@pytest.mark.timeout(120)
def test_steps_slower_than_a_relay_slice_are_not_hangs(manager_of):
    """Waits happen in bounded slices (e.g. a Ray actor's relay); a step longer than one slice
    is still a step, not a hang."""
    manager = manager_of(make_factory(SimpleEnvironment, step_sleep_s=1.5), 2, step_timeout_s=30.0)
    manager.reset()
    stepped = set()
    for _ in range(4):
        stepped |= {step.worker_id for step in manager.get_steps()}
    assert stepped == {0, 1}
    assert manager.restart_counts == {}


# ------------------------------------------------------------------ the env's exceptions


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_envs", [1, 4])
def test_subprocess_failing_step(manager_of, num_envs):
    """Upstream's test of SubprocessEnvManager: the env's own exception reaches the trainer."""
    factory = make_factory(UnexpectedExceptionEnvironment, exception_type=CustomTestOnlyException, after_steps=5)
    manager = manager_of(factory, num_envs)
    with pytest.raises(CustomTestOnlyException) as info:
        train(manager, max_steps=1000)
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "faulty_envs.py" in str(cause) and "in fire" in str(cause)
    assert any("env worker" in note and "during STEP" in note for note in info.value.__notes__)
    started = time.monotonic()
    manager.close()
    assert time.monotonic() - started < manager.settings.shutdown_timeout_s


@pytest.mark.timeout(120)
def test_closing_workers_send_their_timers_to_the_trainers_tree(manager_of):
    """As upstream: each worker's timer tree is merged under ``workers`` in the trainer's (the
    timers.json of mlagents-learn); a closing worker's arrive as an event of the close."""
    from mlagents_envs.timers import get_timer_tree, reset_timers

    reset_timers()
    manager = manager_of(make_factory(SimpleEnvironment), 2)
    manager.reset()
    for _ in range(10):
        manager.get_steps()
    manager.close()
    workers = get_timer_tree().get("children", {}).get("workers", {})
    assert "worker_root" in workers.get("children", {}), get_timer_tree()


@pytest.mark.timeout(120)
def test_an_error_never_costs_a_sibling_its_reply(manager_of):
    """Worker 0's own exception (not restartable) and worker 1's reply wait together for the
    trainer, which is slow to wait again: the caller catches the error and steps on, and
    worker 1 is never declared hung (NOTE [ A wait is handled whole ])."""
    factory = make_factory(UnexpectedExceptionEnvironment, exception_type=CustomTestOnlyException, after_steps=5,
                           only_worker=0)
    manager = manager_of(factory, 2, step_timeout_s=3.0)
    manager.reset()
    with pytest.raises(CustomTestOnlyException):
        for _ in range(200):
            time.sleep(0.05)  # a trainer busy elsewhere: both workers' messages are waiting for it
            manager.get_steps()
    stepped = []
    steps_until = time.monotonic() + 2 * manager.settings.step_timeout_s
    while time.monotonic() < steps_until:
        stepped += [step.worker_id for step in manager.get_steps()]
    assert stepped and set(stepped) == {1}
    assert manager.restart_counts == {}


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "factory, expected",
    [
        (raising_factory(CustomTestOnlyException, "no env today"), "while building"),
        (
            make_factory(UnexpectedExceptionEnvironment, exception_type=CustomTestOnlyException, during="reset"),
            "during RESET",
        ),
    ],
    ids=["factory", "reset"],
)
def test_exception_keeps_its_type_and_traceback(manager_of, factory, expected):
    manager = manager_of(factory, 2)
    with pytest.raises(CustomTestOnlyException) as info:
        manager.reset()
    assert "env worker" in str(info.value.__cause__)
    assert any(expected in note for note in info.value.__notes__)


@pytest.mark.timeout(120)
def test_exception_from_a_side_channel_message(manager_of):
    """The trainer's env parameters reach the env through its side channel; the env rejects one."""
    manager = manager_of(make_factory(SimpleEnvironment), 2)
    manager.reset()
    manager.set_env_parameters({"step_size": -1.0})
    with pytest.raises(ValueError, match="step_size must be > 0") as info:
        for _ in range(100):
            manager.get_steps()
    assert isinstance(info.value.__cause__, RemoteTraceback)


@pytest.mark.timeout(120)
def test_unpicklable_exception_arrives_by_name(manager_of):
    manager = manager_of(make_factory(UnpicklableExceptionEnvironment, after_steps=2), 1)
    manager.reset()
    with pytest.raises(RemoteWorkerError) as info:
        step_until(manager, lambda: False)
    assert info.value.type_name.endswith("LockHoldingError")


@pytest.mark.timeout(180)
def test_unity_exception_restarts_the_worker_within_quota(manager_of, tmp_path):
    factory = make_factory(
        UnexpectedExceptionEnvironment,
        exception_type=UnityCommunicationException,
        after_steps=20,
        only_worker=1,
        once_file=str(tmp_path / "fired"),
    )
    manager = manager_of(factory, 2)
    manager.reset()
    first_pid = manager.worker_pids[1]
    check_environment_trains(manager, success_threshold=0.7, max_steps=3000)
    assert (tmp_path / "fired").exists()
    assert manager.restart_counts == {"unity": 1}
    assert manager.worker_pids[1] != first_pid


@pytest.mark.timeout(120)
def test_unity_exception_surfaces_when_the_quota_is_used_up(run_options, manager_of):
    run_options.env_settings.max_lifetime_restarts = 0
    factory = make_factory(UnexpectedExceptionEnvironment, exception_type=UnityCommunicationException, after_steps=3)
    manager = manager_of(factory, 1)
    manager.reset()
    with pytest.raises(UnityCommunicationException) as info:
        step_until(manager, lambda: False)
    assert any("no restarts left" in note for note in info.value.__notes__)


# ------------------------------------------------------------------------ deaths, hangs


@pytest.mark.timeout(120)
def test_a_killed_worker_is_a_worker_death_naming_it(run_options, manager_of, backend):
    # step_timeout_s is far beyond the test's timeout: only the death itself can be noticed.
    run_options.env_settings.max_lifetime_restarts = 0  # no restart: the death surfaces
    manager = manager_of(make_factory(SimpleEnvironment, step_sleep_s=0.01), 2, step_timeout_s=600)
    manager.reset()
    victim = host_pid(manager, 1)
    psutil.Process(victim).kill()  # SIGKILL; TerminateProcess on Windows
    started = time.monotonic()
    with pytest.raises(WorkerDiedError) as info:
        step_until(manager, lambda: False)
    assert time.monotonic() - started < 5
    assert "env worker 1 (pid" in str(info.value) and f"pid {victim}" in str(info.value)
    assert "no restarts left" in info.value.__notes__[-1]
    # its process's end, explained (a Ray actor's death: test_ray.py); Windows' TerminateProcess
    # leaves an exit code, no signal
    if backend == "subprocess" and sys.platform != "win32":
        assert f"env worker 1 (pid {victim}) was killed by SIGKILL: out of memory?" in str(info.value)
        assert info.value.exitcode == -signal.SIGKILL


@pytest.mark.timeout(300)
@EACH_START_METHOD
def test_a_worker_killed_mid_run_is_restarted_and_training_continues(manager_of):
    manager = manager_of(make_factory(SimpleEnvironment), 2, restart_backoff_s=0.0)
    manager.reset()
    before = {worker_id: host_pid(manager, worker_id) for worker_id in manager.placements}
    victim = before[1]
    killer = KillOnceBusy(victim)
    try:
        check_environment_trains(manager, success_threshold=0.7, max_steps=3000)
    finally:
        killer.cancel()
    assert manager.restart_counts == {"died": 1}
    assert host_pid(manager, 1) != victim
    assert {w: host_pid(manager, w) for w in manager.placements if w != 1} == {0: before[0]}  # only it restarted


@pytest.mark.timeout(120)
@EACH_START_METHOD
def test_a_hung_worker_is_taken_down_and_restarted(manager_of, caplog):
    factory = make_factory(HangingEnvironment, after_steps=20, only_worker=1)
    manager = manager_of(factory, 2, step_timeout_s=2.0, restart_backoff_s=0.0)
    manager.reset()
    hung = manager.worker_pids[1]  # on Ray too: its actor's ladder kills it, and hosts the next
    step_until(manager, lambda: manager.restart_counts.get("hung") == 1)
    assert manager.restart_counts == {"hung": 1}
    assert "Zombie worker report: env worker 1" in caplog.text
    assert not alive_after([hung], 5.0)
    stepped: set = set()  # the restarted worker steps again (before its own 20th step hangs it anew)
    deadline = time.monotonic() + 60
    while 1 not in stepped:
        assert time.monotonic() < deadline, "the restarted worker never stepped"
        stepped.update(step.worker_id for step in manager.get_steps())
