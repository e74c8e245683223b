"""An env module as users' env packages often are: it imports torch at the top (startup.py's
``torch`` env). Upstream's workers, forks of a trainer that imported it, inherit it; ours get it
from the fork server, which imports the factory's module once (NOTE [ Worker start-up ])."""
import torch  # noqa: F401

from mlagents_plugin.testing import SimpleEnvironment


def make_env(worker_id: int, side_channels: list, num_agents: int = 4) -> SimpleEnvironment:
    return SimpleEnvironment(worker_id, side_channels, num_agents=num_agents)
