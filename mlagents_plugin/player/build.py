"""``make-build``: a launcher that mlagents-envs starts exactly like a Unity build."""
import importlib.resources
import io
import os
import stat
import sys
import sysconfig
import zipfile
from pathlib import Path

from mlagents_plugin.player.scenes import SCENES

LAUNCHER = """#!/bin/sh
# A Unity-build-like launcher for mlagents-plugin's headless player, scene "{scene}".
# mlagents-envs runs it as: {name} [-nographics -batchmode] --mlagents-port N [-logFile F] [--env-args...]
# `exec` matters: mlagents-envs watches and kills the process it started, which must be the player.
exec "{python}" -m mlagents_plugin.player run --scene {scene} "$@"
"""

# What the Windows launcher's Python runs: the zip appended to the .exe, as pip's console scripts.
WINDOWS_MAIN = """import sys

from mlagents_plugin.player.__main__ import main

main(["run", "--scene", {scene!r}, *sys.argv[1:]])
"""

# Where pip's own copy of distlib keeps the launchers of its console scripts; distlib itself, if
# installed, for an environment made without pip.
_DISTLIB_PACKAGES = ("pip._vendor.distlib", "distlib")


def make_build(directory: str, scene: str, name: str = "", platform: str = sys.platform) -> Path:
    """Write a launcher where mlagents-envs looks for a build on ``platform``, and return its
    path: DIR/NAME.x86_64 on Linux, DIR/NAME.app/Contents/MacOS/NAME on macOS, DIR/NAME.exe on
    Windows (NAME defaults to the scene). ``--env=DIR/NAME`` then works as with a Unity build. The
    launcher runs this Python interpreter."""
    if scene not in SCENES:
        raise ValueError(f"unknown scene {scene!r}; scenes: {', '.join(sorted(SCENES))}")
    name = name or scene
    if platform == "win32":
        path = Path(directory) / f"{name}.exe"
        os.makedirs(path.parent, exist_ok=True)
        path.write_bytes(windows_launcher(scene))
        return path
    if platform == "darwin":
        path = Path(directory) / f"{name}.app" / "Contents" / "MacOS" / name
    else:
        path = Path(directory) / f"{name}.x86_64"
    os.makedirs(path.parent, exist_ok=True)
    path.write_text(LAUNCHER.format(scene=scene, name=path.name, python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def windows_launcher(scene: str) -> bytes:
    """A Windows build of the player, made as pip makes a console script's ``.exe``: distlib's
    launcher, then the shebang line naming this interpreter, then a zip whose ``__main__.py`` runs
    the player. A script cannot be the ``.exe`` that mlagents-envs starts on Windows. The launcher
    runs ``python NAME.exe ARGS`` in a Job Object that kills it when the launcher is killed (as
    mlagents-envs kills a build), passes Ctrl-C on and exits with the player's exit code."""
    launcher = _distlib_launcher("t64-arm.exe" if sysconfig.get_platform() == "win-arm64" else "t64.exe")
    python = f'"{sys.executable}"' if " " in sys.executable else sys.executable
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("__main__.py", WINDOWS_MAIN.format(scene=scene))
    return launcher + f"#!{python}\n".encode() + archive.getvalue()


def _distlib_launcher(file_name: str) -> bytes:
    for package in _DISTLIB_PACKAGES:
        try:
            return importlib.resources.files(package).joinpath(file_name).read_bytes()
        except (ImportError, OSError):
            continue
    raise ValueError(
        f"A Windows build is made with pip's launcher ({file_name} of its distlib), and this environment "
        "has neither pip nor distlib: `python -m pip --version` says whether pip is there "
        "(`python -m ensurepip` installs it). Or start mlagents-learn without --env and the player by "
        "hand with mlagents-plugin-player, as with the Editor (docs/player.md)."
    )
