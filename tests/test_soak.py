"""Soak: random faults of every kind while a real PPO trainer learns through 4 workers."""
import collections

import pytest
from mlagents.trainers.settings import RunOptions

from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.local.supervisor import SupervisedEnvManager
from mlagents_plugin.testing import RandomFaultEnvironment, make_factory
from mlagents_plugin.testing.training import train

CAUSE_OF_KIND = {"exception": "restart_on", "exit": "died", "hang": "hung", "unity": "unity"}
PID_STAT = "Environment/Env Worker Pid"


class SoakError(Exception):
    pass


class CheckedManager(SupervisedEnvManager):
    """Checks that every step it hands to the trainer comes from the process now in its slot."""

    def _step(self):
        steps = super()._step()
        for step in steps:
            (pid, _), = step.environment_stats[PID_STAT][-1:]
            assert int(pid) == self.worker_pids[step.worker_id], "a step from a replaced worker"
        return steps


@pytest.mark.timeout(180)
def test_training_survives_random_faults(tmp_path):
    fault_log = tmp_path / "faults.log"
    fault_log.touch()
    run_options = RunOptions()
    run_options.env_settings.max_lifetime_restarts = -1
    run_options.env_settings.restarts_rate_limit_n = -1
    factory = make_factory(
        RandomFaultEnvironment,
        fault_log=str(fault_log),
        fault_probability=0.01,
        max_faults=16,
        exception_type=SoakError,
        report_pid=True,
    )
    settings = EnvManagerSettings(
        restart_on=["SoakError"], restart_backoff_s=0.0, step_timeout_s=1.5, kill_grace_s=1.0
    )
    manager = CheckedManager(factory, run_options, 4, settings)
    try:
        result = train(manager, max_steps=4000)
        injected = fault_log.read_text().split("\n")[:-1]
        for _ in range(2000):  # the last faults may still be on their way to being noticed
            if sum(manager.restart_counts.values()) >= len(injected):
                break
            manager.get_steps()
    finally:
        manager.close()
    assert len(injected) == 16
    expected = collections.Counter(CAUSE_OF_KIND[line.split()[2]] for line in injected)
    assert manager.restart_counts == dict(expected)
    assert result.final_rewards["Simple"] > 0.5
