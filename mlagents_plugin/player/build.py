"""``make-build``: a launcher that mlagents-envs starts exactly like a Unity build."""
import os
import stat
import sys
from pathlib import Path

from mlagents_plugin.player.scenes import SCENES

LAUNCHER = """#!/bin/sh
# A Unity-build-like launcher for mlagents-plugin's headless player, scene "{scene}".
# mlagents-envs runs it as: {name} [-nographics -batchmode] --mlagents-port N [-logFile F] [--env-args...]
# `exec` matters: mlagents-envs watches and kills the process it started, which must be the player.
exec "{python}" -m mlagents_plugin.player run --scene {scene} "$@"
"""


def make_build(directory: str, scene: str, name: str = "", platform: str = sys.platform) -> Path:
    """Write a launcher where mlagents-envs looks for a build on ``platform``, and return its
    path: DIR/NAME.x86_64 on Linux, DIR/NAME.app/Contents/MacOS/NAME on macOS (NAME defaults to
    the scene). ``--env=DIR/NAME`` then works as with a Unity build. The launcher runs this
    Python interpreter."""
    if scene not in SCENES:
        raise ValueError(f"unknown scene {scene!r}; scenes: {', '.join(sorted(SCENES))}")
    if platform == "win32":
        raise ValueError(
            "On Windows mlagents-envs starts a build as a .exe, which a launcher script cannot be: start "
            "mlagents-learn without --env and the player by hand with mlagents-plugin-player, as with "
            "the Editor (docs/player.md)."
        )
    name = name or scene
    if platform == "darwin":
        path = Path(directory) / f"{name}.app" / "Contents" / "MacOS" / name
    else:
        path = Path(directory) / f"{name}.x86_64"
    os.makedirs(path.parent, exist_ok=True)
    path.write_text(LAUNCHER.format(scene=scene, name=path.name, python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path
