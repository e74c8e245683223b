"""pytest fixtures for testing ML-Agents envs and trainers with SupervisedEnvManager.

Registered through the ``pytest11`` entry point: installing mlagents-plugin makes them
available in any test suite. pytest loads this module in every session of the environment, so
it imports nothing heavy: ML-Agents' trainers (and torch with them) load when a fixture is used.
"""
from typing import TYPE_CHECKING, Any, Callable, Iterator, List

import pytest

if TYPE_CHECKING:
    from mlagents.trainers.settings import RunOptions

    from mlagents_plugin.core.manager import SupervisedManagerBase


@pytest.fixture
def run_options() -> "RunOptions":
    """ML-Agents' default RunOptions, as ``mlagents-learn`` with no arguments builds them."""
    from mlagents.trainers.settings import RunOptions

    return RunOptions()


@pytest.fixture
def env_manager_factory(
    run_options: "RunOptions",
) -> Iterator[Callable[..., "SupervisedManagerBase"]]:
    """``make(env_factory, n_env=1, **settings)`` -> an env manager, closed at teardown.

    ``settings`` are ``env_manager:`` settings; ``backend="ray"`` gives a RayEnvManager (on the
    Ray this process is connected to, or one it starts on loopback), otherwise a
    SupervisedEnvManager, exactly as ``mlagents-learn`` would build them."""
    from mlagents_plugin.core.settings import EnvManagerSettings
    from mlagents_plugin.integration.plugin import env_manager_class

    managers: List["SupervisedManagerBase"] = []

    def make(env_factory: Callable[..., Any], n_env: int = 1, **settings: Any) -> "SupervisedManagerBase":
        manager_settings = EnvManagerSettings(**settings)
        manager = env_manager_class(manager_settings)(env_factory, run_options, n_env, manager_settings)
        managers.append(manager)
        return manager

    yield make
    for manager in managers:
        manager.close()
