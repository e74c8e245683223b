"""The chaos run: stock `mlagents-learn` trains on player builds while faults land at random.

    python benchmarks/chaos.py [--duration 180] [--num-envs 4] [--seed N] [--upstream] [--out DIR]

Every few seconds one fault, drawn at random, hits one worker slot that has no fault pending:
SIGKILL, SIGTERM or SIGSTOP of its env worker; SIGKILL, SIGSTOP or a crash (SIGSEGV) of its
player; or an env exception (the player quits the link, as Application.Quit() does, and
mlagents-envs raises UnityCommunicatorStoppedException). Then Ctrl-C.

It passes when: mlagents-learn exits 0 with the model saved; every fault is in the log with its
cause (the restart naming that worker's pid, player pid or exception); the health stats in
TensorBoard count them (deaths, hangs, and restarts by each cause, each equal to what the faults
injected should give); and nothing of the run is left (processes, shared memory, temporary
files and directories). ``--upstream`` runs the same faults against ML-Agents' own manager
(``env_manager: {enabled: false}``) and reports what happened instead. Bounded throughout: a
run that stops making progress is killed, and says so.
"""
import argparse
import getpass
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, NamedTuple

import psutil
import yaml

from mlagents_plugin.examples import config_file
from mlagents_plugin.local import processes
from mlagents_plugin.player.build import make_build
from mlagents_plugin.testing.ports import free_port_block

MLAGENTS_LEARN = str(Path(sys.executable).parent / "mlagents-learn")
TIMEOUT_WAIT_S = 10  # mlagents-envs' wait for a build (--timeout-wait)
STEP_TIMEOUT_S = 12.0  # ours, a little longer: a stopped player is mlagents-envs' to report
STALL_S = 60.0  # no training progress this long: the run is stuck
# torch's compile cache, kept across runs on purpose (see leftovers), named as torch names it
TORCH_CACHE = "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())


class Fault(NamedTuple):
    at: float
    kind: str
    worker_id: int
    pid: int
    expect: str  # a regular expression the restart line for this fault must match
    cause: str  # the restart cause it should be counted under: died, hung or unity


# kind -> (target, signal, what the log must say, restart cause)
KINDS = {
    "worker SIGKILL": ("worker", signal.SIGKILL, r"\(pid {pid}\) was killed by SIGKILL", "died"),
    "worker SIGTERM": ("worker", signal.SIGTERM, r"\(pid {pid}\) was stopped by SIGTERM", "died"),
    "worker SIGSTOP": ("worker", signal.SIGSTOP, r"\(pid {pid}\) did not answer", "hung"),
    "player SIGKILL": ("player", signal.SIGKILL, r"The Unity player \(pid {pid}\) was killed by SIGKILL", "unity"),
    "player SIGSTOP": ("player", signal.SIGSTOP, r"UnityTimeOutException", "unity"),
    "player crash": ("player", signal.SIGSEGV, r"The Unity player \(pid {pid}\) was killed by SIGSEGV", "unity"),
    "env exception": ("player", signal.SIGUSR1, r"UnityCommunicatorStoppedException", "unity"),
}


def restarts(line: str, worker_id: int) -> bool:
    """Is ``line`` the restart of ``worker_id``? Ours, or upstream's ("Restarting worker[2]")."""
    return f"Restarting env worker {worker_id} " in line or f"Restarting worker[{worker_id}]" in line


class Log:
    """mlagents-learn's output, line by line, with when each line came."""

    def __init__(self, stream) -> None:
        self.lines: List[tuple] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            with self.lock:
                self.lines.append((time.monotonic(), line))

    def text(self) -> str:
        with self.lock:
            return "".join(line for _, line in self.lines)

    def after(self, since: float) -> List[str]:
        with self.lock:
            return [line for at, line in self.lines if at >= since]

    def last_progress(self) -> float:
        with self.lock:
            stamps = [at for at, line in self.lines if "Step: " in line]
        return stamps[-1] if stamps else 0.0


def slots(trainer_pid: int, base_port: int) -> Dict[int, Dict[str, psutil.Process]]:
    """worker id -> its running worker and player (found from the player's port)."""
    def cmdline(process: psutil.Process) -> str:
        try:
            return " ".join(process.cmdline())
        except psutil.Error:  # gone, or a zombie (upstream does not reap its dead workers)
            return ""

    def children(process: psutil.Process) -> List[psutil.Process]:
        try:
            return process.children()
        except psutil.Error:
            return []

    top = children(psutil.Process(trainer_pid)) if psutil.pid_exists(trainer_pid) else []
    servers = [c for c in top if "forkserver" in cmdline(c)]
    found: Dict[int, Dict[str, psutil.Process]] = {}
    for worker in children(servers[0]) if servers else top:
        for player in children(worker):
            match = re.search(r"--mlagents-port (\d+)", cmdline(player))
            if match:
                found[int(match.group(1)) - base_port] = {"worker": worker, "player": player}
    return found


