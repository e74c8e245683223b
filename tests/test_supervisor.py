"""SupervisedEnvManager's own wording of deaths, and its close ladder (what every backend does:
test_contract.py)."""
import logging
import time

import psutil
import pytest

from mlagents_plugin.testing import (
    HangingEnvironment,
    make_factory,
)


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
