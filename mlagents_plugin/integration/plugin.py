"""ML-Agents entry points: stock ``mlagents-learn`` builds its env manager through us.

ML-Agents loads ``mlagents.trainer_type`` plugins in ``parse_command_line``, before it reads
the YAML. Our entry point installs the hooks (see compat.py) that take the ``env_manager:``
section out of the YAML, validate it, and make ``run_training`` call ``Run.make_env_manager``
where it would construct ``SubprocessEnvManager``; and it returns this package's trainer types
(trainers/, docs/trainers.md).
"""
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

from mlagents.trainers.env_manager import EnvironmentStep, EnvManager
from mlagents.trainers.settings import EnvironmentSettings, RunOptions, TrainerSettings
from mlagents_envs import logging_util
from mlagents_envs.base_env import BaseEnv, BehaviorName, BehaviorSpec
from mlagents_envs.side_channel.side_channel import SideChannel

from mlagents_plugin import fast_protobuf
from mlagents_plugin.core import platform, signals
from mlagents_plugin.core.settings import (
    SECTION,
    ConfigError,
    EnvManagerSettings,
    parse_section,
    write_effective_settings,
)
from mlagents_plugin.integration import compat, python_envs
from mlagents_plugin.local import fork_server, rpc_server
from mlagents_plugin.local.supervisor import SupervisedEnvManager, start_fork_server

logger = logging_util.get_logger(__name__)


def register() -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The ``mlagents.trainer_type`` entry point: install the hooks; ``ppo_fast`` is ML-Agents'
    PPO with its settings (``PPOSettings``) and a faster update.

    The hooks share one ``Run``; registering again (another run in this process) installs new
    hooks around ML-Agents' originals, and the latest registration wins."""
    run = Run()
    compat.install_yaml_section_hook(run.take_section)
    compat.install_env_settings_check(run.check_env_settings)
    compat.install_config_errors()
    compat.install_env_manager(run.make_env_manager)
    compat.install_run_options_writer(lambda: {SECTION: run.settings.as_dict()})
    compat.use_legacy_onnx_exporter()
    try:  # torch: only mlagents-learn (and ML-Agents' own trainers) get here
        from mlagents.trainers.ppo.optimizer_torch import PPOSettings
        from mlagents.trainers.ppo.trainer import TRAINER_NAME as PPO

        from mlagents_plugin.trainers.ppo_fast import TRAINER_NAME, FastPPOTrainer
    except ImportError as e:  # the env manager's hooks are in: only the trainer types are missing
        logger.warning(f"mlagents-plugin's trainer types are not available ({type(e).__name__}: {e}).")
        return {}, {}
    compat.install_trainer_type_aliases({TRAINER_NAME: PPO})
    return {TRAINER_NAME: FastPPOTrainer}, {TRAINER_NAME: PPOSettings}


