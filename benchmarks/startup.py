"""What a worker costs before it steps: start-up (manager built to the first reset answered by
every worker) and memory per worker, ours (forkserver: a fresh interpreter; for Python envs a
fork of the trainer where the trainer runs no native thread, as with ``OMP_NUM_THREADS=1`` in the
environment, which the measurements' processes inherit) against upstream (fork), for Python envs
and player builds, at 1, 4, 8 and 16 workers; and as on macOS and Windows, where both spawn their
workers: ours on the portable path against upstream with spawn (docs/platforms.md).

Each measurement runs in a fresh trainer process that has imported what ``mlagents-learn`` has
(ML-Agents' trainers, torch) and whose run options name a PPO behaviour, as ``mlagents-learn``'s
do. ``cold`` is the first manager of that process (ours then also starts its fork server,
NOTE [ A fork server forked from the trainer ]);
``warm`` a second one in the same process. Memory is read after 50 steps: RSS (all it has
resident), USS (what the worker alone holds) and PSS (its share of what it shares with its
siblings and its parent), beside a bare process that imported mlagents-envs.

    python benchmarks/startup.py --child ours python 4    # one measurement, printed as JSON
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

from mlagents_plugin.testing.ports import free_port_block

if __name__ in ("__main__", "__mp_main__"):
    # A measurement's trainer imports, at the top of its main module, what mlagents-learn's script
    # does: upstream's spawned workers import the main module again, as they do under mlagents-learn.
    import mlagents.trainers.learn  # noqa: F401

WORKERS = (1, 4, 8, 16)
ENVS = ("python", "torch", "build")  # torch: a Python env whose module imports torch (torch_env.py)
QUICK_ENVS = ("python", "build")
# (ours, upstream): Linux's defaults; and what macOS and Windows run (MLAGENTS_PLUGIN_PORTABLE=1)
PAIRS = {"linux": ("ours", "upstream"), "spawn": ("ours portable", "upstream spawn")}
STEPS_BEFORE_MEMORY = 50


def _child(which: str, env: str, n_env: int) -> Dict:
    import psutil
    from mlagents.plugins.trainer_type import register_trainer_plugins
    from mlagents.trainers.learn import create_environment_factory
    from mlagents.trainers.settings import RunOptions, TrainerSettings
    from mlagents.trainers.subprocess_env_manager import SubprocessEnvManager

    from mlagents_plugin.local.supervisor import SupervisedEnvManager
    from mlagents_plugin.player.build import make_build
    from mlagents_plugin.testing import SimpleEnvironment, make_factory

    register_trainer_plugins()
    if which == "upstream spawn":  # upstream takes the platform's default: spawn on macOS and Windows
        import multiprocessing

        multiprocessing.set_start_method("spawn", force=True)
    run_options = RunOptions()
    run_options.behaviors["Goal"] = TrainerSettings(trainer_type="ppo")
    with tempfile.TemporaryDirectory() as tmp:
        if env == "python":
            factory = make_factory(SimpleEnvironment, num_agents=4)
        elif env == "torch":
            import torch_env  # imported by the trainer first, as a test module or a script does

            factory = torch_env.make_env
        else:
            build = make_build(tmp, "goal")
            base_port = free_port_block(2 * n_env + 4)
            factory = create_environment_factory(
                str(build.with_suffix("")), True, True, 0, 1, 60, base_port, [], tmp
            )
        results = {}
        for attempt in ("cold", "warm"):
            started = time.perf_counter()
            if which.startswith("ours"):
                manager = SupervisedEnvManager(factory, run_options, n_env)
            else:
                manager = SubprocessEnvManager(factory, run_options, n_env)
            try:
                manager.reset({})
                results[f"{attempt}_startup_s"] = time.perf_counter() - started
                for _ in range(STEPS_BEFORE_MEMORY):
                    manager.get_steps()
                if which.startswith("ours"):
                    pids = list(manager.worker_pids.values())
                else:
                    pids = [worker.process.pid for worker in manager.env_workers]
                memory = [psutil.Process(pid).memory_full_info() for pid in pids]
                results[f"{attempt}_rss_mb"] = statistics.mean(m.rss for m in memory) / 2**20
                results[f"{attempt}_uss_mb"] = statistics.mean(m.uss for m in memory) / 2**20
                results[f"{attempt}_pss_mb"] = statistics.mean(m.pss for m in memory) / 2**20
            finally:
                manager.close()
            if env == "build":
                factory = create_environment_factory(  # fresh ports: the closed players' may linger
                    str(build.with_suffix("")), True, True, 0, 1, 60, base_port + n_env + 2, [], tmp
                )
    return results


def _bare_mlagents_envs() -> Dict[str, float]:
    """USS and PSS of a process that imported mlagents-envs and nothing else."""
    import psutil

    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import mlagents_envs.environment, sys; sys.stdout.write('up\\n'); sys.stdout.flush(); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        process.stdout.readline()
        info = psutil.Process(process.pid).memory_full_info()
        return {"rss_mb": info.rss / 2**20, "uss_mb": info.uss / 2**20, "pss_mb": info.pss / 2**20}
    finally:
        process.stdin.close()
        process.wait(timeout=10)


def measure(which: str, env: str, n_env: int) -> Dict:
    environment = dict(os.environ)
    if which == "ours portable":
        environment["MLAGENTS_PLUGIN_PORTABLE"] = "1"
    result = subprocess.run(
        [sys.executable, __file__, "--child", which, env, str(n_env)],
        capture_output=True, text=True, timeout=600, env=environment,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{which} {env} {n_env}: {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def run(quick: bool) -> List[Dict]:
    repeats = 1 if quick else 3
    workers = (4,) if quick else WORKERS
    rows = []
    bare = _bare_mlagents_envs()
    for pair, (ours, upstream) in PAIRS.items():
        for env in QUICK_ENVS if quick else ENVS:
            for n_env in workers if pair == "linux" else (1,) if quick else workers[:3]:
                runs: Dict[str, List[Dict]] = {ours: [], upstream: []}
                for _ in range(repeats):  # alternating, so all see the same machine
                    for which in runs:
                        runs[which].append(measure(which, env, n_env))
                row = {"pair": pair, "env": env, "workers": n_env, "bare_mlagents_envs": bare}
                names = {ours: "ours", upstream: "upstream"}
                for which, measured in runs.items():
                    row[names[which]] = {key: statistics.median(m[key] for m in measured) for key in measured[0]}
                print(row, flush=True)
                rows.append(row)
    return rows


def markdown(rows: List[Dict]) -> str:
    bare = rows[0]["bare_mlagents_envs"]
    out = [
        "Start-up: manager built to the first reset answered by every worker; medians of "
        "alternating runs, each in a fresh trainer process. Memory per worker after 50 steps, "
        f"MB (a bare process that imported mlagents-envs: RSS {bare['rss_mb']:.1f}, "
        f"USS {bare['uss_mb']:.1f}, PSS {bare['pss_mb']:.1f}).",
        "",
        "`linux`: ours (forkserver) against upstream (fork), each on its Linux default. `spawn`: what "
        "macOS and Windows run, ours on the portable path against upstream with spawn (their default "
        "there).",
        "",
        "| path | env | workers | start-up cold: ours / upstream (ratio) | warm: ours / upstream (ratio) | "
        "RSS ours / upstream | PSS ours / upstream | USS ours / upstream |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        ours, up = row["ours"], row["upstream"]
        out.append(
            f"| {row.get('pair', 'linux')} | {row['env']} | {row['workers']} | "
            f"{ours['cold_startup_s']:.3f} / {up['cold_startup_s']:.3f} s "
            f"({ours['cold_startup_s'] / up['cold_startup_s']:.2f}) | "
            f"{ours['warm_startup_s']:.3f} / {up['warm_startup_s']:.3f} s "
            f"({ours['warm_startup_s'] / up['warm_startup_s']:.2f}) | "
            f"{ours['warm_rss_mb']:.0f} / {up['warm_rss_mb']:.0f} | "
            f"{ours['warm_pss_mb']:.1f} / {up['warm_pss_mb']:.1f} | "
            f"{ours['warm_uss_mb']:.1f} / {up['warm_uss_mb']:.1f} |"
        )
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        print(json.dumps(_child(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
    else:
        sys.exit(__doc__)
