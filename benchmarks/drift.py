"""Long runs do not drift: the trainer's memory and open files over many steps."""
import time
from typing import Dict, List

import psutil
from mlagents.trainers.settings import RunOptions

from mlagents_plugin.local.supervisor import SupervisedEnvManager
from mlagents_plugin.testing import SimpleEnvironment, make_factory


def run(quick: bool) -> List[Dict]:
    total, every = (5_000, 1_000) if quick else (100_000, 10_000)
    me = psutil.Process()
    manager = SupervisedEnvManager(make_factory(SimpleEnvironment), RunOptions(), 4)
    samples = []
    try:
        manager.reset({})
        steps, started = 0, time.perf_counter()
        while steps < total:
            steps += len(manager.get_steps())
            if steps >= every * (len(samples) + 1) or steps >= total:
                samples.append({"steps": steps, "rss_mb": me.memory_info().rss / 2**20, "fds": me.num_fds(),
                                "seconds": time.perf_counter() - started})
    finally:
        manager.close()
    print(f"{samples[0]} ... {samples[-1]}", flush=True)
    return samples


def markdown(samples: List[Dict]) -> str:
    first, last = samples[0], samples[-1]
    rss = [s["rss_mb"] for s in samples]
    fds = {s["fds"] for s in samples}
    every = samples[1]["steps"] - first["steps"] if len(samples) > 1 else 0
    return (
        f"4 workers, {last['steps']} env steps in {last['seconds']:.0f} s: trainer RSS {first['rss_mb']:.1f} MB "
        f"after {first['steps']} steps, {last['rss_mb']:.1f} MB at the end (min {min(rss):.1f}, max {max(rss):.1f}); "
        f"open file descriptors: {', '.join(map(str, sorted(fds)))} (sampled every {every} steps)."
    )
