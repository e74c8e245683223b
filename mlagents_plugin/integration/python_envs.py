"""Python environments as envs: ``env_manager: {env: "package.module:factory", env_kwargs: {...}}``.

The factory is called like ML-Agents' own env factories,
``factory(worker_id, side_channels, **env_kwargs) -> BaseEnv``. It is resolved here, in the
trainer, and shipped to the workers like any factory (NOTE [ Shipping env factories ] in
core/factories.py).
"""
import functools
import importlib
import traceback
from typing import Any, Callable, Dict, List

from mlagents_envs.base_env import BaseEnv
from mlagents_envs.side_channel.side_channel import SideChannel

from mlagents_plugin.core.settings import ConfigError

EnvFactory = Callable[[int, List[SideChannel]], BaseEnv]


def resolve(spec: str) -> Callable[..., BaseEnv]:
    """Import ``package.module:factory`` in this process; say what is wrong if it cannot be used
    (ConfigError, in one line).

    Run before ML-Agents creates the run folder, so that a fixed YAML runs again without
    ``--force``.
    """
    module_name, _, attr_path = spec.partition(":")
    where = f"env_manager.env: {spec!r}"
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and module_name.startswith(e.name):
            raise ConfigError(
                f"{where}: there is no module '{e.name}'. Is it installed, or on PYTHONPATH "
                "(or in the directory you run mlagents-learn from)?"
            ) from None
        raise ConfigError(f"{where}: importing '{module_name}' failed: {_located(e)}") from None
    except BaseException as e:  # SyntaxError, or whatever the module raises while it loads
        raise ConfigError(f"{where}: importing '{module_name}' failed: {_located(e)}") from None
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(f"{where}: module '{module_name}' has no '{attr_path}'.") from None
    if not callable(target):
        raise ConfigError(
            f"{where}: '{attr_path}' is a {type(target).__name__}, not a function or class that "
            "builds an env."
        )
    return target


def _located(error: BaseException) -> str:
    """``error`` with where it happened: the line of a SyntaxError, else the innermost frame."""
    if isinstance(error, SyntaxError):
        return f"SyntaxError at {error.filename}, line {error.lineno}: {error.msg}"
    frames = traceback.extract_tb(error.__traceback__)
    at = f" (at {frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
    return f"{type(error).__name__}: {error}{at}"


def make_env_factory(spec: str, env_kwargs: Dict[str, Any]) -> EnvFactory:
    return functools.partial(resolve(spec), **env_kwargs)
