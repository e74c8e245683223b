"""Fault scenarios against ML-Agents' SubprocessEnvManager and SupervisedEnvManager, side by side.

Every (scenario, manager) pair runs in a Python subprocess of its own, in a session of its own,
under a hard wall-clock bound: a manager that hangs cannot hang this script. After each run the
script reports, then kills, every process the run left behind: workers, forkservers, and the
stand-in "players" of PlayerLaunchingEnvironment (they run in a session of their own; they are
found through an environment variable every process of the run inherits, and through the pid
files the env writes).

    python compare_faults.py [--only kill exit ...] [--managers upstream ours] [--save RESULTS.md]

It prints a Markdown table: scenario | upstream | ours. Per-run console output and the JSON each
run reports through are kept in ``runs/`` next to this file.

Internally the script re-runs itself as ``--child SCENARIO MANAGER --run-dir DIR`` for each run.
"""
import argparse
import faulthandler
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import traceback
import uuid
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS_DIR = os.path.join(HERE, "runs")
TAG_ENV = "COMPARE_FAULTS_TAG"  # inherited by every process a run starts
EXIT_GRACE_S = 30.0  # how long the interpreter may take to exit once the scenario returned
AFTER_CLOSE_S = 2.0  # how long workers may take to go once close() returned
SETTLE_S = 3.0  # how long helpers (forkserver, resource tracker) may take to go after the run
MANAGERS = ("upstream", "ours")
N_ENV = 2
FAULTY_FILE = "faulty_envs.py"  # a worker traceback shows a frame from this file


class CustomEnvError(Exception):
    """The "custom exception" of scenario 5. Defined here, and used through ``import
    compare_faults`` (not ``__main__``), so that workers can unpickle it by reference."""


# ================================================================ child: one scenario, one manager


class Report:
    """What a run found, saved as JSON after every change, so that the parent can read it even
    when it has to kill the run."""

    def __init__(self, path: str):
        self.path = path
        self.data: Dict[str, Any] = {
            "facts": [],
            "phase": "starting",
            "phase_at": time.time(),
            "last_return": None,  # when get_steps last returned
            "worker_pids": [],
            "returned_at": None,  # when the scenario function returned
            "grep_console": None,  # a string the parent looks for in the run's console output
        }
        self.save()

    def fact(self, text: str) -> None:
        self.data["facts"].append(text)
        self.save()

    def phase(self, name: str) -> None:
        self.data["phase"], self.data["phase_at"] = name, time.time()
        self.save()

    def save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f)
        os.replace(tmp, self.path)


