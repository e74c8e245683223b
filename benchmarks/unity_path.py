"""The Unity path: env steps/s through UnityEnvironment on the headless player, with the trainer
decoding in pure Python (what mlagents-envs 1.1.0 gets on Python 3.11 without this package) or
in C: protobuf 6's upb backend served by mlagents_plugin.fast_protobuf (Python 3.11), or
protobuf 3.20's C++ backend (Python 3.10, where mlagents-envs has it).

Each measurement runs in a process of its own, since the backend is chosen when protobuf is
first imported; slow and fast slices alternate. The players always use the fast backend: a
Unity build is C#, and its speed must not differ between the two sides of the comparison.
"""
import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, List

from mlagents_plugin.player.build import make_build

CHILD = r"""
import json, os, sys, time, socket
from google.protobuf.internal import api_implementation  # picks the backend, from the environment
os.environ.pop("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", None)  # the player keeps the fast one
from mlagents_envs.environment import UnityEnvironment
from mlagents_envs.side_channel.stats_side_channel import StatsSideChannel
from mlagents_plugin import fast_protobuf
build, agents, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
with socket.socket() as s:
    s.bind(("localhost", 0)); port = s.getsockname()[1]
# The player sends stats, as Unity builds do; a trainer registers the stats channel for them
# (an unregistered channel makes mlagents-envs log a warning per message, through a new handler
# each time: a cost that grows with every step and is not the protocol's).
env = UnityEnvironment(build, base_port=port, no_graphics=True, additional_args=["--num-agents", str(agents)],
                       side_channels=[StatsSideChannel()])
try:
    env.reset()
    (name, spec), = env.behavior_specs.items()
    def run(duration):
        steps, cpu0, wall0 = 0, time.process_time(), time.perf_counter()
        while time.perf_counter() - wall0 < duration:
            decision, _ = env.get_steps(name)
            env.set_actions(name, spec.action_spec.random_action(len(decision)))
            env.step()
            steps += 1
        return steps, time.process_time() - cpu0, time.perf_counter() - wall0
    run(0.5)
    steps, cpu, wall = run(seconds)
    print(json.dumps({"backend": fast_protobuf.backend(), "steps": steps, "cpu_s": cpu, "wall_s": wall}))
finally:
    env.close()
"""


def _measure(build: str, agents: int, backend: str, seconds: float) -> Dict:
    """``backend``: "python", or "c" for whichever C backend this environment has."""
    env = dict(os.environ)
    if backend == "python":
        env["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"
    out = subprocess.run(
        [sys.executable, "-c", CHILD, build, str(agents), str(seconds)],
        env=env, capture_output=True, text=True, timeout=120 + seconds,
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert (result["backend"] == "python") == (backend == "python"), result
    return result


def run(quick: bool) -> List[Dict]:
    slices, seconds = (1, 1.0) if quick else (3, 4.0)
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        build = str(make_build(directory, "goal").with_suffix(""))
        for agents in (2, 32):
            totals = {backend: {"steps": 0, "cpu_s": 0.0, "wall_s": 0.0} for backend in ("python", "c")}
            for _ in range(slices):
                for backend in totals:
                    result = _measure(build, agents, backend, seconds)
                    for key in ("steps", "cpu_s", "wall_s"):
                        totals[backend][key] += result[key]
            row = {"agents": agents}
            for backend, t in totals.items():
                row[backend] = {
                    "env_steps_per_s": t["steps"] / t["wall_s"],
                    "trainer_cpu_us_per_step": 1e6 * t["cpu_s"] / t["steps"],
                }
            rows.append(row)
            print(f"{agents} agents: pure Python {row['python']['env_steps_per_s']:.0f}/s, "
                  f"C {row['c']['env_steps_per_s']:.0f}/s", flush=True)
    return rows


def markdown(rows: List[Dict]) -> str:
    out = [
        "| Agents | env steps/s, pure-Python protobuf | env steps/s, C (upb via fast_protobuf, or 3.20's C++) "
        "| speed-up | trainer CPU µs per step: pure Python / C |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        slow, fast = row["python"], row["c"]
        out.append(
            f"| {row['agents']} | {slow['env_steps_per_s']:.0f} | {fast['env_steps_per_s']:.0f} "
            f"| {fast['env_steps_per_s'] / slow['env_steps_per_s']:.1f}x "
            f"| {slow['trainer_cpu_us_per_step']:.0f} / {fast['trainer_cpu_us_per_step']:.0f} |"
        )
    return "\n".join(out)
