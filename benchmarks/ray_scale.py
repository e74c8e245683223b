"""The Ray backend at scale, on a simulated cluster: many envs, k envs per actor.

    .venv/bin/python benchmarks/ray_scale.py [--envs 64] [--k 1 4 8 16] [--seconds 15]
        [--builds] [--out FILE]

A two-node ``ray.cluster_utils.Cluster`` on loopback (NOTE [ Ray on loopback ]), each node half
the envs' logical CPUs. Every env's step sleeps 50 ms and spends no CPU, so the ideal is
envs x 20 env steps/s whatever the transport. For each k (``envs_per_worker``), a RayEnvManager
steps them for ``--seconds``, with empty actions and no policy; the subprocess backend steps the
same envs for the trainer-CPU comparison. Measured: aggregate env steps/s against the ideal,
the trainer's CPU per env step (this process: its own threads and Ray's), start-up (manager
construction to the first reset answered) and close. ``--builds`` does the same with the
project's player builds (``--frame-time-s 0.05``: a Unity frame of 50 ms without its CPU).

Network safety is the Ray tests' (issue 6): the loopback cluster and ray_local's environment,
and netguard on the PYTHONPATH of every Ray process where it exists (NETGUARD_DIR, by default
../shared/netguard beside the checkout); a non-empty netguard log fails the run.
"""
import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from mlagents.trainers.settings import RunOptions

from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.local.supervisor import SupervisedEnvManager
from mlagents_plugin.ray import local as ray_local
from mlagents_plugin.testing import SimpleEnvironment, make_factory
from mlagents_plugin.testing.ports import free_port_block

STEP_S = 0.05
NETGUARD_DIR = Path(os.environ.get("NETGUARD_DIR", Path(__file__).resolve().parents[2] / "shared" / "netguard"))


def guard_network(log: Path) -> None:
    """Load netguard here and in every process started from here (the Ray tests' way)."""
    if not (NETGUARD_DIR / "sitecustomize.py").exists():
        print(f"netguard not found at {NETGUARD_DIR}: running without it", file=sys.stderr)
        return
    os.environ["NETGUARD_LOG"] = str(log)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(NETGUARD_DIR), os.environ.get("PYTHONPATH")]))
    spec = importlib.util.spec_from_file_location("netguard_sitecustomize", NETGUARD_DIR / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


def measure(make: Callable[[], Any], n_env: int, seconds: float) -> Dict[str, Any]:
    started = time.perf_counter()
    manager = make()
    try:
        manager.reset({})
        startup_s = time.perf_counter() - started
        warm_until = time.perf_counter() + 2.0
        while time.perf_counter() < warm_until:
            manager.get_steps()
        steps, cpu0, t0 = 0, time.process_time(), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            steps += len(manager.get_steps())
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        nodes = {p.node_id for p in manager.placements.values()}
        actors = {p.actor_pid for p in manager.placements.values()}
    finally:
        closing = time.perf_counter()
        manager.close()
        close_s = time.perf_counter() - closing
    return {
        "env_steps_per_s": steps / wall,
        "of_ideal": steps / wall / (n_env / STEP_S),
        "trainer_cpu_us_per_env_step": 1e6 * cpu / max(steps, 1),
        "startup_s": startup_s,
        "close_s": close_s,
        "nodes": len(nodes),
        "actors": len(actors - {None}),
    }


def build_factory(tmp: str, n_env: int) -> Callable[..., Any]:
    """Player builds on fresh ports, each step sleeping STEP_S (``--frame-time-s``)."""
    from mlagents.trainers.learn import create_environment_factory

    from mlagents_plugin.player.build import make_build

    build = make_build(tmp, "goal")
    args = ["--frame-time-s", str(STEP_S)]
    return create_environment_factory(
        str(build.with_suffix("")), True, True, 0, 1, 60, free_port_block(n_env + 2), args, tmp
    )


def run(n_env: int, ks: List[int], seconds: float, builds: bool) -> List[Dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        def factory() -> Callable[..., Any]:
            if builds:
                return build_factory(tmp, n_env)
            return make_factory(SimpleEnvironment, step_sleep_s=STEP_S)

        def subprocess_manager() -> Any:
            return SupervisedEnvManager(factory(), RunOptions(), n_env, EnvManagerSettings())

        def ray_manager(k: int) -> Callable[[], Any]:
            from mlagents_plugin.ray.manager import RayEnvManager

            settings = EnvManagerSettings(backend="ray", envs_per_worker=k, ray={"num_cpus_per_worker": 1})
            return lambda: RayEnvManager(factory(), RunOptions(), n_env, settings)

        rows.append({"backend": "subprocess", "k": None, **measure(subprocess_manager, n_env, seconds)})
        print(rows[-1], flush=True)
        for k in ks:
            rows.append({"backend": "ray", "k": k, **measure(ray_manager(k), n_env, seconds)})
            print(rows[-1], flush=True)
    return rows


def markdown(rows: List[Dict[str, Any]], n_env: int, what: str) -> str:
    sub = next(r for r in rows if r["backend"] == "subprocess")
    out = [
        f"{n_env} {what}, each step sleeping {STEP_S * 1000:.0f} ms (ideal {n_env / STEP_S:.0f} env steps/s):",
        "",
        "| Backend | envs_per_worker | Actors (nodes) | Env steps/s | Of ideal | Trainer CPU µs per env step "
        "(× subprocess) | Start-up s | Close s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        cpu = r["trainer_cpu_us_per_env_step"]
        actors = f"{r['actors']} ({r['nodes']})" if r["backend"] == "ray" else "—"
        out.append(
            f"| {r['backend']} | {r['k'] or '—'} | {actors} | {r['env_steps_per_s']:.0f} | {r['of_ideal']:.2f} "
            f"| {cpu:.0f} ({cpu / sub['trainer_cpu_us_per_env_step']:.1f}×) | {r['startup_s']:.1f} "
            f"| {r['close_s']:.1f} |"
        )
    return "\n".join(out)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--k", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--builds", action="store_true", help="player builds instead of Python envs")
    parser.add_argument("--out", help="append the Markdown table to this file")
    args = parser.parse_args(argv)
    netguard_log = Path(tempfile.mkdtemp(prefix="netguard-")) / "netguard.log"
    guard_network(netguard_log)
    half = max(1, args.envs // 2)
    with ray_local.loopback_cluster(num_cpus=half) as cluster:
        cluster.add_node(node_ip_address=ray_local.LOOPBACK, num_cpus=half)
        cluster.wait_for_nodes()
        rows = run(args.envs, args.k, args.seconds, args.builds)
    table = markdown(rows, args.envs, "player builds" if args.builds else "Python envs")
    print(table)
    if args.out:
        with open(args.out, "a") as f:
            f.write(table + "\n\n")
    blocked = netguard_log.read_text() if netguard_log.exists() else ""
    if blocked:
        sys.exit(f"netguard blocked non-loopback connects:\n{blocked[:3000]}")


if __name__ == "__main__":
    main()
