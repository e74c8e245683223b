"""SupervisedEnvManager with real worker processes: stepping, training, errors, deaths, close."""
import logging
import os
import signal
import time

import psutil
import pytest
from mlagents.trainers.settings import ConstantSettings
from mlagents_envs.exception import UnityCommunicationException

from mlagents_plugin.core.errors import RemoteTraceback, WorkerDiedError
from mlagents_plugin.testing import (
    HangingEnvironment,
    HardExitEnvironment,
    SimpleEnvironment,
    UnexpectedExceptionEnvironment,
    make_factory,
    raising_factory,
)
from mlagents_plugin.testing.training import check_environment_trains, train


class CustomTestOnlyException(Exception):
    pass


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_envs", [1, 4])
def test_subprocess_failing_step(env_manager_factory, num_envs):
    factory = make_factory(
        UnexpectedExceptionEnvironment, exception_type=CustomTestOnlyException, after_steps=5
    )
    manager = env_manager_factory(factory, num_envs)
    pids = set(manager.worker_pids.values())
    with pytest.raises(CustomTestOnlyException) as info:
        train(manager, max_steps=1000)
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "faulty_envs.py" in str(cause) and "in fire" in str(cause)
    assert any("env worker" in note and "during STEP" in note for note in info.value.__notes__)
    started = time.monotonic()
    manager.close()
    assert time.monotonic() - started < manager.settings.shutdown_timeout_s
    assert not [pid for pid in pids if _alive(pid)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("num_envs", [1, 4])
def test_ppo_trains_through_supervised_manager(env_manager_factory, num_envs):
    manager = env_manager_factory(make_factory(SimpleEnvironment), num_envs)
    check_environment_trains(manager, success_threshold=0.7, max_steps=3000)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "factory, expected",
    [
        (raising_factory(CustomTestOnlyException, "no env today"), "while building"),
        (
            make_factory(
                UnexpectedExceptionEnvironment,
                exception_type=CustomTestOnlyException,
                during="reset",
            ),
            "during RESET",
        ),
    ],
    ids=["factory", "reset"],
)
def test_exception_keeps_its_type_and_traceback(env_manager_factory, factory, expected):
    manager = env_manager_factory(factory, 2)
    with pytest.raises(CustomTestOnlyException) as info:
        manager.reset()
    assert "env worker" in str(info.value.__cause__)
    assert any(expected in note for note in info.value.__notes__)


@pytest.mark.timeout(60)
def test_exception_from_a_side_channel_message(env_manager_factory):
    """The trainer's env parameters reach the env through its side channel; the env rejects one."""
    manager = env_manager_factory(make_factory(SimpleEnvironment), 2)
    manager.reset()
    manager.set_env_parameters({"step_size": -1.0})
    with pytest.raises(ValueError, match="step_size must be > 0") as info:
        for _ in range(100):
            manager.get_steps()
    assert isinstance(info.value.__cause__, RemoteTraceback)


@pytest.mark.timeout(60)
def test_env_parameters_reach_the_env_and_stats_come_back(env_manager_factory):
    manager = env_manager_factory(make_factory(SimpleEnvironment), 2)
    manager.reset()
    manager.set_env_parameters({"step_size": ConstantSettings(value=0.5)})
    stats = {}
    for _ in range(50):
        for step in manager.get_steps():
            stats.update(step.environment_stats)
        if "Environment/Param/step_size" in stats:
            break
    assert stats["Environment/Param/step_size"][0][0] == pytest.approx(0.5)


@pytest.mark.timeout(60)
def test_training_behaviors_lists_every_behavior(env_manager_factory):
    names = ("Walker", "Runner")
    manager = env_manager_factory(make_factory(SimpleEnvironment, behavior_names=names), 2)
    assert set(manager.training_behaviors) == set(names)
    manager.reset()
    steps = manager.first_step_infos
    assert {step.worker_id for step in steps} == {0, 1}
    assert all(set(step.current_all_step_result) == set(names) for step in steps)


@pytest.mark.timeout(30)
def test_sigkilled_worker_raises_worker_died_error(run_options, env_manager_factory):
    # step_timeout_s is far beyond the test's timeout: only the sentinel can notice in time.
    run_options.env_settings.max_lifetime_restarts = 0  # no restart: the death surfaces
    manager = env_manager_factory(make_factory(SimpleEnvironment, step_sleep_s=0.01), 2, step_timeout_s=600)
    manager.reset()
    victim = manager.worker_pids[1]
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(WorkerDiedError) as info:
        for _ in range(10_000):
            manager.get_steps()
    message = str(info.value)
    assert f"env worker 1 (pid {victim}) was killed by SIGKILL" in message
    assert "out of memory?" in message
    assert info.value.exitcode == -signal.SIGKILL


@pytest.mark.timeout(30)
def test_worker_exiting_by_itself_raises_worker_died_error(run_options, env_manager_factory):
    run_options.env_settings.max_lifetime_restarts = 0
    factory = make_factory(HardExitEnvironment, exit_code=7, after_steps=3, only_worker=0)
    manager = env_manager_factory(factory, 2, step_timeout_s=600)
    manager.reset()
    with pytest.raises(WorkerDiedError, match=r"env worker 0 \(pid \d+\) exited with code 7"):
        for _ in range(10_000):
            manager.get_steps()


@pytest.mark.timeout(30)
def test_close_ladder_kills_a_sigterm_ignoring_worker(env_manager_factory, caplog):
    factory = make_factory(HangingEnvironment, ignore_sigterm=True, after_steps=1, only_worker=1)
    manager = env_manager_factory(factory, 2, shutdown_timeout_s=1.0, kill_grace_s=1.0)
    manager.reset()
    manager.get_steps()  # worker 0 answers; worker 1 hangs in its first step
    hung = manager.worker_pids[1]
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        manager.close()
    elapsed = time.monotonic() - started
    assert not _alive(hung)
    assert elapsed < 1.0 + 1.0 + 1.0  # shutdown_timeout_s + kill_grace_s + the kill itself
    reports = [r.getMessage() for r in caplog.records if "Zombie worker report" in r.getMessage()]
    assert any(f"env worker 1 (pid {hung})" in r and "STEP" in r and "SIGTERM" in r for r in reports)
    assert any(f"env worker 1 (pid {hung})" in r and "SIGKILL" in r for r in reports)
    manager.close()  # twice is harmless


@pytest.mark.timeout(120)
def test_unity_exception_restarts_the_worker_within_quota(env_manager_factory, tmp_path):
    factory = make_factory(
        UnexpectedExceptionEnvironment,
        exception_type=UnityCommunicationException,
        after_steps=20,
        only_worker=1,
        once_file=str(tmp_path / "fired"),
    )
    manager = env_manager_factory(factory, 2)
    first_pid = manager.worker_pids[1]
    check_environment_trains(manager, success_threshold=0.7, max_steps=3000)
    assert (tmp_path / "fired").exists()
    assert manager.worker_pids[1] != first_pid


@pytest.mark.timeout(60)
def test_unity_exception_surfaces_when_the_quota_is_used_up(run_options, env_manager_factory):
    run_options.env_settings.max_lifetime_restarts = 0
    factory = make_factory(
        UnexpectedExceptionEnvironment, exception_type=UnityCommunicationException, after_steps=3
    )
    manager = env_manager_factory(factory, 1)
    manager.reset()
    with pytest.raises(UnityCommunicationException) as info:
        for _ in range(1000):
            manager.get_steps()
    assert any("no restarts left" in note for note in info.value.__notes__)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
