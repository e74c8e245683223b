"""Check what a pip command on mlagents-plugin changed in an environment: ``pip freeze --all``
before ML-Agents' environment met the plugin and after the command may differ only by the plugin,
its own new dependencies, and setuptools (pinned below 81 so that mlagents-learn can import
pkg_resources). Run by .ci/official_venv.sh (the Makefile's Python 3.10 legs) after each of
``pip install``, ``pip install --force-reinstall``, ``pip install -U`` and ``pip uninstall``, in the
environment it checks.

    python .ci/plugin_install_diff.py FREEZE_BEFORE FREEZE_AFTER [--wheel WHEEL] [--what COMMAND]

The plugin's own dependencies are read from WHEEL's metadata when given (after ``pip uninstall``
the environment no longer has it), else from the installed plugin's.
"""
import argparse
import importlib.metadata
import re
import sys
import zipfile
from email.parser import HeaderParser
from typing import Dict, List, Optional

ALLOWED_TO_CHANGE = {"setuptools"}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _freeze(path: str) -> Dict[str, str]:
    packages = {}
    for line in open(path):
        name, sep, version = line.strip().partition("==")
        if sep:
            packages[_canonical(name)] = version
    return packages


def _requirements(wheel: Optional[str]) -> List[str]:
    if wheel is None:
        return importlib.metadata.requires("mlagents-plugin") or []
    with zipfile.ZipFile(wheel) as archive:
        [name] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = HeaderParser().parsestr(archive.read(name).decode())
    return metadata.get_all("Requires-Dist") or []


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--wheel", help="the plugin's wheel, whose metadata names its dependencies")
    parser.add_argument("--what", default="pip install mlagents-plugin", help="the command, for the report")
    args = parser.parse_args(argv)
    before, after = _freeze(args.before), _freeze(args.after)
    # What a plain install may bring: its requirements without an extra (extras are installed later,
    # for the tests, and not checked).
    requirements = [r for r in _requirements(args.wheel) if not re.search(r"\bextra\s*==", r)]
    ours = {"mlagents-plugin"} | {_canonical(re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0]) for r in requirements}
    problems = [f"{name} {version} was removed" for name, version in before.items() if name not in after]
    problems += [
        f"{name} changed: {before[name]} -> {version}"
        for name, version in after.items()
        if name in before and before[name] != version and name not in ALLOWED_TO_CHANGE
    ]
    problems += [
        f"{name} {version} was added, but the plugin does not ask for it"
        for name, version in after.items()
        if name not in before and name not in ours
    ]
    added = sorted(f"{name} {version}" for name, version in after.items() if name not in before)
    changed = sorted(f"{name} {before[name]} -> {v}" for name, v in after.items() if before.get(name, v) != v)
    print(f"Since ML-Agents' own install, `{args.what}` left added {', '.join(added) or 'nothing'}; "
          f"changed {', '.join(changed) or 'nothing'}.")
    for problem in problems:
        print(f"  NOT ALLOWED: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
