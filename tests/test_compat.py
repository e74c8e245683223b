"""The ML-Agents internals we rely on (integration/compat.py), exercised on ML-Agents' real classes,
and the versions of ML-Agents the plugin runs with (integration/entry.py)."""
import subprocess
import sys

import numpy as np
import pytest
from mlagents.trainers import cli_utils, learn
from mlagents.trainers import settings as mla_settings
from mlagents.trainers.agent_processor import AgentManager
from mlagents.trainers.policy.torch_policy import TorchPolicy
from mlagents.trainers.settings import NetworkSettings
from mlagents.trainers.stats import StatsReporter
from mlagents.trainers.torch_entities import model_serialization
from mlagents.trainers.torch_entities.networks import SimpleActor

from mlagents_plugin.core.internals import Internal, original
from mlagents_plugin.integration import compat, entry, plugin
from mlagents_plugin.local import fork_server
from mlagents_plugin.ray import local as ray_local
from mlagents_plugin.testing import SimpleEnvironment


@pytest.mark.fast
def test_nothing_compat_relies_on_is_missing():
    assert compat.check() == []


@pytest.mark.fast
def test_check_reports_a_missing_internal_and_a_changed_call(monkeypatch):
    monkeypatch.setattr(compat, "INTERNALS", [
        Internal("mlagents.trainers.learn:no_such_function", "test"),
        Internal("mlagents.trainers.learn:run_training", "test", "NoSuchManager("),
        Internal("mlagents.no_such_module:x", "test"),
    ])
    problems = compat.check()
    assert len(problems) == 3
    assert "mlagents.trainers.learn:no_such_function is missing" in problems[0]
    assert "run_training no longer mentions 'NoSuchManager('" in problems[1]
    assert "this ML-Agents is not supported" in problems[2]


@pytest.mark.fast
def test_a_timed_method_is_checked_by_its_own_source(monkeypatch):
    """mlagents-envs' ``@timed`` keeps the method in its wrapper's closure: the method's source
    is read, not the wrapper's."""
    evaluate = "mlagents.trainers.policy.torch_policy:TorchPolicy.evaluate"
    monkeypatch.setattr(compat, "INTERNALS", [
        Internal(evaluate, "test", "self.retrieve_memories("),
        Internal(evaluate, "test", "hierarchical_timer("),  # the wrapper's
    ])
    assert compat.check() == [
        f"ML-Agents: {evaluate} no longer mentions 'hierarchical_timer('; this ML-Agents is not supported (compat.py)."
    ]


@pytest.mark.fast
def test_the_latest_registration_wins_and_hooks_wrap_ml_agents_own_functions(ml_agents_hooks, tmp_path):
    plugin.register()
    first = learn.SubprocessEnvManager.__self__
    plugin.register()
    latest = learn.SubprocessEnvManager.__self__
    assert latest is not first
    config_file = tmp_path / "config.yaml"
    # spawn: no fork server to start (the fast tier starts no process)
    config_file.write_text("behaviors: {}\nenv_manager:\n  step_timeout_s: 7\n  start_method: spawn\n")
    config = mla_settings.load_config(str(config_file))
    assert "env_manager" not in config  # taken out once, by the latest registration
    assert latest.settings.step_timeout_s == 7 and first.settings.step_timeout_s is None
    # each hook wraps ML-Agents' original, not the previous registration's hook
    assert original(mla_settings.load_config) is cli_utils.load_config


@pytest.mark.fast
def test_upstreams_export_runs_with_the_legacy_exporter(ml_agents_hooks):
    """The run's .onnx files themselves are checked in test_cli.py."""
    plugin.register()
    wrapper = model_serialization.ModelSerializer.export_policy_model
    assert original(wrapper).__module__ == model_serialization.__name__  # upstream's own body
    export = model_serialization.torch.onnx.export
    with compat._legacy_onnx_export():
        assert model_serialization.torch.onnx.export.keywords == {"dynamo": False}
    assert model_serialization.torch.onnx.export is export


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


@pytest.mark.fast
def test_nothing_the_fork_server_relies_on_in_this_python_is_missing(monkeypatch):
    assert fork_server.check() == []
    monkeypatch.setattr(fork_server, "INTERNALS", [
        Internal("multiprocessing.forkserver:ForkServer.__init__", "test", "self._no_such_field"),
    ])
    assert fork_server.check() == [
        f"Python {sys.version.split()[0]}: multiprocessing.forkserver:ForkServer.__init__ no longer mentions "
        "'self._no_such_field' (local/fork_server.py)."
    ]


@pytest.mark.fast
def test_nothing_the_loopback_ray_relies_on_is_missing():
    pytest.importorskip("ray", reason="the [ray] extra is not installed")
    assert ray_local.check() == []


UNSUPPORTED_ML_AGENTS = """
import importlib.metadata, sys
real = importlib.metadata.version
importlib.metadata.version = lambda name: "0.30.0" if name in ("mlagents", "mlagents-envs") else real(name)
from mlagents.trainers.learn import main
sys.argv = ["mlagents-learn", sys.argv[1], "--run-id=run", "--force"]
main()
"""


@pytest.mark.timeout(120)
def test_an_unsupported_ml_agents_stops_mlagents_learn_at_start_with_one_line(tmp_path):
    """NOTE [ Supported ML-Agents versions ]: the real mlagents-learn, told by importlib.metadata
    that ML-Agents is 0.30.0, stops with one line naming both versions, before it makes anything."""
    config = tmp_path / "config.yaml"
    config.write_text("behaviors: {}\n")
    result = subprocess.run(
        [sys.executable, "-c", UNSUPPORTED_ML_AGENTS, str(config)], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 1
    ours = [line for line in result.stderr.splitlines() if "mlagents-plugin" in line]
    assert ours == [
        "mlagents-plugin: this version supports ML-Agents 1.0.0 and 1.1.0 (mlagents and mlagents-envs of the same "
        "version); installed: mlagents 0.30.0, mlagents-envs 0.30.0: install one of them (pip install "
        "mlagents==1.1.0), or remove the plugin (pip uninstall mlagents-plugin)."
    ]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.fast
def test_a_supported_version_whose_internals_moved_is_refused_in_one_line(monkeypatch):
    assert entry.unsupported() is None
    monkeypatch.setattr(compat, "INTERNALS", [Internal("mlagents.trainers.learn:no_such_function", "test")])
    refusal = entry.unsupported()
    assert refusal is not None and "\n" not in refusal
    assert "mlagents.trainers.learn:no_such_function is missing" in refusal
