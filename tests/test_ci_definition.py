"""The CI workflow for GitHub's hosted runners (.github/workflows/ci.yml), which nothing here runs:
its Linux jobs are the legs of `make test`, its Windows and macOS jobs run the portable leg's entry
point (.ci/portable.py) exactly as `make test-portable` does, and that entry point, called on Linux
as the workflow calls it, runs what the portable leg always ran (docs/platforms.md)."""
import ast
import importlib.util
import json
import re
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = REPO / ".github" / "workflows" / "ci.yml"
ENTRY_POINT = ".ci/portable.py"


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def makefile_variable(name: str) -> str:
    """A variable's value as the Makefile assigns it (``:=`` or ``?=``), continuation lines joined."""
    text = (REPO / "Makefile").read_text().replace("\\\n", " ")
    (value,) = re.findall(rf"^{name} [:?]= (.*)$", text, re.MULTILINE)
    return " ".join(value.split())


def makefile_rule(target: str) -> List[str]:
    """``target:``'s prerequisites, then its recipe lines."""
    lines = (REPO / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return [lines[start].split(":", 1)[1].strip(), *recipe]


def portable_steps() -> Dict[str, List[str]]:
    """Each portable job's step commands, by OS, with the matrix's interpreter filled in."""
    job = workflow()["jobs"]["portable"]
    runs = [step["run"] for step in job["steps"] if "run" in step]
    return {
        entry["os"]: [run.replace("${{ matrix.python }}", entry["python"]) for run in runs]
        for entry in job["strategy"]["matrix"]["include"]
    }


def entry_point_call(command: str) -> List[str]:
    """The arguments a step passes to .ci/portable.py (those after the script's path)."""
    words = shlex.split(command, posix=False)
    return words[words.index(ENTRY_POINT) + 1:]


@pytest.mark.fast
def test_the_linux_jobs_are_the_legs_of_make_test():
    """.ci/run runs `make test`; the workflow runs each of its legs, as root as CI runs here."""
    assert (REPO / ".ci" / "run").read_text().strip().endswith("make test")
    job = workflow()["jobs"]["linux"]
    assert job["strategy"]["matrix"]["leg"] == makefile_rule("test")[0].split()
    assert job["steps"][-1]["run"].startswith("sudo ") and job["steps"][-1]["run"].endswith('make "$LEG"')
    assert job["env"]["LEG"] == "${{ matrix.leg }}"


@pytest.mark.fast
def test_windows_and_macos_run_the_portable_leg_on_the_wheel_built_in_the_workflow():
    jobs = workflow()["jobs"]
    wheel = Path(makefile_variable("WHEEL")).name
    upload = jobs["wheel"]["steps"][-1]
    assert upload["uses"].startswith("actions/upload-artifact@") and upload["with"]["path"] == f"dist/{wheel}"
    portable = jobs["portable"]
    assert portable["needs"] == "wheel"
    assert any(step.get("with", {}).get("python-version") == "3.10" for step in portable["steps"])
    steps = portable_steps()
    assert sorted(os_name.split("-")[0] for os_name in steps) == ["macos", "windows"]
    for os_name, commands in steps.items():
        python = next(e["python"] for e in portable["strategy"]["matrix"]["include"] if e["os"] == os_name)
        # ML-Agents' install guide, as .ci/official_venv.sh follows it, then the wheel
        assert f"{python} -m pip install mlagents==1.1.0" in commands
        assert f'{python} -m pip install "dist/{wheel}[dev,ray]"' in commands
        assert commands[-1].startswith(f"{python} {ENTRY_POINT} ")


@pytest.mark.fast
def test_the_portable_jobs_steps_run_alike_in_powershell_and_bash():
    """One command a step (PowerShell fails a step on its last command's exit code alone), no
    shell named, no make: what runs there is Python and pip."""
    for commands in portable_steps().values():
        for command in commands:
            assert "\n" not in command.strip() and not re.search(r"\bmake\b|&&|\|\||\$\w|;", command), command
    assert not any("shell" in step for step in workflow()["jobs"]["portable"]["steps"])


@pytest.mark.fast
def test_the_workflow_calls_the_entry_point_as_make_test_portable_does():
    recipe = makefile_rule("test-portable")
    assert recipe[-1] == f"$(VENV310)/bin/python {ENTRY_POINT} $(PYTEST_ARGS)"
    for commands in portable_steps().values():
        assert entry_point_call(commands[-1]) == shlex.split(makefile_variable("PYTEST_ARGS"))


@pytest.mark.fast
def test_every_action_is_pinned_to_a_commit():
    for job in workflow()["jobs"].values():
        for step in job["steps"]:
            if "uses" in step:
                assert re.fullmatch(r"[\w-]+/[\w-]+@[0-9a-f]{40}", step["uses"]), step["uses"]


@pytest.mark.fast
def test_every_portable_test_exists():
    """A test renamed or moved would otherwise leave the Windows and macOS jobs running nothing."""
    spec = importlib.util.spec_from_file_location("portable", REPO / ENTRY_POINT)
    portable = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(portable)
    for test in portable.TESTS:
        path, _, name = test.partition("::")
        assert (REPO / path).is_file(), test
        if name:
            tree = ast.parse((REPO / path).read_text())
            assert name in {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}, test


@pytest.mark.timeout(60)
def test_the_entry_point_called_as_the_workflow_calls_it_runs_what_the_portable_leg_ran():
    """The macOS job's command, run here with this interpreter and --dry-run: the installed pytest
    on the portable tests, on the portable path, against the wheel, the Linux hardening's own tests
    left out, with the Makefile's pytest arguments, from the checkout's root."""
    (command,) = [commands[-1] for os_name, commands in portable_steps().items() if os_name.startswith("macos")]
    args = entry_point_call(command)
    run = subprocess.run(
        [sys.executable, str(REPO / ENTRY_POINT), "--dry-run", *args], capture_output=True, text=True, timeout=30
    )
    assert run.returncode == 0, run.stderr
    planned = json.loads(run.stdout)
    assert planned["env"] == {"MLAGENTS_PLUGIN_PORTABLE": "1", "MLAGENTS_PLUGIN_EXPECT_INSTALLED": "1"}
    assert planned["cwd"] == str(REPO)
    pytest_script, *pytest_args = planned["command"]
    assert Path(pytest_script) == Path(sysconfig.get_path("scripts")) / "pytest"
    assert pytest_args[: len(args) + 2] == [*args, "-m", "not hardening"]
    tests = pytest_args[len(args) + 2:]
    assert "tests/test_e2e_player.py::test_a_crashed_build_is_restarted_and_training_finishes" in tests
    assert all(test.startswith("tests/test_") for test in tests) and len(tests) == len(set(tests))


def test_a_disk_without_room_for_the_venvs_is_said_at_once(tmp_path: Path):
    """A CI run that found 12 GB free failed 28 minutes in, half-way into torch's CUDA build
    ("No space left on device"): .ci/run and .ci/official_venv.sh now check before they start."""
    script = str(REPO / ".ci" / "free_space.sh")
    short = subprocess.run([script, "1000000", str(tmp_path), "make test"], capture_output=True, text=True,
                           timeout=30)
    assert short.returncode == 1, short
    assert "make test needs about 1000000 GB free" in short.stderr
    assert "Free some space" in short.stderr
    enough = subprocess.run([script, "0", str(tmp_path), "make test"], capture_output=True, text=True, timeout=30)
    assert enough.returncode == 0, enough
    assert "GB free on the filesystem of" in enough.stdout
    assert '.ci/free_space.sh "$need_gb" . "make test"' in (REPO / ".ci" / "run").read_text()
    assert "free_space.sh" in (REPO / ".ci" / "official_venv.sh").read_text()
