"""SupervisedEnvManager: ML-Agents' EnvManager over supervised worker processes on this machine.

A drop-in for ``mlagents.trainers.subprocess_env_manager.SubprocessEnvManager``: same
constructor, same behaviour, but every wait is bounded, every failure is explained, what can be
recovered is, and the workers are always reaped. The decisions are core's (core/manager.py
wires them); ``ProcessBackend`` (backend.py) starts worker processes, waits on their pipes
and sentinels, and hands them to the shutdown ladder. docs/architecture.md has the picture and
docs/faults.md what happens on each fault.
"""
from typing import List, Optional

from mlagents.trainers.settings import RunOptions

from mlagents_plugin.core.manager import EnvFactory, SupervisedManagerBase
from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.local import fork_server
from mlagents_plugin.local.backend import ProcessBackend


class SupervisedEnvManager(SupervisedManagerBase):
    def __init__(
        self,
        env_factory: EnvFactory,
        run_options: RunOptions,
        n_env: int = 1,
        settings: Optional[EnvManagerSettings] = None,
    ):
        super().__init__(env_factory, run_options, n_env, settings, ProcessBackend)


def start_fork_server(factory_modules: List[str]) -> None:
    """Start the fork server now, preloading ``factory_modules`` besides what every worker
    imports, so that it loads them while the trainer is still setting up (NOTE [ Worker
    start-up ]). Returns at once; a server that runs already is kept."""
    fork_server.set_preload(factory_modules)
    fork_server.ensure_running()
