"""The parent's side of one run: starts it in a session of its own, watches it under a hard
wall-clock bound, decides its verdict, and reports, then kills, whatever it left running."""
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from typing import Any, Dict, List, Tuple

from faults import EXIT_GRACE_S
from faults.processes import TAG_ENV, kill_and_wait, living_process, player_pids, players_dir, tagged_processes
from faults.record import first_line, read_record, record_path
from faults.scenarios import Scenario

BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(BENCHMARKS, "compare_faults.py")  # a run is this script, re-run with --child
RUNS_DIR = os.path.join(os.path.dirname(BENCHMARKS), "results", "fault-runs")  # never the source tree
SETTLE_S = 3.0  # how long helpers (forkserver, resource tracker) may take to go after the run
# What label() calls a process whose command line holds the key
COMMANDS = {
    "forkserver": "forkserver",
    "resource_tracker": "resource_tracker",
    os.path.basename(SCRIPT): "scenario process",
}


def run_one(scenario: Scenario, manager_name: str) -> List[str]:
    """Run one scenario against one manager in its own session; return the facts for its cell."""
    run_dir = fresh_run_dir(f"{scenario.key}-{manager_name}")
    tag = f"{scenario.key}-{manager_name}-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, **{TAG_ENV: tag, "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    cmd = [sys.executable, SCRIPT, "--child", scenario.key, manager_name, "--run-dir", run_dir]
    with open(console_path(run_dir), "w") as console:
        proc = subprocess.Popen(cmd, stdout=console, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    rc, verdict = watch(proc, scenario.bound_s, run_dir, tag)
    data = read_record(run_dir)
    if not verdict:
        exit_s = time.time() - data["returned_at"] if data.get("returned_at") else float("nan")
        verdict.append(f"interpreter exited (rc {rc}) within {exit_s:.1f} s of the scenario returning")
    verdict.append(clean_up(run_dir, tag, data))
    grep = data.get("grep_console")
    if grep:
        with open(console_path(run_dir), errors="replace") as f:
            shown = grep in f.read()
        verdict.append(f"worker traceback printed on the console: {'yes' if shown else 'no'}")
    return data.get("facts", []) + verdict


def fresh_run_dir(name: str) -> str:
    """``results/fault-runs/NAME/``, without what an earlier run left in it."""
    run_dir = os.path.join(RUNS_DIR, name)
    os.makedirs(players_dir(run_dir), exist_ok=True)
    for stale in (record_path(run_dir), console_path(run_dir)):
        if os.path.exists(stale):
            os.remove(stale)
    for stale in os.listdir(players_dir(run_dir)):
        os.remove(os.path.join(players_dir(run_dir), stale))
    return run_dir


def console_path(run_dir: str) -> str:
    return os.path.join(run_dir, "console.log")


def watch(proc: subprocess.Popen, bound_s: float, run_dir: str, tag: str) -> Tuple[int, List[str]]:
    """Wait for the run to end. Kill its session if the scenario has not returned within
    ``bound_s``, or the interpreter has not exited EXIT_GRACE_S after it did; then the verdict
    says why, and what was running. Returns the exit code and that verdict (empty if not killed)."""
    started = time.time()
    while True:
        try:
            return proc.wait(timeout=0.25), []
        except subprocess.TimeoutExpired:
            pass
        now, data = time.time(), read_record(run_dir)
        returned = data.get("returned_at")
        if returned is not None and now - returned > EXIT_GRACE_S:
            verdict = [
                f"**hung at exit**: interpreter still running {EXIT_GRACE_S:.0f} s after the scenario "
                f"returned; main thread in {hung_stack(console_path(run_dir))}"
            ]
        elif returned is None and now - started > bound_s:
            phase, last = data.get("phase"), data.get("last_return")
            since = now - (last if phase == "get_steps loop" and last else data.get("phase_at") or started)
            verdict = [
                f"**stalled > {now - started:.0f} s** in {phase}"
                + (
                    f" (get_steps had not returned for {since:.0f} s)"
                    if phase == "get_steps loop"
                    else f" ({since:.0f} s in it)"
                )
            ]
        else:
            continue
        running = tagged_processes(tag)
        players = player_pids(run_dir)
        verdict.append("running when killed: " + ", ".join(label(p, data, players) for p in running))
        os.killpg(proc.pid, signal.SIGKILL)  # the run's session: scenario process, workers, forkserver
        return proc.wait(), verdict


def clean_up(run_dir: str, tag: str, data: Dict[str, Any]) -> str:
    """Whatever is left once the run ended escaped the session (players) or outlived its parent:
    name it, kill it."""
    settle_until = time.time() + SETTLE_S
    while tagged_processes(tag) and time.time() < settle_until:
        time.sleep(0.2)
    players = player_pids(run_dir)
    leftovers = tagged_processes(tag)
    left_pids = {p.pid for p in leftovers}
    leftovers += [p for p in map(living_process, players) if p is not None and p.pid not in left_pids]
    if not leftovers:
        return "nothing left running afterwards"
    verdict = (
        f"**left running {SETTLE_S:.0f} s after the run ended: "
        + ", ".join(label(p, data, players) for p in leftovers)
        + "** (killed by this script)"
    )
    kill_and_wait(leftovers)
    return verdict


def label(proc: Any, data: Dict[str, Any], players: List[int]) -> str:
    if proc.pid in players:
        return f"player {proc.pid}"
    if proc.pid in data.get("worker_pids", []):
        return f"worker {proc.pid}"
    try:
        cmd = " ".join(proc.cmdline())
    except Exception:
        cmd = "?"
    for name, shown in COMMANDS.items():
        if name in cmd:
            return f"{shown} {proc.pid}"
    return f"pid {proc.pid} ({first_line(cmd, 40)})"


def hung_stack(console: str, depth: int = 4) -> str:
    """The innermost frames of the first thread in the faulthandler dump in a run's console."""
    with open(console, errors="replace") as f:
        text = f.read()
    dump = text[text.rfind("Timeout ("):] if "Timeout (" in text else ""
    frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', dump.split("\n\n")[0])
    if not frames:
        return "(no stack dump)"
    return " ← ".join(
        f"{func} ({'/'.join(path.split('/')[-2:])}:{line})" for path, line, func in frames[:depth]
    )