class Run:
    """One ``mlagents-learn`` run: the ``env_manager:`` section of its YAML (defaults without
    one), and the env manager it builds from it."""

    def __init__(self, settings: Optional[EnvManagerSettings] = None):
        self.settings = settings or EnvManagerSettings()

    def take_section(self, config: Dict[str, Any]) -> None:
        """Take the section out of the YAML (ML-Agents refuses unknown keys) and check it."""
        self.settings = settings = parse_section(config.pop(SECTION, None))
        if settings.env is not None:
            python_envs.resolve(settings.env)  # fails here, before ML-Agents makes the run folder
        if settings.enabled:
            env_manager_class(settings)  # backend: ray without Ray installed fails here too
        start_method = settings.start_method or platform.default_start_method()
        if settings.enabled and settings.backend == "subprocess" and start_method == "forkserver":
            # What the env factory will need: the Python env's module, or UnityEnvironment.
            env_module = settings.env.partition(":")[0] if settings.env else "mlagents_envs.environment"
            start_fork_server([env_module])  # NOTE [ Worker start-up ]

    def check_env_settings(self, env_settings: EnvironmentSettings) -> None:
        """Refuse ``--env``/``--num-envs`` combinations that cannot train, before the results
        folder exists (ML-Agents' own check, which we take over, refuses more)."""
        python_env = self.settings.enabled and self.settings.env is not None
        self.settings.resolved_for(env_settings.timeout_wait)  # deadlines that can work
        here = self.settings.backend == "subprocess" or self.settings.ray.address is None
        problem = rpc_server.cannot_listen_on(self.settings.listen)
        if self.settings.enabled and here and problem:  # on a cluster, another node may have it
            raise ConfigError(f"{SECTION}.listen: {problem}")
        if env_settings.num_envs < 1:
            raise ConfigError(f"--num-envs {env_settings.num_envs}: a run needs at least one env")
        if python_env and env_settings.env_path is not None:
            raise ConfigError(
                f"both --env ({env_settings.env_path}) and {SECTION}.env ({self.settings.env}) are "
                "set; a run trains on one environment: remove one"
            )
        if env_settings.num_envs > 1 and env_settings.env_path is None and not python_env:
            raise ConfigError(
                f"--num-envs {env_settings.num_envs} needs a Unity build (--env): the Editor is "
                f"one env (or train on a Python env: {SECTION}.env)"
            )

    def make_env_manager(
        self,
        env_factory: Callable[[int, List[SideChannel]], BaseEnv],
        run_options: RunOptions,
        n_env: int = 1,
    ) -> EnvManager:
        """What ``mlagents-learn`` calls instead of ``SubprocessEnvManager(...)``."""
        if not self.settings.enabled:
            ignored = self.settings.ignored_when_disabled()
            logger.info(
                f"{SECTION}.enabled is false: using ML-Agents' SubprocessEnvManager, whose workers "
                "listen on every address"
                + (f"; these settings do not apply to it: {', '.join(ignored)}." if ignored else ".")
            )
            return compat.UPSTREAM_ENV_MANAGER(env_factory, run_options, n_env)
        try:
            return self._make_env_manager(env_factory, run_options, n_env)
        except KeyboardInterrupt:  # whatever had started is stopped (the manager's __init__)
            logger.info("Interrupted while the env workers were starting; they are stopped.")
            return InterruptedEnvManager()

    def _make_env_manager(
        self,
        env_factory: Callable[[int, List[SideChannel]], BaseEnv],
        run_options: RunOptions,
        n_env: int,
    ) -> EnvManager:
        settings = self.settings.resolved(run_options)
        if settings.env is not None:
            env_factory = python_envs.make_env_factory(settings.env, settings.env_kwargs)
        manager_class = env_manager_class(settings)
        signals.install()  # NOTE [ Trainer signals ]
        slow = fast_protobuf.slow_backend_warning()
        if slow:
            logger.warning("!" * 80 + "\n" + slow + "\n" + "!" * 80)
        path = write_effective_settings(settings, run_options, manager_class.__name__)
        described = ", ".join(f"{k}={v!r}" for k, v in settings.as_dict().items())
        logger.info(
            f"Env manager: {manager_class.__name__} (mlagents-plugin, {platform.path_name()}) with "
            f"{n_env} worker(s){_workers_start_from(settings)}; {described}"
            + (f"; written to {path}" if path else "")
        )
        return manager_class(env_factory, run_options, n_env, settings)


def _workers_start_from(settings: EnvManagerSettings) -> str:
    """Where this process's workers come from (NOTE [ A fork server forked from the trainer ])."""
    if settings.backend != "subprocess":
        return ""
    if settings.start_method == "forkserver":
        return f", started from {fork_server.describe()}"
    return f", each started by {settings.start_method}"


class InterruptedEnvManager(EnvManager):
    """What ``mlagents-learn`` gets when Ctrl-C lands while its env manager is built: the
    workers are gone already, and the first call raises KeyboardInterrupt again, inside
    TrainerController's ``try``, which handles it as any Ctrl-C (exit 0, run logs written).
    Raised from ``run_training``'s set-up instead, it would end in a traceback (exit -2)."""

    def _step(self) -> List[EnvironmentStep]:
        raise KeyboardInterrupt

    def _reset_env(self, config: Optional[Dict] = None) -> List[EnvironmentStep]:
        raise KeyboardInterrupt

    def set_env_parameters(self, config: Optional[Dict] = None) -> None:
        raise KeyboardInterrupt

    @property
    def training_behaviors(self) -> Dict[BehaviorName, BehaviorSpec]:
        raise KeyboardInterrupt

    def on_training_started(self, behavior_name: str, trainer_settings: TrainerSettings) -> None:
        raise KeyboardInterrupt

    def close(self) -> None:
        pass


def env_manager_class(settings: EnvManagerSettings) -> Type[EnvManager]:
    """The class of ``settings.backend``: SupervisedEnvManager, or RayEnvManager (needs Ray)."""
    if settings.backend == "subprocess":
        return SupervisedEnvManager
    try:
        from mlagents_plugin.ray.manager import RayEnvManager
    except ImportError as e:
        raise ConfigError(f"{SECTION}.backend is 'ray'. {e}") from None
    return RayEnvManager
