"""The ``mlagents.trainer_type`` entry point: check the ML-Agents it runs with, then hook in.

# NOTE [ Supported ML-Agents versions ]
# The plugin hooks into ML-Agents internals (compat.INTERNALS), so it runs only with the versions
# whose internals it was tested against: SUPPORTED, each checked by ``compat.check()`` in CI. ML-Agents
# loads this entry point in ``parse_command_line``, before it reads the YAML, and catches
# everything it raises (``except BaseException``): it would log a traceback from deep inside and
# train on without the plugin, on a manager the user did not ask for. So any other version stops
# ``mlagents-learn`` here, with one line naming what is installed and what is supported. This
# module imports nothing of ML-Agents before that check.
"""
import importlib.metadata
import os
import sys
from typing import Any, Dict, Optional, Tuple

SUPPORTED = ("1.0.0", "1.1.0")  # mlagents and mlagents-envs, the same version of both
_DISTRIBUTIONS = ("mlagents", "mlagents-envs")


def register() -> Tuple[Dict[str, Any], Dict[str, Any]]:
    problem = unsupported()
    if problem is not None:
        sys.stderr.write(f"mlagents-plugin: {problem}\n")
        sys.stderr.flush()
        os._exit(1)  # NOTE above: raising would only be logged, and training would go on
    from mlagents_plugin.integration import plugin

    return plugin.register()


def unsupported() -> Optional[str]:
    """Why the installed ML-Agents cannot run with the plugin, in one line; None if it can."""
    installed = {name: _version(name) for name in _DISTRIBUTIONS}
    described = ", ".join(f"{name} {version or 'missing'}" for name, version in installed.items())
    advice = (
        f"install one of them (pip install mlagents=={SUPPORTED[-1]}), or remove the plugin "
        "(pip uninstall mlagents-plugin)"
    )
    if len(set(installed.values())) != 1 or installed["mlagents"] not in SUPPORTED:
        return (
            f"this version supports ML-Agents {' and '.join(SUPPORTED)} (mlagents and mlagents-envs "
            f"of the same version); installed: {described}: {advice}."
        )
    try:
        from mlagents_plugin.integration import compat

        problems = compat.check()
    except ImportError as e:
        problems = [f"importing its internals failed: {e}"]
    if problems:
        return f"{described} is not as the plugin expects ({problems[0]}): {advice}."
    return None


def _version(distribution: str) -> Optional[str]:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
