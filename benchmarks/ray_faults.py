"""What faults cost on the Ray backend: a killed actor, a hung worker, a lost node, a close.

    .venv/bin/python benchmarks/ray_faults.py [--repeats N]

Starts its own two-node Ray ``Cluster`` on loopback (NOTE [ Ray on loopback ]; health checks
every 0.5 s, as in the tests), so it is not part of ``make bench``'s sections. Prints Markdown.
"""
import argparse
import logging
import os
import signal
import statistics
import time
from typing import Dict, List, Optional

from harness import FirstLog
from mlagents.trainers.settings import RunOptions

from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.ray import local as ray_local
from mlagents_plugin.ray.manager import RayEnvManager
from mlagents_plugin.testing import HangingEnvironment, SimpleEnvironment, make_factory

SETTINGS = dict(backend="ray", restart_backoff_s=0.0, ray={"num_cpus_per_worker": 1})


def _until_worker_steps(manager, worker_ids, since: float, limit_s: float = 120) -> float:
    """Step until every worker in ``worker_ids`` returned a step after a restart; return when."""
    seen = set()
    while time.perf_counter() - since < limit_s:
        if manager.restart_counts:
            seen |= {s.worker_id for s in manager.get_steps()}
            if seen >= set(worker_ids):
                return time.perf_counter()
        else:
            manager.get_steps()
    raise RuntimeError(f"workers {worker_ids} did not step again within {limit_s} s")


def _watch(logger: str, text: str) -> FirstLog:
    handler = FirstLog(text)
    logging.getLogger(logger).addHandler(handler)
    return handler


def actor_killed() -> Dict[str, float]:
    manager = RayEnvManager(
        make_factory(SimpleEnvironment, step_sleep_s=0.001), RunOptions(), 4, EnvManagerSettings(**SETTINGS)
    )
    restart = _watch("mlagents_plugin.core.supervision", "Restarting env worker")
    try:
        manager.reset({})
        for _ in range(50):
            manager.get_steps()
        killed = time.perf_counter()
        os.kill(manager.placements[3].actor_pid, signal.SIGKILL)
        back = _until_worker_steps(manager, [3], killed)
        return {"noticed_ms": 1000 * (restart.at - killed), "first_step_ms": 1000 * (back - killed)}
    finally:
        logging.getLogger("mlagents_plugin.core.supervision").removeHandler(restart)
        manager.close()


def worker_hung() -> Dict[str, float]:
    factory = make_factory(HangingEnvironment, after_steps=30, only_worker=1)
    manager = RayEnvManager(factory, RunOptions(), 2, EnvManagerSettings(step_timeout_s=2.0, **SETTINGS))
    zombie = _watch("mlagents_plugin.ray.backend", "Zombie worker report")
    try:
        manager.reset({})
        started = time.perf_counter()
        back = _until_worker_steps(manager, [1], started)
        return {"timeout_to_first_step_ms": 1000 * (back - zombie.at)}
    finally:
        logging.getLogger("mlagents_plugin.ray.backend").removeHandler(zombie)
        manager.close()


def node_lost(cluster) -> Dict[str, float]:
    node = cluster.add_node(node_ip_address="127.0.0.1", num_cpus=8)
    manager = RayEnvManager(make_factory(SimpleEnvironment), RunOptions(), 2, EnvManagerSettings(**SETTINGS))
    restart = _watch("mlagents_plugin.core.supervision", "Restarting env worker")
    try:
        manager.reset({})
        for _ in range(50):
            manager.get_steps()
        lost = [w for w, p in manager.placements.items() if p.node_id == node.node_id]
        removed = time.perf_counter()
        cluster.remove_node(node)
        back = _until_worker_steps(manager, lost, removed)
        return {"noticed_ms": 1000 * (restart.at - removed), "first_step_ms": 1000 * (back - removed)}
    finally:
        logging.getLogger("mlagents_plugin.core.supervision").removeHandler(restart)
        manager.close()


def close_8() -> Dict[str, float]:
    started = time.perf_counter()
    manager = RayEnvManager(make_factory(SimpleEnvironment), RunOptions(), 8, EnvManagerSettings(**SETTINGS))
    manager.reset({})
    ready = time.perf_counter()
    closing = time.perf_counter()
    manager.close()
    return {"startup_s": ready - started, "close_s": time.perf_counter() - closing}


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    with ray_local.loopback_cluster(num_cpus=16) as cluster:
        runs = {
            "actor SIGKILLed (1 of 4 workers)": [actor_killed() for _ in range(args.repeats)],
            "worker hung (step_timeout_s=2)": [worker_hung() for _ in range(args.repeats)],
            "node removed (1 of 2 workers on it)": [node_lost(cluster) for _ in range(args.repeats)],
            "8 workers: start-up and close()": [close_8() for _ in range(args.repeats)],
        }
    print("| Fault | Measured (median; all runs) |\n| --- | --- |")
    for what, results in runs.items():
        cells = []
        for key in results[0]:
            values = [r[key] for r in results]
            cells.append(f"{key} {statistics.median(values):.0f} ({', '.join(f'{v:.0f}' for v in values)})"
                         if key.endswith("ms") else
                         f"{key} {statistics.median(values):.2f} ({', '.join(f'{v:.2f}' for v in values)})")
        print(f"| {what} | {'; '.join(cells)} |")


if __name__ == "__main__":
    main()
