"""``make-build``: a launcher that mlagents-envs starts exactly like a Unity build."""
import os
import stat
import sys
from pathlib import Path

from mlagents_plugin.player.scenes import SCENES

LAUNCHER = """#!/bin/sh
# A Unity-build-like launcher for mlagents-plugin's headless player, scene "{scene}".
# mlagents-envs runs it as: {name}.x86_64 [-nographics -batchmode] --mlagents-port N [-logFile F] [--env-args...]
# `exec` matters: mlagents-envs watches and kills the process it started, which must be the player.
exec "{python}" -m mlagents_plugin.player run --scene {scene} "$@"
"""


def make_build(directory: str, scene: str, name: str = "") -> Path:
    """Write ``directory/name.x86_64`` (name defaults to the scene); ``--env=directory/name``
    then works as with a Unity build. The launcher runs this Python interpreter."""
    if scene not in SCENES:
        raise ValueError(f"unknown scene {scene!r}; scenes: {', '.join(sorted(SCENES))}")
    name = name or scene
    os.makedirs(directory, exist_ok=True)
    path = Path(directory) / f"{name}.x86_64"
    path.write_text(LAUNCHER.format(scene=scene, name=name, python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path
