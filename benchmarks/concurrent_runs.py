"""Several `mlagents-learn` runs started together on one --base-port (docs/benchmarks.md).

    python benchmarks/bench.py --only concurrent [--quick]

N runs (1, 2, 4) on player builds, 2 envs each, all on the same base port, as users who keep the
default; for each, the time from its start to its first summary ("Step: 500."), ours against
upstream's SubprocessEnvManager (`env_manager: {enabled: false}`), and what went wrong on the
way (port moves, restarts, Unity timeouts). A free block stands in for 5005, so the benchmark
meets nothing else that runs here.
"""
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List

import yaml

from mlagents_plugin.examples import config_file
from mlagents_plugin.player.build import make_build
from mlagents_plugin.testing.ports import free_port_block

LEARN = str(Path(sys.executable).parent / "mlagents-learn")
ENVS_PER_RUN = 2
FIRST_SUMMARY = "Step: 500."
TIMEOUT_S = 400.0


def _config(folder: Path, enabled: bool) -> Path:
    config = yaml.safe_load(config_file("goal_player.yaml").read_text())
    config["behaviors"]["Goal"].update(max_steps=1000, summary_freq=500)
    config["env_manager"] = {"enabled": enabled}
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def measure(manager: str, n_runs: int, build: Path, work: Path) -> Dict:
    base = free_port_block(64)
    runs: List[subprocess.Popen] = []
    firsts: List[float] = [float("inf")] * n_runs
    texts: List[List[str]] = [[] for _ in range(n_runs)]
    started = time.monotonic()

    def read(i: int) -> None:  # one reader per run: none waits for another's pipe
        for line in runs[i].stdout:  # type: ignore[union-attr]
            texts[i].append(line)
            if firsts[i] == float("inf") and FIRST_SUMMARY in line:
                firsts[i] = time.monotonic() - started

    readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(n_runs)]
    try:
        for i in range(n_runs):
            folder = work / f"{manager}-{n_runs}-{i}"
            folder.mkdir()
            command = [LEARN, str(_config(folder, manager == "ours")), "--run-id=run", "--force",
                       f"--env={build}", f"--num-envs={ENVS_PER_RUN}", f"--base-port={base}",
                       "--env-args", "--num-agents", "4"]
            runs.append(subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True, start_new_session=True))
            readers[i].start()
        for run in runs:
            try:
                run.wait(timeout=max(1.0, TIMEOUT_S - (time.monotonic() - started)))
            except subprocess.TimeoutExpired:
                pass
    finally:  # past the time allowed, or on an error or a Ctrl-C here: no run outlives the benchmark
        for run in runs:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
    for reader in readers[:len(runs)]:
        reader.join(timeout=10)
    text = "\n".join("".join(lines) for lines in texts)
    return {
        "manager": manager, "runs": n_runs,
        "first_summary_s": firsts,
        "ok": all(run.returncode == 0 for run in runs),
        "port_moves": text.count("moving to worker id"),
        "restarts": len(re.findall(r"Restarting env worker", text)),
        "unity_timeouts": text.count("UnityTimeOutException"),
        "port_in_use_errors": text.count("UnityWorkerInUseException"),
    }


def run(quick: bool) -> List[Dict]:
    counts = (1, 2) if quick else (1, 2, 4)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        make_build(str(work), "goal")
        for n_runs in counts:
            for manager in ("ours", "upstream"):  # alternating, so both see the same machine
                rows.append(measure(manager, n_runs, work / "goal", work))
                print(rows[-1], flush=True)
    return rows


def markdown(rows: List[Dict]) -> str:
    def reached(row: Dict) -> List[float]:
        return [t for t in row["first_summary_s"] if t != float("inf")]

    alone = {r["manager"]: max(reached(r)) for r in rows if r["runs"] == 1}
    out = [
        f"N runs started together on one --base-port, {ENVS_PER_RUN} player builds each: seconds "
        f"from the start to each run's first summary ({FIRST_SUMMARY!r}; median and slowest of the "
        "runs that got there), and what happened on the way. Upstream is ML-Agents' "
        "SubprocessEnvManager (`env_manager: {enabled: false}`).",
        "",
        "| runs | manager | first summary: median / slowest (s) | slowest against one run alone | "
        "runs that failed | port moves | worker restarts | Unity timeouts | UnityWorkerInUseException |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        times = reached(r)
        summary = f"{statistics.median(times):.1f} / {max(times):.1f}" if times else "-"
        ratio = f"{max(times) / alone[r['manager']]:.2f}x" if times else "-"
        failed = len(r["first_summary_s"]) - len(times)
        out.append(
            f"| {r['runs']} | {r['manager']} | {summary} | {ratio} | {failed} of {r['runs']} | "
            f"{r['port_moves']} | {r['restarts']} | {r['unity_timeouts']} | {r.get('port_in_use_errors', 0)} |"
        )
    return "\n".join(out)