def stopped(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return True


def leftovers(trainer_pid: int, run_dir: Path, temp_dir: Path) -> Dict[str, list]:
    """What the run left: its processes, its shared memory segments, and its temporary files.

    The run's TMPDIR is ``temp_dir``, made for it alone, so whatever any process of the run
    made through ``tempfile`` (multiprocessing's pymp-* directory of the fork server's socket,
    anything ML-Agents, torch, gRPC or the players make) is in it, and nothing else is. One entry
    is not the run's: torch's per-user compile cache (``torchinductor_<user>``), which importing
    torch creates under TMPDIR and keeps on purpose, for every later run (``cache``). The
    plugin's only temp dirs with a fixed place, Ray's /tmp/mlap-ray-<pid>-*, are looked for by
    name (a local run makes none)."""
    procs = {p.pid for p in processes.find_tagged(processes.owner_prefix(trainer_pid))}
    for proc in processes.every_process():
        try:
            if str(run_dir) in " ".join(proc.cmdline()) and proc.status() != psutil.STATUS_ZOMBIE:
                procs.add(proc.pid)
        except psutil.Error:
            pass
    segments = [n for n in os.listdir("/dev/shm") if n.startswith(f"mlap_{trainer_pid}_")]
    ray_parent, ray_stem = os.path.split(f"{processes.DIR_ROOT}{trainer_pid}-")
    entries = sorted(os.listdir(temp_dir))
    cache = [str(temp_dir / n) for n in entries if n == TORCH_CACHE]
    temp = [str(temp_dir / n) for n in entries if n != TORCH_CACHE]
    temp += sorted(os.path.join(ray_parent, n) for n in os.listdir(ray_parent) if n.startswith(ray_stem))
    return {"processes": sorted(procs), "segments": segments, "temp": temp, "cache": cache}


def health(run_dir: Path) -> Dict[str, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir / "Goal"), size_guidance={"scalars": 0})
    accumulator.Reload()
    prefix = "Environment/Env Workers/"
    return {
        tag[len(prefix):]: sum(e.value for e in accumulator.Scalars(tag))
        for tag in accumulator.Tags()["scalars"] if tag.startswith(prefix) and "Latency" not in tag
    }


