"""What faults and lifecycle cost: how fast a death is noticed, how long until a restarted worker
steps again, how long close() and start-up take."""
import logging
import os
import signal
import statistics
import time
from typing import Dict, List

from harness import FirstLog
from mlagents.trainers.settings import RunOptions

from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.local.supervisor import SupervisedEnvManager
from mlagents_plugin.testing import SimpleEnvironment, make_factory


def death(n_env: int) -> Dict[str, float]:
    run_options = RunOptions()
    run_options.env_settings.restarts_rate_limit_n = -1
    manager = SupervisedEnvManager(
        make_factory(SimpleEnvironment, step_sleep_s=0.001), run_options, n_env,
        EnvManagerSettings(restart_backoff_s=0.0),
    )
    handler = FirstLog("Restarting env worker")  # the supervisor's first restart: it noticed the death
    logging.getLogger("mlagents_plugin.core.supervision").addHandler(handler)
    try:
        manager.reset({})
        for _ in range(20):
            manager.get_steps()
        victim = n_env - 1
        killed_at = time.perf_counter()
        os.kill(manager.worker_pids[victim], signal.SIGKILL)
        deadline = killed_at + 60  # bounded: a restart that never comes fails the benchmark
        while time.perf_counter() < deadline:
            steps = manager.get_steps()
            if handler.at is not None and any(s.worker_id == victim for s in steps):
                back_at = time.perf_counter()
                break
        else:
            raise RuntimeError(f"worker {victim} was not restarted within 60 s")
        return {
            "detection_ms": 1000 * (handler.at - killed_at),
            "restart_to_first_step_ms": 1000 * (back_at - killed_at),
        }
    finally:
        logging.getLogger("mlagents_plugin.core.supervision").removeHandler(handler)
        manager.close()


def lifecycle(start_method: str, n_env: int) -> Dict[str, float]:
    started = time.perf_counter()
    manager = SupervisedEnvManager(
        make_factory(SimpleEnvironment), RunOptions(), n_env, EnvManagerSettings(start_method=start_method)
    )
    try:
        manager.reset({})  # every worker has built its env and answered
        ready = time.perf_counter()
        for _ in range(20):
            manager.get_steps()
    finally:
        closing = time.perf_counter()
        manager.close()
        closed = time.perf_counter()
    return {"startup_s": ready - started, "close_s": closed - closing}


def run(quick: bool) -> List[Dict]:
    repeats = 1 if quick else 5
    deaths = [death(4) for _ in range(repeats)]
    rows = [{
        "what": "hard death (SIGKILL), 4 workers",
        "detection_ms": [d["detection_ms"] for d in deaths],
        "restart_to_first_step_ms": [d["restart_to_first_step_ms"] for d in deaths],
    }]
    for start_method in ("forkserver", "spawn", "fork"):
        runs = [lifecycle(start_method, 8) for _ in range(1 if quick else 3)]
        rows.append({
            "what": f"8 workers, {start_method}",
            "startup_s": [r["startup_s"] for r in runs],
            "close_s": [r["close_s"] for r in runs],
        })
    for row in rows:
        print(row, flush=True)
    return rows


def markdown(rows: List[Dict]) -> str:
    def spread(values: List[float], unit: str) -> str:
        return f"{statistics.median(values):.0f} {unit} (max {max(values):.0f})" if unit == "ms" else \
            f"{statistics.median(values):.2f} s (runs: {', '.join(f'{v:.2f}' for v in values)})"

    death_row, *lifecycle_rows = rows
    out = [
        f"Hard death of one of 4 workers (SIGKILL), {len(death_row['detection_ms'])} runs: noticed after "
        f"{spread(death_row['detection_ms'], 'ms')}; the restarted worker's first step after "
        f"{spread(death_row['restart_to_first_step_ms'], 'ms')} (restart_backoff_s=0).",
        "",
        "| 8 workers | start-up (reset answered by all) | close() |",
        "| --- | --- | --- |",
    ]
    for row in lifecycle_rows:
        out.append(
            f"| {row['what'].split(', ')[1]} | {spread(row['startup_s'], 's')} | {spread(row['close_s'], 's')} |"
        )
    return "\n".join(out)
