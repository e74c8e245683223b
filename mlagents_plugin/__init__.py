"""mlagents-plugin: a supervised env manager for Unity ML-Agents.

Public names are imported lazily (PEP 562), so that a worker process importing
``mlagents_plugin.worker`` does not pay for torch and the trainer.
"""
import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC = {
    "SupervisedEnvManager": "mlagents_plugin.supervisor",
    "RayEnvManager": "mlagents_plugin.ray_backend",  # needs the [ray] extra
    "EnvManagerSettings": "mlagents_plugin.settings",
    "EnvWorkerError": "mlagents_plugin.errors",
    "WorkerDiedError": "mlagents_plugin.errors",
    "WorkerTimeoutError": "mlagents_plugin.errors",
    "RemoteWorkerError": "mlagents_plugin.errors",
}

__all__ = sorted(_PUBLIC) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'mlagents_plugin' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
