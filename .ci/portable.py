"""The portable leg (docs/platforms.md): the tests macOS and Windows run, on the portable path
(``MLAGENTS_PLUGIN_PORTABLE=1``), against the installed wheel (``MLAGENTS_PLUGIN_EXPECT_INSTALLED=1``,
tests/conftest.py). Their one list, and the one way to run them: ``make test-portable`` runs it
on Linux in .venv310, the workflow's Windows and macOS jobs in theirs (.github/workflows/ci.yml).
Standard library only, and one command in every OS's shell:

    PYTHON .ci/portable.py [PYTEST_ARGS...]            the leg, with the pytest of PYTHON's environment
    PYTHON .ci/portable.py --dry-run [PYTEST_ARGS...]  print what it would run (JSON), run nothing
"""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
TESTS = [
    "tests/test_contract.py",
    "tests/test_faults.py",
    "tests/test_real_faults.py",
    "tests/test_real_faults_learn.py",
    "tests/test_shutdown.py",
    "tests/test_signals.py",
    "tests/test_terminal.py",
    "tests/test_wire.py",
    "tests/test_network.py",
    "tests/test_trainers.py::test_mlagents_learn_trains_with_ppo_fast_from_one_word_from_a_ppo_run_and_resumes",
    "tests/test_player.py::test_death_during_handshake_is_recovered_by_the_manager",
    "tests/test_dropin.py::test_reset_raises_the_error_of_a_worker_that_cannot_start",
    "tests/test_e2e_player.py::test_a_crashed_build_is_restarted_and_training_finishes",
    "tests/test_e2e_player.py::test_a_build_dying_in_the_handshake_is_reported_at_once_and_restarted",
]
ENV: Dict[str, str] = {"MLAGENTS_PLUGIN_PORTABLE": "1", "MLAGENTS_PLUGIN_EXPECT_INSTALLED": "1"}
# The tests of the Linux hardening itself (pytest.ini) are not the portable path's.
MARKERS = "not hardening"


def pytest_command(pytest_args: List[str]) -> List[str]:
    """pytest's own script in this interpreter's environment: ``python -m pytest`` would put the
    checkout on sys.path, and test it instead of the installed wheel."""
    scripts = sysconfig.get_path("scripts")
    pytest = shutil.which("pytest", path=scripts)
    if pytest is None:
        raise SystemExit(f"no pytest in {scripts}: install the wheel with its dev extra")
    return [pytest, *pytest_args, "-m", MARKERS, *TESTS]


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    dry_run = args[:1] == ["--dry-run"]
    command = pytest_command(args[1:] if dry_run else args)
    if dry_run:
        print(json.dumps({"cwd": str(ROOT), "env": ENV, "command": command}, indent=2))
        return 0
    pytest = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **ENV})
    while True:
        try:
            return pytest.wait()
        except KeyboardInterrupt:  # a terminal's Ctrl-C reached pytest too: let it finish its way
            continue


if __name__ == "__main__":
    sys.exit(main())
