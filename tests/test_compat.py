"""The ML-Agents internals we rely on (compat.py), exercised on ML-Agents' real classes."""
import numpy as np
import pytest
from mlagents.trainers.agent_processor import AgentManager
from mlagents.trainers.policy.torch_policy import TorchPolicy
from mlagents.trainers.settings import NetworkSettings
from mlagents.trainers.stats import StatsReporter
from mlagents.trainers.torch_entities.networks import SimpleActor

from mlagents_plugin.integration import compat
from mlagents_plugin.testing import SimpleEnvironment


@pytest.mark.fast
def test_nothing_compat_relies_on_is_missing():
    assert compat.check() == []


@pytest.mark.fast
def test_dropping_a_workers_trajectories_keeps_the_others():
    env = SimpleEnvironment(num_agents=3)
    spec = env.behavior_specs["Simple"]
    policy = TorchPolicy(0, spec, NetworkSettings(), SimpleActor, {"conditional_sigma": False, "tanh_squash": False})
    manager = AgentManager(policy, "Simple", StatsReporter("compat-test"))
    for _ in range(3):
        for worker_id in (1, 12):  # 12 shares the prefix "agent_1" with 1: it must survive
            decision_steps, terminal_steps = env.get_steps("Simple")
            action = policy.get_action(decision_steps, worker_id)
            manager.add_experiences(decision_steps, terminal_steps, worker_id, action)
        env.set_actions("Simple", action.env_action)
        env.step()
    assert any(gid.startswith("agent_1-") for gid in manager._experience_buffers)

    compat.drop_worker_trajectories({"Simple": manager}, 1)

    tracked = set(manager._experience_buffers) | set(manager._last_step_result)
    assert not any(gid.startswith("agent_1-") for gid in tracked)
    assert {gid for gid in tracked if gid.startswith("agent_12-")} == {
        f"agent_12-{i}" for i in np.arange(3)
    }
