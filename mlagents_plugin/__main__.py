"""``python -m mlagents_plugin doctor``: what is installed, and what is wrong, in words to act on.
``python -m mlagents_plugin examples [DIR]``: the example configurations and a player build.
"""
import argparse
import importlib
import importlib.metadata
import re
import sys
from pathlib import Path
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
    ("mlagents-plugin", None, ""),  # advice: _install_advice()
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


def _install_advice() -> str:
    """How to install the plugin, true today: it is not on PyPI yet (docs/install.md)."""
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "setup.py").is_file():
        return (
            f"install it from this checkout: pip install {checkout} (for development, make install; "
            "docs/install.md)"
        )
    return (
        "install its wheel: pip install mlagents_plugin-0.1.0-py3-none-any.whl (a release artifact, or "
        "`pip wheel --no-deps -w dist .` in a checkout; it is not on PyPI yet, docs/install.md)"
    )


def _one_line(error: BaseException) -> str:
    """The error's type and the first line of its message (numpy 2's AttributeError has six)."""
    text = next((line.strip() for line in str(error).splitlines() if line.strip()), "").rstrip(".")
    return f"{type(error).__name__}: {text[:200] + '...' if len(text) > 200 else text}"


def _numpy_requirement() -> Optional[Tuple[str, str]]:
    """numpy as the installed ML-Agents asks for it ('numpy<1.24.0,>=1.23.5'), and who asks: the
    pin of mlagents-envs (==1.21.2 in 1.0.0), else mlagents'. None if neither names numpy."""
    for dist in ("mlagents-envs", "mlagents"):
        try:
            requirements = importlib.metadata.requires(dist) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for requirement in requirements:
            name = re.split(r"[ ;<>=!~\[(]", requirement, maxsplit=1)[0]
            if name.lower() == "numpy":
                spec = requirement.split(";")[0][len(name):].replace(" ", "").strip("()")
                return f"numpy{spec}", f"{dist} {_version(dist)}"
    return None


def _outside(version: str, requirement: str) -> Optional[bool]:
    """Whether ``version`` falls outside ``requirement`` ('numpy<1.24.0,>=1.23.5'); None if unknown."""
    try:
        from packaging.requirements import Requirement  # not a dependency; ML-Agents' environments have it

        return not Requirement(requirement).specifier.contains(version, prereleases=True)
    except Exception:  # no packaging, or a version or requirement it cannot parse
        return None


def _broken_import() -> Optional[str]:
    """One line, with the fix, if numpy or ML-Agents' trainer cannot be imported (issue 32: numpy 2,
    which ML-Agents' np.float does not survive); None if they can. Never raises."""
    numpy = _version("numpy")
    wanted = _numpy_requirement()
    numpy_fix = (
        f"{wanted[1]} asks for {wanted[0]}: pip install '{wanted[0]}'" if wanted else "pip install 'numpy<1.24'"
    )
    try:
        importlib.import_module("numpy")
    except Exception as e:  # any import failure is the answer to report
        state = f"numpy {numpy} is installed but" if numpy else "numpy is not installed, so it"
        fix = numpy_fix.replace("pip install", "pip install --force-reinstall")
        return f"{state} cannot be imported ({_one_line(e)}), so mlagents-learn cannot start; {fix}"
    if _version("mlagents") is None:
        return None  # entry.unsupported() says what to install
    try:
        importlib.import_module("mlagents.trainers.learn")
    except Exception as e:  # any import failure is the answer to report
        error = _one_line(e)
        if isinstance(e, ImportError) and e.name == "pkg_resources":
            fix = "pip install 'setuptools<81' (mlagents imports pkg_resources, which setuptools 81 removed)"
        elif "numpy" in error or (numpy and wanted and _outside(numpy, wanted[0])):
            fix = f"numpy {numpy} is installed and {numpy_fix}"
        else:
            fix = "`pip check` names what does not match ML-Agents' requirements: install what it asks for"
        return f"`mlagents-learn` cannot start: importing mlagents.trainers.learn raised {error}. {fix}"
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
    # A broken import of numpy or ML-Agents is said in one line, and what would import them again
    # (the version check's compat, the runtime checks) is skipped: they could only say it again.
    broken = _broken_import()
    unsupported = None
    if broken is not None:
        problems.append(broken)
        installed = {_version(dist) for dist in ("mlagents", "mlagents-envs")}
        if len(installed) != 1 or installed.isdisjoint(entry.SUPPORTED):
            unsupported = entry.unsupported()  # a version check alone: it imports nothing of ML-Agents
            if unsupported is not None:
                problems.append(unsupported)
    else:
        try:
            unsupported = entry.unsupported()
        except Exception as e:  # never a traceback: the doctor is what users run when things break
            unsupported = f"checking ML-Agents' internals raised {_one_line(e)}"
        if unsupported is not None:
            problems.append(unsupported)
    for dist, check, advice in EXPECTED:
        version = _version(dist)
        if version is None:
            print(f"  {dist:16} missing")
            advice = _install_advice() if dist == "mlagents-plugin" else advice
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
    if broken is None and unsupported is None:
        try:
            problems += _check_runtime()
        except Exception as e:  # never a traceback, as above
            problems.append(f"checking how mlagents-learn will run raised {_one_line(e)}")
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
    from mlagents_plugin.local import fork_server
    from mlagents_plugin.ray import local as ray_local

    problems += ray_local.check()
    problems += fork_server.check()
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
