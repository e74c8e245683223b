"""SupervisedEnvManager's own wording of deaths, and its close ladder (what every backend does:
test_contract.py)."""
import logging
import os
import signal
import time

import psutil
import pytest

from mlagents_plugin.core.errors import WorkerDiedError
from mlagents_plugin.testing import (
    HangingEnvironment,
    HardExitEnvironment,
    SimpleEnvironment,
    make_factory,
)


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


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
