"""The Ray backend against the subprocess backend on this one machine, side by side.

Ray starts once for the section: a loopback one-node Ray (ray_local, NOTE [ Ray on loopback ]),
or the cluster at ``--ray-address``. Both managers step the same envs in alternating slices.
"""
from typing import Callable, Dict, List, Optional

from harness import Scenario, side_by_side
from mlagents.trainers.settings import RunOptions
from steppers import Factory, ManagerStepper, Stepper

from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.local.supervisor import SupervisedEnvManager

SCENARIOS = [
    Scenario("cheap, 1 agent", dict(num_agents=1), (1, 4)),
    Scenario("1 ms CPU + 2 ms sleep", dict(step_cpu_s=0.001, step_sleep_s=0.002), (1, 4)),
    Scenario("20 ms sleep", dict(step_sleep_s=0.02), (4, 8)),
]
QUICK = [Scenario("cheap, 1 agent", dict(num_agents=1), (2,))]
ADDRESS: Optional[str] = None  # set by bench.py's --ray-address
RAY_SETTINGS = EnvManagerSettings(backend="ray", ray={"num_cpus_per_worker": 1})


def _makers(factory: Factory, n_env: int) -> List[Callable[[], Stepper]]:
    from mlagents_plugin.ray.manager import RayEnvManager

    return [
        lambda: ManagerStepper("subprocess", SupervisedEnvManager(factory, RunOptions(), n_env)),
        lambda: ManagerStepper("ray", RayEnvManager(factory, RunOptions(), n_env, RAY_SETTINGS)),
    ]


def _line(row: Dict) -> str:
    r = row["results"]
    return (f"{row['scenario']}, {row['workers']} worker(s): subprocess {r['subprocess']['env_steps_per_s']:.0f}/s, "
            f"ray {r['ray']['env_steps_per_s']:.0f}/s")


def run(quick: bool) -> List[Dict]:
    from mlagents_plugin.ray import local as ray_local

    # one Ray for the whole section, which every manager shares (NOTE [ Sharing Ray in one process ])
    leave_ray = ray_local.connect(ADDRESS, num_cpus=16, resources={})
    try:
        return side_by_side(
            QUICK if quick else SCENARIOS, _makers, (1, 0.5, 0.5) if quick else (3, 3.0, 1.0), _line
        )
    finally:
        leave_ray()


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
