"""RayEnvManager: the same supervised env manager, its workers Ray actors anywhere in a cluster.

The decisions are core's (core/manager.py wires them); ``RayBackend`` (backend.py) is the transport.
docs/ray.md says how to run it on a cluster and what fails how.
"""
from typing import Optional

from mlagents.trainers.settings import RunOptions

from mlagents_plugin.core.manager import EnvFactory, SupervisedManagerBase
from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.ray.backend import RayBackend


class RayEnvManager(SupervisedManagerBase):
    def __init__(
        self,
        env_factory: EnvFactory,
        run_options: RunOptions,
        n_env: int = 1,
        settings: Optional[EnvManagerSettings] = None,
    ):
        super().__init__(env_factory, run_options, n_env, settings, RayBackend)
