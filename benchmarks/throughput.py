"""Throughput and trainer CPU: ours, upstream, in-process and the bare pipe, side by side, no policy."""
import functools
from typing import Dict, List

from harness import Scenario, side_by_side
from steppers import BARE_PIPE, stepper_makers

MANAGERS = ["ours", "upstream", BARE_PIPE, "in-process"]

SCENARIOS = [
    Scenario("cheap, 1 agent", dict(num_agents=1), (1, 2, 4, 8)),
    Scenario("cheap, 32 agents", dict(num_agents=32), (1, 2, 4, 8)),
    Scenario("1 ms CPU + 2 ms sleep", dict(step_cpu_s=0.001, step_sleep_s=0.002), (1, 2, 4, 8)),
    Scenario("2 ms sleep", dict(step_sleep_s=0.002), (1, 4)),
    Scenario("20 ms sleep", dict(step_sleep_s=0.02), (4,)),
    Scenario("visual 84x84x3, 32 agents", dict(num_agents=32, visual_shape=(3, 84, 84)), (1, 2, 4)),
]
QUICK = [
    Scenario("cheap, 1 agent", dict(num_agents=1), (2,)),
    Scenario("visual 84x84x3, 32 agents", dict(num_agents=32, visual_shape=(3, 84, 84)), (2,)),
]


def run(quick: bool) -> List[Dict]:
    return side_by_side(
        QUICK if quick else SCENARIOS,
        functools.partial(stepper_makers, MANAGERS),
        (1, 0.3, 0.2) if quick else (3, 2.0, 0.5),
        _line,
    )


def _line(row: Dict) -> str:
    parts = [f"{row['scenario']}, {row['workers']} worker(s):"]
    for name, r in row["results"].items():
        parts.append(
            f"{name} {r['env_steps_per_s']:.0f}/s {r['trainer_cpu_us_per_env_step']:.0f}us {r['trainer_cores']:.2f}c"
        )
    return "  ".join(parts)


def markdown(rows: List[Dict]) -> str:
    out = [
        "| Scenario | Workers | ours env steps/s | upstream | bare pipe | in-process | ours / bare pipe "
        "| ours / upstream | trainer CPU µs per env step: ours / upstream | trainer cores: ours / upstream "
        "| get_steps p99 ms: ours / upstream / bare |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        r = row["results"]
        ours, up, bare = r["ours"], r["upstream"], r[BARE_PIPE]
        inproc = f"{r['in-process']['env_steps_per_s']:.0f}" if "in-process" in r else ""
        out.append(
            f"| {row['scenario']} | {row['workers']} | {ours['env_steps_per_s']:.0f} | {up['env_steps_per_s']:.0f} "
            f"| {bare['env_steps_per_s']:.0f} | {inproc} "
            f"| {ours['env_steps_per_s'] / bare['env_steps_per_s']:.2f} "
            f"| {ours['env_steps_per_s'] / up['env_steps_per_s']:.2f} "
            f"| {ours['trainer_cpu_us_per_env_step']:.0f} / {up['trainer_cpu_us_per_env_step']:.0f} "
            f"| {ours['trainer_cores']:.3f} / {up['trainer_cores']:.3f} "
            f"| {ours['get_steps_p99_ms']:.2f} / {up['get_steps_p99_ms']:.2f} / {bare['get_steps_p99_ms']:.2f} |"
        )
    return "\n".join(out)
