"""mlagents-plugin: a supervised env manager for Unity ML-Agents.

Public names are imported lazily (PEP 562), so that a worker process importing
``mlagents_plugin.local.worker`` does not pay for torch and the trainer.
"""
import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC = {
    "SupervisedEnvManager": "mlagents_plugin.local.supervisor",
    "RayEnvManager": "mlagents_plugin.ray.manager",  # needs the [ray] extra
    "EnvManagerSettings": "mlagents_plugin.core.settings",
    "EnvWorkerError": "mlagents_plugin.core.errors",
    "WorkerDiedError": "mlagents_plugin.core.errors",
    "WorkerTimeoutError": "mlagents_plugin.core.errors",
    "RemoteWorkerError": "mlagents_plugin.core.errors",
    "ManagerClosedError": "mlagents_plugin.core.errors",
    "AllWorkersFailedError": "mlagents_plugin.core.errors",
    "Placement": "mlagents_plugin.core.placement",
}

__all__ = sorted(_PUBLIC) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'mlagents_plugin' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
