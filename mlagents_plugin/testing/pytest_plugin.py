"""pytest fixtures for testing ML-Agents envs and trainers with SupervisedEnvManager.

Registered through the ``pytest11`` entry point: installing mlagents-plugin makes them
available in any test suite. pytest loads this module in every session of the environment, so
it imports nothing heavy: ML-Agents' trainers (and torch with them) load when a fixture is used.
"""
from typing import TYPE_CHECKING, Any, Callable, Iterator, List

import pytest

if TYPE_CHECKING:
    from mlagents.trainers.settings import RunOptions

    from mlagents_plugin.local.supervisor import SupervisedEnvManager


@pytest.fixture
def run_options() -> "RunOptions":
    """ML-Agents' default RunOptions, as ``mlagents-learn`` with no arguments builds them."""
    from mlagents.trainers.settings import RunOptions

    return RunOptions()


@pytest.fixture
def env_manager_factory(
    run_options: "RunOptions",
) -> Iterator[Callable[..., "SupervisedEnvManager"]]:
    """``make(env_factory, n_env=1, **settings)`` -> a SupervisedEnvManager closed at teardown."""
    from mlagents_plugin.core.settings import EnvManagerSettings
    from mlagents_plugin.local.supervisor import SupervisedEnvManager

    managers: List[SupervisedEnvManager] = []

    def make(env_factory: Callable[..., Any], n_env: int = 1, **settings: Any) -> SupervisedEnvManager:
        manager = SupervisedEnvManager(
            env_factory, run_options, n_env, EnvManagerSettings(**settings)
        )
        managers.append(manager)
        return manager

    yield make
    for manager in managers:
        manager.close()
