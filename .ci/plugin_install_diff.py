"""Check what installing mlagents-plugin changed in an environment: ``pip freeze`` before and after
may differ only by the plugin, its own new dependencies, and setuptools (pinned below 81 so that
mlagents-learn can import pkg_resources). Run by the Makefile's Python 3.10 leg, in the
environment it checks.

    python .ci/plugin_install_diff.py FREEZE_BEFORE FREEZE_AFTER
"""
import importlib.metadata
import re
import sys
from typing import Dict

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


def main(before_path: str, after_path: str) -> int:
    before, after = _freeze(before_path), _freeze(after_path)
    requirements = importlib.metadata.requires("mlagents-plugin") or []
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
    print(f"Installing mlagents-plugin added {', '.join(added) or 'nothing'}; "
          f"changed {', '.join(changed) or 'nothing'}.")
    for problem in problems:
        print(f"  NOT ALLOWED: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
