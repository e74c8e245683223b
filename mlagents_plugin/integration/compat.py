"""Every use of ML-Agents 1.1.0 internals, in one place.

The rest of the package uses ML-Agents' public classes only (EnvManager, BaseEnv, RunOptions,
StatsReporter). What follows reaches into module globals and private attributes that
ML-Agents does not promise to keep; ``check()`` verifies each of them, and
``python -m mlagents_plugin doctor`` runs it, so an ML-Agents upgrade fails loudly here rather
than subtly elsewhere.
"""
import itertools
import os
from typing import Any, Callable, Dict, List

import cattr
import yaml
from mlagents.trainers import learn
from mlagents.trainers import settings as mla_settings
from mlagents.trainers.agent_processor import AgentManager
from mlagents.trainers.behavior_id_utils import get_global_agent_id
from mlagents.trainers.exception import TrainerConfigError
from mlagents.trainers.settings import EnvironmentSettings, strict_to_cls
from mlagents.trainers.torch_entities import model_serialization
from mlagents_envs import logging_util

logger = logging_util.get_logger(__name__)

_MARK = "_mlagents_plugin_hook"

# The class mlagents-learn would build, saved before ``install_env_manager`` replaces it.
UPSTREAM_ENV_MANAGER = learn.SubprocessEnvManager


def install_yaml_section_hook(on_config: Callable[[Dict[str, Any]], None]) -> None:
    """Let ``on_config`` see (and pop keys from) the trainer YAML before ML-Agents validates it.

    ``RunOptions.from_argparse`` rejects unknown top-level keys; it reads the file through the
    module-level name ``load_config`` in ``mlagents.trainers.settings``.
    """
    original = mla_settings.load_config
    if getattr(original, _MARK, False):
        return

    def load_config(config_path: str) -> Dict[str, Any]:
        config = original(config_path)
        if isinstance(config, dict):
            on_config(config)
        return config

    setattr(load_config, _MARK, True)
    mla_settings.load_config = load_config


def install_env_manager(factory: Callable[..., Any]) -> None:
    """Make ``run_training`` build its env manager with ``factory(env_factory, options, n_env)``."""
    learn.SubprocessEnvManager = factory


def install_run_options_writer(extra_sections: Callable[[], Dict[str, Any]]) -> None:
    """Add ``extra_sections()`` to the ``configuration.yaml`` ML-Agents writes into the results
    folder, so that ``mlagents-learn results/<run-id>/configuration.yaml`` runs the same again.

    ``run_training`` writes it through the module-level name ``write_run_options`` in
    ``mlagents.trainers.learn``.
    """
    original = learn.write_run_options
    if getattr(original, _MARK, False):
        return

    def write_run_options(output_dir: str, run_options: Any) -> None:
        original(output_dir, run_options)
        path = os.path.join(output_dir, "configuration.yaml")
        if os.path.isfile(path):  # ML-Agents only warns when it cannot write it
            with open(path, "a") as f:
                yaml.safe_dump(extra_sections(), f, sort_keys=False)

    setattr(write_run_options, _MARK, True)
    learn.write_run_options = write_run_options


def allow_many_envs_without_build(allowed: Callable[[EnvironmentSettings], bool]) -> None:
    """Let ``--num-envs`` exceed 1 without ``--env`` when ``allowed(settings)`` says so.

    ML-Agents' EnvironmentSettings validator refuses num_envs > 1 without a Unity build,
    because the Editor is a single env; a Python env (``env_manager.env``) has no such limit.
    """

    def structure(d: Dict[str, Any], t: type) -> EnvironmentSettings:
        d = dict(d)
        num_envs = d.get("num_envs", 1)
        if d.get("env_path") is None and num_envs > 1:
            d["num_envs"] = 1
            env_settings = strict_to_cls(d, t)
            if not allowed(env_settings):
                raise TrainerConfigError("num_envs must be 1 if env_path is not set.")
            env_settings.num_envs = num_envs
            return env_settings
        return strict_to_cls(d, t)

    cattr.register_structure_hook(EnvironmentSettings, structure)


def use_legacy_onnx_exporter() -> None:
    """Export ``.onnx`` models with TorchScript-based exporter.

    torch 2.13's ``torch.onnx.export`` defaults to ``dynamo=True``, which needs the
    ``onnxscript`` package and, with it, would still not honour ML-Agents' opset 9. ML-Agents
    1.1.0 calls it without ``dynamo``, so the model Unity loads is never written and
    ``mlagents-learn`` exits 1 at the very end of a run. This is ML-Agents'
    ``export_policy_model`` with ``dynamo=False``.
    """
    serializer = model_serialization.ModelSerializer
    if getattr(serializer.export_policy_model, _MARK, False):
        return
    torch = model_serialization.torch

    def export_policy_model(self: Any, output_filepath: str) -> None:
        onnx_output_path = f"{output_filepath}.onnx"
        with model_serialization.exporting_to_onnx():
            torch.onnx.export(
                self.policy.actor,
                self.dummy_input,
                onnx_output_path,
                opset_version=model_serialization.SerializationSettings.onnx_opset,
                input_names=self.input_names,
                output_names=self.output_names,
                dynamic_axes=self.dynamic_axes,
                dynamo=False,
            )
        logger.info(f"Exported {onnx_output_path}")

    setattr(export_policy_model, _MARK, True)
    serializer.export_policy_model = export_policy_model


def drop_worker_trajectories(agent_managers: Dict[str, AgentManager], worker_id: int) -> None:
    """Forget every partial trajectory of ``worker_id``'s agents.

    Used when a worker is replaced: the new env reuses agent ids, so without this its first
    observations would be appended to trajectories of the env that failed.
    """
    prefix = get_global_agent_id(worker_id, "")
    for manager in agent_managers.values():
        tracked = itertools.chain(
            manager._experience_buffers,
            manager._last_step_result,
            manager._last_take_action_outputs,
            manager._episode_steps,
        )
        for global_id in {gid for gid in tracked if gid.startswith(prefix)}:
            manager._clean_agent_data(global_id)
            manager._clear_group_status_and_obs(global_id)


def check() -> List[str]:
    """What of the above no longer matches the installed ML-Agents."""
    problems = []
    expected = {
        "mlagents.trainers.settings.load_config": hasattr(mla_settings, "load_config"),
        "mlagents.trainers.learn.SubprocessEnvManager": hasattr(learn, "SubprocessEnvManager"),
        "mlagents.trainers.learn.write_run_options": hasattr(learn, "write_run_options"),
        "ModelSerializer.export_policy_model": hasattr(
            model_serialization.ModelSerializer, "export_policy_model"
        ),
        "AgentProcessor._clean_agent_data": hasattr(AgentManager, "_clean_agent_data"),
        "AgentProcessor._clear_group_status_and_obs": hasattr(
            AgentManager, "_clear_group_status_and_obs"
        ),
    }
    for name, present in expected.items():
        if not present:
            problems.append(f"ML-Agents no longer has {name}; this ML-Agents is not supported.")
    return problems