def first_line(text: str, limit: int = 170) -> str:
    lines = str(text).strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def describe_exception(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {first_line(str(exc))}"


class Run:
    """The child side: builds the manager, steps it, closes it, and writes facts to the report."""

    def __init__(self, manager_name: str, run_dir: str):
        import logging

        self.manager_name = manager_name
        self.run_dir = run_dir
        self.player_dir = os.path.join(run_dir, "players")
        self.report = Report(os.path.join(run_dir, "report.json"))
        self.seen_pids: Dict[int, List[int]] = {}  # worker id -> its pids, in order
        self.logged: List[tuple] = []  # (time, level, first line) of the managers' warnings

        class Capture(logging.Handler):
            def emit(handler, record: logging.LogRecord) -> None:
                self.logged.append((record.created, record.levelname, first_line(record.getMessage())))

        capture = Capture(logging.WARNING)
        for name in ("mlagents_plugin", "mlagents.trainers.subprocess_env_manager"):
            logging.getLogger(name).addHandler(capture)

    def fact(self, text: str) -> None:
        self.report.fact(text)

    # ------------------------------------------------------------------ the manager

    def manager(self, factory: Callable, **settings: Any) -> Any:
        from mlagents.trainers.settings import RunOptions

        self.report.phase("constructing the manager")
        if self.manager_name == "upstream":
            from mlagents.trainers.subprocess_env_manager import SubprocessEnvManager

            manager = SubprocessEnvManager(factory, RunOptions(), N_ENV)
        else:
            from mlagents_plugin import EnvManagerSettings, SupervisedEnvManager

            manager = SupervisedEnvManager(
                factory, RunOptions(), N_ENV, EnvManagerSettings(**settings)
            )
        self.note_pids(manager)
        self.report.phase("reset")
        manager.reset({})  # upstream cannot take reset(None)
        return manager

    def worker_pids(self, manager: Any) -> Dict[int, int]:
        if self.manager_name == "upstream":
            return {w.worker_id: w.process.pid for w in manager.env_workers}
        return dict(manager.worker_pids)

    def note_pids(self, manager: Any) -> None:
        changed = False
        for worker_id, pid in self.worker_pids(manager).items():
            pids = self.seen_pids.setdefault(worker_id, [])
            if not pids or pids[-1] != pid:
                pids.append(pid)
                changed = True
        if changed:
            self.report.data["worker_pids"] = sorted({p for ps in self.seen_pids.values() for p in ps})
            self.report.save()

    def loop(self, manager: Any, seconds: float, label: str = "get_steps loop") -> "Loop":
        self.report.phase(label)
        result = Loop(self, manager)
        result.run(seconds)
        return result

    def close(self, manager: Any) -> None:
        self.report.phase("close")
        wall0, cpu0 = time.time(), time.process_time()
        try:
            manager.close()
        except Exception as e:
            self.fact(f"close() raised {describe_exception(e)}")
        wall, cpu = time.time() - wall0, time.process_time() - cpu0
        self.fact(f"close() took {wall:.1f} s (trainer CPU {cpu / max(wall, 1e-9):.0%} of a core)")
        # A worker told to close may still be on its way out when close() returns: give it
        # AFTER_CLOSE_S before calling it left running.
        closed_at = time.time()
        at_return = self.running_after_close()
        while self.running_after_close() and time.time() - closed_at < AFTER_CLOSE_S:
            time.sleep(0.05)
        still = self.running_after_close()
        if still:
            self.fact(f"**still running {AFTER_CLOSE_S:.0f} s after close(): {', '.join(still)}**")
        elif at_return:
            self.fact(f"everything exited within {time.time() - closed_at:.1f} s after close() returned")
        else:
            self.fact("nothing running when close() returned")
        self.report.phase("returning")

    def running_after_close(self) -> List[str]:
        alive = [
            f"worker {worker_id} (pid {pid})"
            for worker_id, pids in sorted(self.seen_pids.items())
            for pid in pids
            if _alive(pid)
        ]
        return alive + [f"player pid {p}" for p in self.player_pids() if _alive(p)]

    def player_pids(self) -> List[int]:
        if not os.path.isdir(self.player_dir):
            return []
        return sorted(int(name) for name in os.listdir(self.player_dir))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Loop:
    """Calls get_steps until ``seconds`` pass or it raises; records when each worker stepped."""

    def __init__(self, run: Run, manager: Any):
        self.run_, self.manager = run, manager
        self.start = self.end = time.time()
        self.calls = 0
        self.steps: Dict[int, List[float]] = {}
        self.error: Optional[BaseException] = None
        self.error_at: Optional[float] = None
        self.cpu = 0.0

    @property
    def wall(self) -> float:
        return self.end - self.start

    def run(self, seconds: float) -> None:
        report = self.run_.report
        self.start, cpu0, last_save = time.time(), time.process_time(), 0.0
        try:
            while time.time() - self.start < seconds:
                steps = self.manager.get_steps()
                now = time.time()
                self.calls += 1
                for step in steps:
                    self.steps.setdefault(step.worker_id, []).append(now)
                self.run_.note_pids(self.manager)
                if now - last_save > 0.5:  # a heartbeat: tells the parent get_steps returns
                    report.data["last_return"], last_save = now, now
                    report.save()
        except Exception as e:
            self.error, self.error_at = e, time.time()
        finally:
            self.end, self.cpu = time.time(), time.process_time() - cpu0

    # ------------------------------------------------------------------ what it saw

    def describe(self, since: float, worker_id: int, what: str) -> None:
        """Facts about the loop; ``since``: when the fault was caused (or the loop started),
        ``worker_id``: the faulty worker; ``what``: how to name ``since`` ("after the kill")."""
        fact = self.run_.fact
        if self.error is not None:
            fact(f"get_steps raised **{describe_exception(self.error)}** {self.error_at - since:.2f} s {what}")
        else:
            fact(f"get_steps never raised ({self.calls} calls in {self.wall:.1f} s)")
        logged = [r for r in self.run_.logged if r[0] >= since]
        if logged:
            t, level, message = logged[0]
            fact(f"first manager log {t - since:.2f} s {what}: [{level}] {message}")
        times = [t for t in self.steps.get(worker_id, []) if t >= since]
        pids = self.run_.seen_pids.get(worker_id, [])
        if len(pids) > 1:
            fact(f"worker {worker_id} was replaced: pids {' → '.join(map(str, pids))}")
        if times:
            gap = self.end - times[-1]
            fact(
                f"worker {worker_id}: {len(times)} steps {what}, the last at +{times[-1] - since:.2f} s"
                + (f", then **none for {gap:.1f} s**" if gap > 1.0 else "")
            )
        else:
            fact(f"worker {worker_id}: **no step for {self.end - since:.1f} s** {what}")
        others = sum(len(ts) for w, ts in self.steps.items() if w != worker_id)
        fact(
            f"other workers: {others} steps; trainer CPU while waiting "
            f"{self.cpu / max(self.wall, 1e-9):.0%} of a core"
        )


# ------------------------------------------------------------------ the scenarios (child side)


def testing():
    import mlagents_plugin.testing as testing_module

    return testing_module


def scenario_kill(run: Run) -> None:
    t = testing()
    manager = run.manager(t.make_factory(t.SimpleEnvironment, step_sleep_s=0.01))
    run.loop(manager, 1.0, "warm-up")
    victim = run.worker_pids(manager)[1]
    killed_at = time.time()
    os.kill(victim, signal.SIGKILL)
    run.fact(f"SIGKILLed worker 1 (pid {victim})")
    run.loop(manager, 15.0).describe(killed_at, 1, "after the kill")
    run.close(manager)


def scenario_exit(run: Run) -> None:
    t = testing()
    factory = t.make_factory(
        t.HardExitEnvironment, exit_code=3, after_steps=5, only_worker=1, step_sleep_s=0.01
    )
    manager = run.manager(factory)
    start = time.time()
    run.loop(manager, 15.0).describe(start, 1, "into the loop")
    run.close(manager)


def scenario_hang(run: Run) -> None:
    t = testing()
    factory = t.make_factory(t.HangingEnvironment, after_steps=5, only_worker=1, step_sleep_s=0.01)
    manager = run.manager(factory, step_timeout_s=2.0)
    start = time.time()
    run.loop(manager, 20.0).describe(start, 1, "into the loop")
    run.close(manager)


def scenario_cpu(run: Run) -> None:
    t = testing()
    manager = run.manager(t.make_factory(t.SimpleEnvironment, step_sleep_s=0.05))
    run.loop(manager, 0.5, "warm-up")
    loop = run.loop(manager, 5.0)
    steps = sum(len(ts) for ts in loop.steps.values())
    run.fact(
        f"{steps} steps in {loop.wall:.1f} s ({steps / loop.wall:.0f}/s; ideal {N_ENV / 0.05:.0f}/s); "
        f"**trainer CPU {loop.cpu:.2f} s / {loop.wall:.1f} s wall = {loop.cpu / loop.wall:.0%} of a core**"
    )
    if loop.error is not None:
        run.fact(f"get_steps raised {describe_exception(loop.error)}")
    run.close(manager)


def where_is_worker_traceback(exc: BaseException) -> str:
    """Where, if anywhere, the caller can find the worker's traceback (a faulty_envs.py frame)."""
    places = []
    if any(FAULTY_FILE in frame.filename for frame in traceback.extract_tb(exc.__traceback__)):
        places.append("exc.__traceback__")
    if exc.__cause__ is not None and FAULTY_FILE in "".join(traceback.format_exception(exc.__cause__)):
        places.append(f"exc.__cause__ ({type(exc.__cause__).__name__})")
    if exc.__context__ is not None and exc.__context__ is not exc.__cause__:
        if FAULTY_FILE in "".join(traceback.format_exception(exc.__context__)):
            places.append(f"exc.__context__ ({type(exc.__context__).__name__})")
    if FAULTY_FILE in str(exc):
        places.append("str(exc)")
    places += [f"exc.{name}" for name, value in vars(exc).items() if FAULTY_FILE in str(value)]
    notes = getattr(exc, "__notes__", None)
    where = "worker traceback available in " + " and ".join(places) if places else (
        "**no worker traceback** reaches the caller"
    )
    return where + (f"; note: {first_line(notes[0])}" if notes else "")


def raising_scenario(env_class_name: str, **env_kwargs: Any) -> Callable[[Run], None]:
    def scenario(run: Run) -> None:
        t = testing()
        factory = t.make_factory(
            getattr(t, env_class_name), after_steps=5, only_worker=1, step_sleep_s=0.01, **env_kwargs
        )
        manager = run.manager(factory)
        run.report.data["grep_console"] = FAULTY_FILE
        start = time.time()
        loop = run.loop(manager, 10.0)
        loop.describe(start, 1, "into the loop")
        if loop.error is not None:
            run.fact(where_is_worker_traceback(loop.error))
        run.close(manager)

    return scenario


def scenario_custom_exception(run: Run) -> None:
    import compare_faults  # this file, as a module workers can import (see CustomEnvError)

    raising_scenario(
        "UnexpectedExceptionEnvironment",
        exception_type=compare_faults.CustomEnvError,
        message="injected fault",
    )(run)


def scenario_close_hung(run: Run) -> None:
    t = testing()
    factory = t.make_factory(
        t.HangingEnvironment, after_steps=1, only_worker=1, ignore_sigterm=True, step_sleep_s=0.01
    )
    manager = run.manager(factory)
    start = time.time()
    run.loop(manager, 2.0).describe(start, 1, "into the loop")
    run.close(manager)


def scenario_player(run: Run) -> None:
    t = testing()
    os.makedirs(run.player_dir, exist_ok=True)
    factory = t.make_factory(
        t.PlayerLaunchingEnvironment, player_pid_dir=run.player_dir, step_sleep_s=0.01
    )
    manager = run.manager(factory)
    run.loop(manager, 1.0, "warm-up")
    victim = run.worker_pids(manager)[1]
    killed_at = time.time()
    os.kill(victim, signal.SIGKILL)
    run.fact(f"SIGKILLed worker 1 (pid {victim}); players started so far: {len(run.player_pids())}")
    run.loop(manager, 4.0).describe(killed_at, 1, "after the kill")
    run.fact(f"players started in all: {len(run.player_pids())}")
    run.close(manager)


class Scenario(NamedTuple):
    key: str
    title: str
    body: Callable[[Run], None]
    bound_s: float  # the run is killed if the scenario has not returned by then


SCENARIOS = [
    Scenario("kill", "1. worker SIGKILLed mid-run (loop 15 s)", scenario_kill, 50),
    Scenario("exit", "2. worker calls `os._exit(3)` at step 5 (HardExitEnvironment)", scenario_exit, 45),
    Scenario(
        "hang",
        "3. worker hangs in step 5 (HangingEnvironment; loop 20 s; ours step_timeout_s=2)",
        scenario_hang,
        55,
    ),
    Scenario("cpu", "4. trainer CPU while workers sleep 50 ms per step (5 s)", scenario_cpu, 40),
    Scenario(
        "exception",
        "5. env raises a custom exception (`CustomEnvError`) in step 5",
        scenario_custom_exception,
        40,
    ),
    Scenario(
        "unpicklable",
        "6a. env raises an exception that cannot be pickled (holds a lock)",
        raising_scenario("UnpicklableExceptionEnvironment", kind="lock", message="injected fault"),
        40,
    ),
    Scenario(
        "unrebuildable",
        "6b. env raises an exception that cannot be rebuilt (`__init__(code, detail)`)",
        raising_scenario("UnpicklableExceptionEnvironment", kind="two_args", message="injected fault"),
        40,
    ),
    Scenario(
        "close_hung",
        "7. close() with a hung worker that ignores SIGTERM (then the interpreter must exit)",
        scenario_close_hung,
        45,
    ),
    Scenario(
        "player",
        "8. worker that launched a player is SIGKILLed, then close()",
        scenario_player,
        45,
    ),
]
BY_KEY = {s.key: s for s in SCENARIOS}


def child_main(key: str, manager_name: str, run_dir: str) -> None:
    run = Run(manager_name, run_dir)
    try:
        BY_KEY[key].body(run)
    except Exception as e:  # the scenario itself failed (e.g. the manager raised in reset)
        run.fact(f"scenario aborted in phase '{run.report.data['phase']}': {describe_exception(e)}")
        traceback.print_exc()
    run.report.data["returned_at"] = time.time()
    run.report.phase("interpreter exit")
    sys.stdout.flush()
    # If the interpreter is still exiting shortly before the parent gives up, dump every thread's
    # stack to the console, so the parent can say where it hangs.
    faulthandler.dump_traceback_later(EXIT_GRACE_S - 5, exit=False)
    # Returning lets the interpreter exit normally: atexit handlers, multiprocessing's join of
    # non-daemonic workers and all. The parent times that.


# ================================================================ parent: run, bound, clean up


def tagged_processes(tag: str) -> List[Any]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(TAG_ENV) == tag and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def label(proc: Any, data: Dict[str, Any], players: List[int]) -> str:
    if proc.pid in players:
        return f"player {proc.pid}"
    if proc.pid in data.get("worker_pids", []):
        return f"worker {proc.pid}"
    try:
        cmd = " ".join(proc.cmdline())
    except Exception:
        cmd = "?"
    for name in ("forkserver", "resource_tracker", "compare_faults.py"):
        if name in cmd:
            return f"{name.replace('compare_faults.py', 'scenario process')} {proc.pid}"
    return f"pid {proc.pid} ({first_line(cmd, 40)})"


def read_report(path: str) -> Dict[str, Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"facts": [], "phase": "not started", "phase_at": None}


def kill_and_wait(procs: List[Any]) -> None:
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=5)


