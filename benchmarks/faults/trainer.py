"""The trainer side of a run, in the run's process: builds the manager under test (upstream or
ours), steps it, closes it, and notes what it saw as facts in the run's record."""
import logging
import time
from typing import Any, Callable, Dict, List, Optional

from faults import N_ENV
from faults.processes import living_process, player_pids, players_dir
from faults.record import RunRecord, describe_exception, first_line

AFTER_CLOSE_S = 2.0  # how long workers may take to go once close() returned


class Run:
    """Builds the manager, steps it, closes it, and writes facts to the record."""

    def __init__(self, manager_name: str, run_dir: str):
        self.manager_name = manager_name
        self.run_dir = run_dir
        self.player_dir = players_dir(run_dir)
        self.record = RunRecord(run_dir)
        self.seen_pids: Dict[int, List[int]] = {}  # worker id -> its pids, in order
        self.logged: List[tuple] = []  # (time, level, first line) of the managers' warnings

        class Capture(logging.Handler):
            def emit(handler, record: logging.LogRecord) -> None:
                self.logged.append((record.created, record.levelname, first_line(record.getMessage())))

        capture = Capture(logging.WARNING)
        for name in ("mlagents_plugin", "mlagents.trainers.subprocess_env_manager"):
            logging.getLogger(name).addHandler(capture)

    def fact(self, text: str) -> None:
        self.record.fact(text)

    # ------------------------------------------------------------------ the manager

    def manager(self, factory: Callable, **settings: Any) -> Any:
        """The manager under test, reset; ``settings`` are ours only (upstream has none)."""
        from mlagents.trainers.settings import RunOptions

        self.record.phase("constructing the manager")
        if self.manager_name == "upstream":
            from mlagents.trainers.subprocess_env_manager import SubprocessEnvManager

            manager = SubprocessEnvManager(factory, RunOptions(), N_ENV)
        else:
            from mlagents_plugin import EnvManagerSettings, SupervisedEnvManager

            manager = SupervisedEnvManager(
                factory, RunOptions(), N_ENV, EnvManagerSettings(**settings)
            )
        self.note_pids(manager)
        self.record.phase("reset")
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
            self.record.data["worker_pids"] = sorted({p for ps in self.seen_pids.values() for p in ps})
            self.record.save()

    def loop(self, manager: Any, seconds: float, label: str = "get_steps loop") -> "Loop":
        self.record.phase(label)
        result = Loop(self, manager)
        result.run(seconds)
        return result

    def close(self, manager: Any) -> None:
        self.record.phase("close")
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
        self.record.phase("returning")

    def running_after_close(self) -> List[str]:
        alive = [
            f"worker {worker_id} (pid {pid})"
            for worker_id, pids in sorted(self.seen_pids.items())
            for pid in pids
            if living_process(pid) is not None
        ]
        return alive + [f"player pid {p}" for p in player_pids(self.run_dir) if living_process(p) is not None]


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
        record = self.run_.record
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
                    record.data["last_return"], last_save = now, now
                    record.save()
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
