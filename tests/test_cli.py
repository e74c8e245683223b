"""The real `mlagents-learn` CLI, as a subprocess: the plugin is picked up, the YAML section is
accepted or refused, and a run ends with valid .onnx models."""
import onnx
import pytest
import yaml
from helpers import run_learn, write_config

from mlagents_plugin.core import platform

pytestmark = pytest.mark.e2e


def python_env_config(tmp_path, section=None, **env_manager):
    def edit(config):
        config["behaviors"]["Simple"]["max_steps"] = 1000
        config["env_manager"].update(env_manager)
        if section is not None:
            config["env_manager"] = section

    return write_config(tmp_path, "simple_python_env.yaml", edit)


@pytest.mark.timeout(300)
def test_run_uses_supervised_manager_and_writes_valid_onnx(tmp_path):
    result = run_learn(tmp_path, python_env_config(tmp_path, shutdown_timeout_s=5), "--num-envs=2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    path = platform.path_name()  # "Linux hardening", or "portable (linux)" with MLAGENTS_PLUGIN_PORTABLE=1
    assert f"Env manager: SupervisedEnvManager (mlagents-plugin, {path}) with 2 worker(s)" in result.stdout
    run_dir = tmp_path / "results" / "run"
    effective = yaml.safe_load((run_dir / "env_manager.yaml").read_text())
    assert effective["manager"] == "SupervisedEnvManager"
    assert effective["env_manager"]["shutdown_timeout_s"] == 5.0
    assert effective["env_manager"]["step_timeout_s"] == 70.0  # --timeout-wait 60 + 10
    assert (run_dir / "configuration.yaml").exists()
    models = [run_dir / "Simple.onnx", *sorted((run_dir / "Simple").glob("Simple-*.onnx"))]
    assert len(models) == 2
    for model in models:
        onnx.checker.check_model(onnx.load(str(model)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "section, expected",
    [
        ({"shutdwon_timeout_s": 3}, "Unknown setting 'shutdwon_timeout_s'"),
        ({"kill_grace_s": "soon"}, "'kill_grace_s' must be <class 'float'>"),
        ({"start_method": "threads"}, "'start_method' must be one of forkserver, spawn, fork (got 'threads')"),
        ({"step_timeout_s": -1}, "'step_timeout_s' must be > 0"),
        ("fast", "must be a mapping of settings"),
    ],
    ids=["unknown-key", "wrong-type", "bad-choice", "negative", "not-a-mapping"],
)
def test_invalid_section_stops_the_run_before_anything_starts(tmp_path, section, expected):
    result = run_learn(tmp_path, python_env_config(tmp_path, section), "--num-envs=2", timeout=100)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "TrainerConfigError" in output and expected in output
    if "Unknown" in expected:
        assert "Valid settings are: enabled, backend, start_method" in output
    assert not (tmp_path / "results").exists()
