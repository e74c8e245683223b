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
    "section, args, expected",
    [
        ({"shutdwon_timeout_s": 3}, [], "env_manager: unknown setting 'shutdwon_timeout_s'; the settings are "
         "enabled, backend, start_method"),
        ({"kill_grace_s": "soon"}, [], "env_manager.kill_grace_s: expected a number of seconds above 0, at most "
         "86400 (one day), got 'soon'"),
        ({"start_method": "threads"}, [],
         "env_manager.start_method: expected one of forkserver, spawn, fork, got 'threads'"),
        ({"step_timeout_s": -1}, [], "env_manager.step_timeout_s: expected a number of seconds above 0, at most "
         "86400 (one day), got -1.0"),
        ("fast", [], "env_manager: expected a mapping of settings (enabled, backend,"),
        ({}, ["--num-envs=0"], "--num-envs 0: a run needs at least one env"),
        ({}, ["--num-envs=-3"], "--num-envs -3: a run needs at least one env"),
        ({}, ["--timeout-wait=1000000000"], "--timeout-wait=1000000000 is too long for the deadlines derived"),
    ],
    ids=["unknown-key", "wrong-type", "bad-choice", "negative", "not-a-mapping", "no-envs", "negative-envs",
         "timeout-wait"],
)
def test_a_configuration_error_is_one_line_before_anything_starts(tmp_path, section, args, expected):
    config = python_env_config(tmp_path, section if section else None)
    result = run_learn(tmp_path, config, *(args or ["--num-envs=2"]), timeout=100)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("mlagents-learn:")]
    assert len(errors) == 1 and "Traceback" not in result.stdout + result.stderr, result.stderr[-3000:]
    assert errors[0].startswith(f"mlagents-learn: configuration error: {expected}")
    assert errors[0].endswith("(--debug shows where)")
    assert "Traceback" not in result.stdout + result.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.timeout(120)
def test_debug_shows_where_a_configuration_error_was_raised(tmp_path):
    result = run_learn(tmp_path, python_env_config(tmp_path, {"kill_grace_s": "soon"}), "--debug", timeout=100)
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "ConfigError: env_manager.kill_grace_s: expected" in result.stderr