def run_one(scenario: Scenario, manager_name: str) -> List[str]:
    """Run one scenario against one manager in its own session; return the facts for its cell."""
    run_dir = os.path.join(RUNS_DIR, f"{scenario.key}-{manager_name}")
    os.makedirs(os.path.join(run_dir, "players"), exist_ok=True)
    for stale in ("report.json", "console.log"):
        if os.path.exists(os.path.join(run_dir, stale)):
            os.remove(os.path.join(run_dir, stale))
    for stale in os.listdir(os.path.join(run_dir, "players")):
        os.remove(os.path.join(run_dir, "players", stale))
    report_path = os.path.join(run_dir, "report.json")
    tag = f"{scenario.key}-{manager_name}-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, **{TAG_ENV: tag, "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    cmd = [sys.executable, os.path.abspath(__file__), "--child", scenario.key, manager_name, "--run-dir", run_dir]
    with open(os.path.join(run_dir, "console.log"), "w") as console:
        proc = subprocess.Popen(cmd, stdout=console, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    started, verdict, rc = time.time(), [], None
    while rc is None:
        try:
            rc = proc.wait(timeout=0.25)
            break
        except subprocess.TimeoutExpired:
            pass
        now, data = time.time(), read_report(report_path)
        returned = data.get("returned_at")
        if returned is not None and now - returned > EXIT_GRACE_S:
            verdict.append(
                f"**hung at exit**: interpreter still running {EXIT_GRACE_S:.0f} s after the scenario "
                f"returned; main thread in {hung_stack(os.path.join(run_dir, 'console.log'))}"
            )
        elif returned is None and now - started > scenario.bound_s:
            phase, last = data.get("phase"), data.get("last_return")
            since = now - (last if phase == "get_steps loop" and last else data.get("phase_at") or started)
            verdict.append(
                f"**stalled > {now - started:.0f} s** in {phase}"
                + (
                    f" (get_steps had not returned for {since:.0f} s)"
                    if phase == "get_steps loop"
                    else f" ({since:.0f} s in it)"
                )
            )
        else:
            continue
        running = tagged_processes(tag)
        players = read_players(run_dir)
        verdict.append("running when killed: " + ", ".join(label(p, data, players) for p in running))
        os.killpg(proc.pid, signal.SIGKILL)  # the run's session: scenario process, workers, forkserver
        rc = proc.wait()
    data = read_report(report_path)
    if not verdict:
        exit_s = time.time() - data["returned_at"] if data.get("returned_at") else float("nan")
        verdict.append(f"interpreter exited (rc {rc}) within {exit_s:.1f} s of the scenario returning")
    # Whatever is left now escaped the session (players) or outlived its parent: report, kill.
    settle_until = time.time() + SETTLE_S
    while tagged_processes(tag) and time.time() < settle_until:
        time.sleep(0.2)
    players = read_players(run_dir)
    leftovers = tagged_processes(tag)
    left_pids = {p.pid for p in leftovers}
    leftovers += [p for p in (psutil_process(pid) for pid in players) if p is not None and p.pid not in left_pids]
    if leftovers:
        verdict.append(
            f"**left running {SETTLE_S:.0f} s after the run ended: "
            + ", ".join(label(p, data, players) for p in leftovers)
            + "** (killed by this script)"
        )
        kill_and_wait(leftovers)
    else:
        verdict.append("nothing left running afterwards")
    grep = data.get("grep_console")
    if grep:
        with open(os.path.join(run_dir, "console.log"), errors="replace") as f:
            shown = grep in f.read()
        verdict.append(f"worker traceback printed on the console: {'yes' if shown else 'no'}")
    return data.get("facts", []) + verdict


def hung_stack(console_path: str, depth: int = 4) -> str:
    """The innermost frames of the first thread in the faulthandler dump in a run's console."""
    with open(console_path, errors="replace") as f:
        text = f.read()
    dump = text[text.rfind("Timeout ("):] if "Timeout (" in text else ""
    frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', dump.split("\n\n")[0])
    if not frames:
        return "(no stack dump)"
    return " ← ".join(
        f"{func} ({'/'.join(path.split('/')[-2:])}:{line})" for path, line, func in frames[:depth]
    )


def read_players(run_dir: str) -> List[int]:
    folder = os.path.join(run_dir, "players")
    return sorted(int(n) for n in os.listdir(folder)) if os.path.isdir(folder) else []


def psutil_process(pid: int) -> Optional[Any]:
    try:
        proc = psutil.Process(pid)
        return proc if proc.status() != psutil.STATUS_ZOMBIE else None
    except psutil.Error:
        return None


def cell(facts: List[str]) -> str:
    return "<br>".join(f.replace("|", "\\|").replace("\n", " ") for f in facts)


def parent_main(only: Optional[List[str]], managers: List[str], save: Optional[str]) -> str:
    scenarios = [s for s in SCENARIOS if not only or s.key in only]
    rows = []
    for scenario in scenarios:
        cells = []
        for manager_name in MANAGERS:
            if manager_name not in managers:
                cells.append("(not run)")
                continue
            t0 = time.time()
            print(f"[{time.strftime('%H:%M:%S')}] {scenario.key} / {manager_name} ...", file=sys.stderr, flush=True)
            cells.append(cell(run_one(scenario, manager_name)))
            print(f"    done in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
        rows.append(f"| {scenario.title} | {cells[0]} | {cells[1]} |")
    table = "\n".join(
        [
            "| scenario | upstream `SubprocessEnvManager` | ours `SupervisedEnvManager` |",
            "| --- | --- | --- |",
            *rows,
        ]
    )
    if save:
        command = " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv])
        with open(save, "w") as f:
            f.write(
                f"# Fault scenarios: upstream vs ours\n\nCommand (run from {os.getcwd()}):\n\n"
                f"    {command}\n\nRun at {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, "
                f"{N_ENV} workers per manager, per-run logs in {RUNS_DIR}/.\n\n{table}\n"
            )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(BY_KEY), help="run only these scenarios")
    parser.add_argument("--managers", nargs="+", choices=MANAGERS, default=list(MANAGERS))
    parser.add_argument("--save", help="also write the table, with this command, to this file")
    parser.add_argument("--child", nargs=2, metavar=("SCENARIO", "MANAGER"), help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child[0], args.child[1], args.run_dir)
    else:
        print(parent_main(args.only, args.managers, args.save))


if __name__ == "__main__":
    main()
