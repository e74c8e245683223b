"""Test fixtures for env managers and envs: shipped, so users can test their own setups.

- ``SimpleEnvironment`` and the misbehaving variants in ``faulty_envs``;
- ``make_factory``: an env factory (picklable, for worker processes) for any of them;
- ``train`` / ``check_environment_trains``: a real PPO trainer through any env manager (loaded
  on first use: they import ML-Agents' trainers and torch, which envs and workers do not need);
- the pytest plugin (``mlagents_plugin.testing.pytest_plugin``, registered through the
  ``pytest11`` entry point) with fixtures built on these.
"""
import functools
import importlib
from typing import Any, Callable, List

from mlagents_envs.base_env import BaseEnv
from mlagents_envs.side_channel.side_channel import SideChannel

from mlagents_plugin.testing.faulty_envs import (
    HangingEnvironment,
    HardExitEnvironment,
    LockHoldingError,
    PlayerLaunchingEnvironment,
    RandomFaultEnvironment,
    SlowClosingEnvironment,
    TwoArgumentError,
    UnexpectedExceptionEnvironment,
    UnpicklableExceptionEnvironment,
    raising_factory,
)
from mlagents_plugin.testing.simple_env import SimpleEnvironment, simple_env

ENVIRONMENTS = {
    cls.__name__: cls
    for cls in (
        SimpleEnvironment,
        HangingEnvironment,
        HardExitEnvironment,
        PlayerLaunchingEnvironment,
        RandomFaultEnvironment,
        SlowClosingEnvironment,
        UnexpectedExceptionEnvironment,
        UnpicklableExceptionEnvironment,
    )
}


def make_factory(
    env_class: Callable[..., BaseEnv] = SimpleEnvironment, **kwargs: Any
) -> Callable[[int, List[SideChannel]], BaseEnv]:
    """An ML-Agents env factory ``(worker_id, side_channels) -> env_class(...)``."""
    return functools.partial(_build, env_class, kwargs)


def testing_env(
    worker_id: int, side_channels: List[SideChannel], env_class: str = "SimpleEnvironment", **kwargs: Any
) -> BaseEnv:
    """A YAML-friendly factory for any env here, e.g.
    ``env_manager: {env: "mlagents_plugin.testing:testing_env",
    env_kwargs: {env_class: HangingEnvironment, after_steps: 100}}``."""
    if env_class not in ENVIRONMENTS:
        raise ValueError(f"env_class must be one of {sorted(ENVIRONMENTS)}, not {env_class!r}")
    return ENVIRONMENTS[env_class](worker_id, side_channels, **kwargs)


def _build(
    env_class: Callable[..., BaseEnv], kwargs: dict, worker_id: int, side_channels: List[SideChannel]
) -> BaseEnv:
    return env_class(worker_id, side_channels, **kwargs)


_TRAINING = ("TrainingResult", "check_environment_trains", "train")


def __getattr__(name: str) -> Any:
    if name in _TRAINING:
        return getattr(importlib.import_module("mlagents_plugin.testing.training"), name)
    raise AttributeError(f"module 'mlagents_plugin.testing' has no attribute {name!r}")


__all__ = [
    "HangingEnvironment",
    "HardExitEnvironment",
    "LockHoldingError",
    "PlayerLaunchingEnvironment",
    "RandomFaultEnvironment",
    "SimpleEnvironment",
    "SlowClosingEnvironment",
    "TrainingResult",
    "TwoArgumentError",
    "UnexpectedExceptionEnvironment",
    "UnpicklableExceptionEnvironment",
    "check_environment_trains",
    "make_factory",
    "raising_factory",
    "simple_env",
    "testing_env",
    "train",
]
