"""``python -m mlagents_plugin doctor``: what is installed, and what is wrong, in words to act on."""
import argparse
import importlib
import importlib.metadata
import sys
from typing import Callable, List, Optional, Tuple

FIX_ALL = "run `make install` (or see docs/install.md)"

# (distribution, check of its version or None, what to do when it is wrong)
EXPECTED: List[Tuple[str, Optional[Callable[[str], bool]], str]] = [
    ("mlagents", lambda v: v == "1.1.0", "mlagents-plugin supports mlagents 1.1.0 only"),
    ("mlagents-envs", lambda v: v == "1.1.0", "mlagents-plugin supports mlagents-envs 1.1.0 only"),
    ("torch", lambda v: v.startswith("2.13.0"), "pin torch==2.13.0, the CPU wheel on disk"),
    (
        "protobuf",
        lambda v: _at_least(v, (6, 31)),
        "install protobuf 6 (see docs/install.md): 3.20.x decodes in pure Python",
    ),
    ("grpcio", lambda v: _at_least(v, (1, 49)), "grpcio >= 1.49 has Python 3.11 wheels"),
    ("numpy", lambda v: v.startswith("1.23."), "mlagents 1.1.0 needs numpy >=1.23.5,<1.24"),
    ("onnx", lambda v: v == "1.15.0", "ML-Agents' model export is tested with onnx 1.15.0"),
    ("cattrs", lambda v: _at_least(v, (1, 1)) and not _at_least(v, (1, 7)), "mlagents needs cattrs >=1.1,<1.7"),
    ("setuptools", lambda v: not _at_least(v, (81,)), "mlagents imports pkg_resources, removed in setuptools 81"),
    ("cloudpickle", None, ""),
    ("psutil", None, ""),
    ("mlagents-plugin", None, "install this package: pip install -e ."),
]
# Needed only for some settings: missing is fine, a wrong version is not.
OPTIONAL: List[Tuple[str, Callable[[str], bool], str]] = [
    ("ray", lambda v: v == "2.60.0", "env_manager.backend: ray is tested with ray 2.60.0: pip install ray==2.60.0"),
]


def _at_least(version: str, minimum: Tuple[int, ...]) -> bool:
    parts = []
    for piece in version.split(".")[: len(minimum)]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts) >= minimum


def doctor() -> int:
    problems: List[str] = []
    print(f"mlagents-plugin doctor: Python {sys.version.split()[0]} ({sys.executable})")
    if sys.version_info[:2] != (3, 11):
        problems.append("this project is built and tested on Python 3.11")
    for dist, check, advice in EXPECTED:
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            print(f"  {dist:16} missing")
            problems.append(f"{dist} is not installed: {advice or FIX_ALL}")
            continue
        ok = check is None or check(version)
        print(f"  {dist:16} {version}{'' if ok else '   <- wrong version'}")
        if not ok:
            problems.append(f"{dist} {version}: {advice}; {FIX_ALL}")
    for dist, check, advice in OPTIONAL:
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            print(f"  {dist:16} not installed (optional: {advice})")
            continue
        ok = check(version)
        print(f"  {dist:16} {version}{'' if ok else '   <- wrong version'}")
        if not ok:
            problems.append(f"{dist} {version}: {advice}")
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
    from mlagents_plugin.integration import compat
    from mlagents_plugin.ray import local as ray_local

    problems += compat.check() + ray_local.check()
    warning = fast_protobuf.slow_backend_warning()
    if warning:
        problems.append(warning)
    elif not fast_protobuf.served_modules():
        problems.append(
            "mlagents-envs' protobuf modules were not served by mlagents_plugin.fast_protobuf, so "
            "mlagents-learn cannot import them with protobuf 6: run "
            "`python -m mlagents_plugin.fast_protobuf --install-pth`"
        )
    print(f"  protobuf backend: {fast_protobuf.backend()}")
    entry_points = importlib.metadata.entry_points(group="mlagents.trainer_type")
    if not any(ep.value.startswith("mlagents_plugin.") for ep in entry_points):
        problems.append(
            "the mlagents.trainer_type entry point of mlagents-plugin is not registered, so "
            "mlagents-learn will not use it: reinstall with `pip install -e .`"
        )
    return problems


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlagents_plugin")
    parser.add_argument("command", choices=["doctor"], help="doctor: check the installation")
    parser.parse_args(argv)
    return doctor()


if __name__ == "__main__":
    sys.exit(main())