def run(args: argparse.Namespace) -> Dict:
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="chaos-", dir=args.out))
    make_build(str(work / "builds"), "goal")
    config = yaml.safe_load(config_file("goal_player.yaml").read_text())
    config["behaviors"]["Goal"]["max_steps"] = 10**8
    config["env_manager"] = (
        {"enabled": False} if args.upstream else {"restart_backoff_s": 0.2, "step_timeout_s": STEP_TIMEOUT_S}
    )
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    base_port = free_port_block(args.num_envs + 16)
    # The run's own TMPDIR (see leftovers). Short, under the system's: multiprocessing puts its
    # AF_UNIX sockets in it, and their paths must stay under 108 bytes.
    temp_dir = Path(tempfile.mkdtemp(prefix="chaos-tmp-"))
    command = [
        MLAGENTS_LEARN, str(work / "config.yaml"), f"--env={work / 'builds' / 'goal'}",
        f"--num-envs={args.num_envs}", f"--base-port={base_port}", "--run-id=chaos",
        f"--results-dir={work / 'results'}", f"--timeout-wait={TIMEOUT_WAIT_S}",
        "--max-lifetime-restarts=-1", "--restarts-rate-limit-n=-1",
        "--env-args", "--num-agents", "4",
    ]
    trainer = subprocess.Popen(
        command, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, "TMPDIR": str(temp_dir)},
    )
    log = Log(trainer.stdout)
    faults: List[Fault] = []
    pending: Dict[int, Fault] = {}
    report: Dict = {"upstream": args.upstream, "duration_s": args.duration, "seed": args.seed, "work": str(work)}
    try:
        deadline = time.monotonic() + 180
        while log.last_progress() == 0.0:
            if trainer.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("training never started:\n" + log.text()[-3000:])
            time.sleep(0.5)
        started = time.monotonic()
        while time.monotonic() - started < args.duration:
            time.sleep(rng.uniform(3.0, 6.0))
            if trainer.poll() is not None:
                report["ended_early"] = f"mlagents-learn exited with {trainer.returncode} during the faults"
                break
            if time.monotonic() - max(log.last_progress(), started) > STALL_S:
                report["stalled"] = f"no training progress for {STALL_S:.0f} s after fault {len(faults)}"
                break
            for worker_id, fault in list(pending.items()):  # reported: the slot may be hit again
                if any(restarts(line, worker_id) for line in log.after(fault.at)):
                    del pending[worker_id]
            targets = {w: s for w, s in slots(trainer.pid, base_port).items()
                       if w not in pending and not any(stopped(p) for p in s.values())}
            if not targets:
                continue
            kind = rng.choice(sorted(KINDS))
            target, sig, expect, cause = KINDS[kind]
            worker_id = rng.choice(sorted(targets))
            process = targets[worker_id][target]
            fault = Fault(time.monotonic(), kind, worker_id, process.pid, expect.format(pid=process.pid), cause)
            try:
                process.send_signal(sig)
            except psutil.Error:
                continue
            faults.append(fault)
            pending[worker_id] = fault
            print(f"{fault.at - started:6.1f} s  {kind} -> worker {worker_id} (pid {process.pid})", flush=True)
        # The last faults are noticed and restarted. The longest to notice is a worker stopped
        # while it builds its env (a fault can land on a slot being restarted): the manager's
        # start-up deadline, derived from --timeout-wait, ends it.
        from mlagents_plugin.core.settings import STARTUP_MARGIN_S

        settle = time.monotonic() + max(2 * STEP_TIMEOUT_S, TIMEOUT_WAIT_S + STARTUP_MARGIN_S + 5.0)
        while pending and time.monotonic() < settle and trainer.poll() is None:
            for worker_id, fault in list(pending.items()):
                if any(restarts(line, worker_id) for line in log.after(fault.at)):
                    del pending[worker_id]
            time.sleep(0.5)
        restarted = time.monotonic()  # a summary after the last restart: its stats are written
        while log.last_progress() < restarted and time.monotonic() < settle + STALL_S and trainer.poll() is None:
            time.sleep(0.2)
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGINT)  # Ctrl-C
        try:
            trainer.wait(timeout=120)
        except subprocess.TimeoutExpired:
            report["hung_at_exit"] = "mlagents-learn did not exit within 120 s of Ctrl-C"
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
            trainer.wait()
    time.sleep(3.0)  # what is being killed finishes dying
    text = log.text()
    run_dir = work / "results" / "chaos"
    report["exit_code"] = trainer.returncode
    report["model_saved"] = (run_dir / "Goal.onnx").exists()
    report["faults"] = {kind: sum(f.kind == kind for f in faults) for kind in KINDS}
    report["faults_total"] = len(faults)
    report["restarts_logged"] = sum("Restarting " in line for line in text.splitlines())
    unexplained = []
    for fault in faults:
        lines = [line for line in log.after(fault.at) if restarts(line, fault.worker_id)]
        if not (lines and re.search(fault.expect, lines[0])):
            unexplained.append(f"{fault.kind} on worker {fault.worker_id} (pid {fault.pid}): "
                               + (lines[0].strip()[:300] if lines else "no restart logged"))
    report["unexplained"] = unexplained
    expected = {cause: sum(f.cause == cause for f in faults) for cause in ("died", "hung", "unity")}
    report["expected_restarts"] = expected
    report["tensorboard"] = health(run_dir) if run_dir.is_dir() else {}
    report["leftovers"] = leftovers(trainer.pid, work, temp_dir)
    shutil.rmtree(temp_dir, ignore_errors=True)
    steps = re.findall(r"Step: (\d+)\.", text)
    rewards = re.findall(r"Mean Reward: (-?\d+\.\d+)", text)
    report["agent_steps"] = int(steps[-1]) if steps else 0
    report["final_mean_reward"] = float(rewards[-1]) if rewards else None
    board = report["tensorboard"]
    counted = {cause: board.get(f"Restarts/{cause}", 0) for cause in ("died", "hung", "unity")}
    report["restarts_counted"] = counted
    # Each cause is compared on its own: every fault has exactly one cause (KINDS). A stopped
    # worker can say nothing, so only the trainer's step_timeout_s ends it: hung. A stopped
    # player is mlagents-envs' to report: its wait (--timeout-wait, TIMEOUT_WAIT_S) starts after
    # our step clock and ends STEP_TIMEOUT_S - TIMEOUT_WAIT_S seconds before it, and the manager
    # handles the worker's reply before it checks deadlines: unity. Were one ever counted under
    # the other cause, its restart line would not match ``expect`` either (unexplained).
    report["passed"] = bool(
        not args.upstream
        and report["exit_code"] == 0
        and report["model_saved"]
        and not unexplained
        and counted == expected
        and board.get("Deaths", 0) == expected["died"]
        and board.get("Hangs", 0) == expected["hung"]
        and not report["leftovers"]["processes"]
        and not report["leftovers"]["segments"]
        and not report["leftovers"]["temp"]
        and not any(k in report for k in ("ended_early", "stalled", "hung_at_exit"))
    )
    (work / "output.txt").write_text(text)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of faults")
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--upstream", action="store_true", help="ML-Agents' own manager instead")
    parser.add_argument("--out", default=None, help="where the run's folder goes (default: a temp dir)")
    args = parser.parse_args()
    args.seed = args.seed if args.seed is not None else random.randrange(10**6)
    report = run(args)
    print(json.dumps(report, indent=1))
    if args.upstream:
        return 0
    print("PASSED" if report["passed"] else "FAILED")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
