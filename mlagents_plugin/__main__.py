"""``python -m mlagents_plugin doctor``: what is installed, and what is wrong, in words to act on.
``python -m mlagents_plugin examples [DIR]``: the example configurations and a player build.
"""
import argparse
import importlib
import importlib.metadata
import sys
from typing import Callable, List, Optional, Tuple

from mlagents_plugin.core import platform
from mlagents_plugin.integration import entry

INSTALL = "see docs/install.md"
# Tested on these; others may work, and the doctor says they are untested.
PYTHONS = ((3, 10), (3, 11))

# (distribution, check of its version or None, what to do when it is wrong). Only what the plugin
# itself depends on is checked: ML-Agents pins the rest, and `pip check` reports those.
EXPECTED: List[Tuple[str, Optional[Callable[[str], bool]], str]] = [
    (
        "setuptools",
        lambda v: not _at_least(v, (81,)),
        "mlagents imports pkg_resources, which setuptools 81 removed, so mlagents-learn cannot "
        "start: pip install 'setuptools<81'",
    ),
    ("cloudpickle", None, ""),
    ("psutil", None, ""),
    ("mlagents-plugin", None, "install this package: pip install mlagents-plugin (or, in a checkout, make install)"),
]
# Needed only for some settings: missing is fine, a wrong version is not.
OPTIONAL: List[Tuple[str, Callable[[str], bool], str]] = [
    ("ray", lambda v: v == "2.60.0", "env_manager.backend: ray is tested with ray 2.60.0: pip install ray==2.60.0"),
]
INFORMATIONAL = ("torch", "protobuf", "grpcio", "numpy")


def _at_least(version: str, minimum: Tuple[int, ...]) -> bool:
    parts = []
    for piece in version.split(".")[: len(minimum)]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts) >= minimum


def _version(dist: str) -> Optional[str]:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def doctor() -> int:
    problems: List[str] = []
    print(f"mlagents-plugin doctor: Python {sys.version.split()[0]} ({sys.executable}) on {sys.platform}")
    print(f"  process layer: {platform.path_name()} (docs/platforms.md)")
    if sys.version_info[:2] not in PYTHONS:
        problems.append(
            f"Python {sys.version_info[0]}.{sys.version_info[1]} is untested: the plugin is tested on "
            + " and ".join(f"{major}.{minor}" for major, minor in PYTHONS)
        )
    for dist in ("mlagents", "mlagents-envs"):
        print(f"  {dist:16} {_version(dist) or 'missing'}")
    unsupported = entry.unsupported()
    if unsupported is not None:
        problems.append(unsupported)
    for dist, check, advice in EXPECTED:
        version = _version(dist)
        if version is None:
            print(f"  {dist:16} missing")
            problems.append(f"{dist} is not installed: {advice or INSTALL}")
            continue
        ok = check is None or check(version)
        print(f"  {dist:16} {version}{'' if ok else '   <- wrong version'}")
        if not ok:
            problems.append(f"{dist} {version}: {advice}")
    for dist in INFORMATIONAL:
        print(f"  {dist:16} {_version(dist) or 'missing'}")
    for dist, check, advice in OPTIONAL:
        version = _version(dist)
        if version is None:
            print(f"  {dist:16} not installed (optional: {advice})")
            continue
        ok = check(version)
        print(f"  {dist:16} {version}{'' if ok else '   <- wrong version'}")
        if not ok:
            problems.append(f"{dist} {version}: {advice}")
    if unsupported is None:
        problems += _check_runtime()
    if problems:
        print("\nProblems:")
        for problem in problems:
            print(f"  - {problem}")
        return 1
    print("\nAll good: `mlagents-learn` will use SupervisedEnvManager.")
    return 0


def _check_runtime() -> List[str]:
    problems = []
    try:
        importlib.import_module("mlagents.trainers.learn")
    except Exception as e:  # any import failure is the answer to report
        return [f"`mlagents-learn` cannot start: importing mlagents.trainers.learn raised {e!r}"]
    from mlagents_plugin import fast_protobuf
    from mlagents_plugin.ray import local as ray_local

    problems += ray_local.check()
    warning = fast_protobuf.slow_backend_warning()
    if warning:
        problems.append(warning)
    elif fast_protobuf.needed() and not fast_protobuf.served_modules():
        problems.append(
            "mlagents-envs' protobuf modules were not served by mlagents_plugin.fast_protobuf, so "
            "mlagents-learn cannot import them with this protobuf: reinstall mlagents-plugin, or in "
            "a checkout run `python -m mlagents_plugin.fast_protobuf --install-pth`"
        )
    print(f"  protobuf backend: {fast_protobuf.backend()}")
    entry_points = importlib.metadata.entry_points(group="mlagents.trainer_type")
    if not any(ep.value.startswith("mlagents_plugin.") for ep in entry_points):
        problems.append(
            "the mlagents.trainer_type entry point of mlagents-plugin is not registered, so "
            "mlagents-learn will not use it: reinstall mlagents-plugin"
        )
    return problems


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlagents_plugin")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("doctor", help="check the installation")
    examples = commands.add_parser(
        "examples", help="write the example configurations (DIR/config) and a player build (DIR/builds)"
    )
    examples.add_argument("directory", nargs="?", default=".")
    args = parser.parse_args(argv)
    if args.command == "examples":
        from mlagents_plugin import examples as example_files

        for path in example_files.write(args.directory):
            print(path)
        return 0
    return doctor()


if __name__ == "__main__":
    sys.exit(main())
