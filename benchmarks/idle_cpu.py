"""How much CPU the trainer burns while its env workers are busy.

Each manager steps envs that sleep ``--sleep-ms`` per step; we measure the trainer process's
CPU time over wall time while it loops on ``get_steps()``. Managers run in alternating slices,
side by side in one run, so a noisy machine affects both alike.

    python benchmarks/idle_cpu.py [--sleep-ms 20] [--workers 4] [--slices 6] [--slice-s 2]
"""
import argparse
import json
import time
from typing import Callable, Dict, List

from mlagents.trainers.env_manager import EnvManager
from mlagents.trainers.settings import RunOptions
from mlagents.trainers.subprocess_env_manager import SubprocessEnvManager

from mlagents_plugin.supervisor import SupervisedEnvManager
from mlagents_plugin.testing import SimpleEnvironment, make_factory

MANAGERS: Dict[str, Callable[..., EnvManager]] = {
    "SupervisedEnvManager": SupervisedEnvManager,
    "upstream SubprocessEnvManager": SubprocessEnvManager,
}


def measure_slice(manager: EnvManager, seconds: float) -> Dict[str, float]:
    cpu0, wall0, steps = time.process_time(), time.perf_counter(), 0
    while time.perf_counter() - wall0 < seconds:
        steps += len(manager.get_steps())
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"cpu_s": cpu, "wall_s": wall, "steps": steps}


def main(argv: List[str] = None) -> Dict[str, Dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sleep-ms", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--slices", type=int, default=6)
    parser.add_argument("--slice-s", type=float, default=2.0)
    args = parser.parse_args(argv)
    factory = make_factory(SimpleEnvironment, step_sleep_s=args.sleep_ms / 1000)
    managers = {name: cls(factory, RunOptions(), args.workers) for name, cls in MANAGERS.items()}
    totals = {name: {"cpu_s": 0.0, "wall_s": 0.0, "steps": 0} for name in managers}
    try:
        for manager in managers.values():
            manager.reset({})  # upstream cannot take None
            measure_slice(manager, 0.5)  # warm up
        for _ in range(args.slices):
            for name, manager in managers.items():
                for key, value in measure_slice(manager, args.slice_s).items():
                    totals[name][key] += value
    finally:
        for manager in managers.values():
            manager.close()
    print(f"Trainer CPU while {args.workers} workers sleep {args.sleep_ms} ms per step:")
    for name, t in totals.items():
        t["cores"] = t["cpu_s"] / t["wall_s"]
        t["steps_per_s"] = t["steps"] / t["wall_s"]
        print(f"  {name:32} {t['cores']:.3f} of a core   {t['steps_per_s']:.0f} env steps/s")
    print(json.dumps(totals))
    return totals


if __name__ == "__main__":
    main()
