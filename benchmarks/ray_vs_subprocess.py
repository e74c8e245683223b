"""The Ray backend against the subprocess backend on this one machine, side by side.

Ray starts once for the section: a loopback one-node Ray (ray_local, NOTE [ Ray on loopback ]),
or the cluster at ``--ray-address``. Both managers step the same envs in alternating slices.
"""
from typing import Dict, List, Optional

from harness import interleave
from mlagents.trainers.settings import RunOptions
from steppers import ManagerStepper
from throughput import Scenario

from mlagents_plugin.settings import EnvManagerSettings
from mlagents_plugin.supervisor import SupervisedEnvManager
from mlagents_plugin.testing import SimpleEnvironment, make_factory

SCENARIOS = [
    Scenario("cheap, 1 agent", dict(num_agents=1), (1, 4)),
    Scenario("1 ms CPU + 2 ms sleep", dict(step_cpu_s=0.001, step_sleep_s=0.002), (1, 4)),
    Scenario("20 ms sleep", dict(step_sleep_s=0.02), (4, 8)),
]
QUICK = [Scenario("cheap, 1 agent", dict(num_agents=1), (2,))]
ADDRESS: Optional[str] = None  # set by bench.py's --ray-address


def run(quick: bool) -> List[Dict]:
    import ray

    from mlagents_plugin import ray_local
    from mlagents_plugin.ray_backend import RayEnvManager

    own = ray_local.start(num_cpus=16) if ADDRESS is None else None
    if own is None:
        ray.init(address=ADDRESS, logging_level="WARNING")
    rows = []
    slices, slice_s, warmup_s = (1, 0.5, 0.5) if quick else (3, 3.0, 1.0)
    ray_settings = EnvManagerSettings(backend="ray", ray={"num_cpus_per_worker": 1})
    try:
        for scenario in QUICK if quick else SCENARIOS:
            for n_env in scenario.workers:
                factory = make_factory(SimpleEnvironment, **scenario.env)
                steppers = [
                    ManagerStepper("subprocess", SupervisedEnvManager(factory, RunOptions(), n_env)),
                    ManagerStepper("ray", RayEnvManager(factory, RunOptions(), n_env, ray_settings)),
                ]
                try:
                    results = interleave(steppers, slices, slice_s, warmup_s)
                finally:
                    for stepper in steppers:
                        stepper.close()
                rows.append({"scenario": scenario.name, "workers": n_env, "results": results})
                r = results
                print(f"{scenario.name}, {n_env} worker(s): subprocess {r['subprocess']['env_steps_per_s']:.0f}/s, "
                      f"ray {r['ray']['env_steps_per_s']:.0f}/s", flush=True)
    finally:
        if own is not None:
            ray_local.stop(own)
        else:
            ray.shutdown()
    return rows


def markdown(rows: List[Dict]) -> str:
    out = [
        "| Scenario | Workers | subprocess env steps/s | Ray env steps/s | Ray / subprocess "
        "| trainer CPU µs per env step: subprocess / Ray | get_steps p99 ms: subprocess / Ray |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        sub, ray_ = row["results"]["subprocess"], row["results"]["ray"]
        out.append(
            f"| {row['scenario']} | {row['workers']} | {sub['env_steps_per_s']:.0f} | {ray_['env_steps_per_s']:.0f} "
            f"| {ray_['env_steps_per_s'] / sub['env_steps_per_s']:.2f} "
            f"| {sub['trainer_cpu_us_per_env_step']:.0f} / {ray_['trainer_cpu_us_per_env_step']:.0f} "
            f"| {sub['get_steps_p99_ms']:.2f} / {ray_['get_steps_p99_ms']:.2f} |"
        )
    return "\n".join(out)
