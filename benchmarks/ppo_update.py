"""``ppo`` against ``ppo_fast`` (docs/trainers.md): the same training, side by side, in processes
of their own, alternating, on ML-Agents' in-process SimpleEnvManager (no env manager, no worker:
the trainer's own time). Per run: the whole run, ML-Agents' ``_update_policy`` and
``process_trajectory`` timers, and the final reward, which must be the same for both (NOTE
[ The same minibatches ]).

    python benchmarks/bench.py ppo-update [--rounds 3] [--steps 20000] [--quick]
"""
import argparse
import json
import statistics
import subprocess
import sys
import textwrap
from typing import Dict, List

TRAINERS = ("ppo", "ppo_fast")
# (name, SimpleEnvironment keyword arguments, PPO hyperparameters): the shape (batch 64,
# buffer 512, 3 epochs, 16 agents as on a build) and ML-Agents' 3DBall-like large buffer.
CASES = [
    ("16 agents, batch 64 / buffer 512", {"num_agents": 16}, {"batch_size": 64, "buffer_size": 512}),
    ("16 agents, batch 1024 / buffer 10240", {"num_agents": 16}, {"batch_size": 1024, "buffer_size": 10240}),
    ("visual 3x36x36, batch 64 / buffer 512", {"num_agents": 4, "visual_shape": [3, 36, 36]},
     {"batch_size": 64, "buffer_size": 512}),
]

ONE_RUN = textwrap.dedent("""
    import json, random, sys, time
    import attr, numpy as np, torch
    from mlagents.trainers.settings import NetworkSettings
    from mlagents.trainers.simple_env_manager import SimpleEnvManager
    from mlagents_envs.side_channel.environment_parameters_channel import EnvironmentParametersChannel
    from mlagents_envs.timers import get_timer_tree, reset_timers
    from mlagents_plugin.testing import SimpleEnvironment
    from mlagents_plugin.testing.training import PPO_CONFIG, train

    trainer_type, env_kwargs, hyperparameters, steps = sys.argv[1], *map(json.loads, sys.argv[2:4]), int(sys.argv[4])
    random.seed(1); np.random.seed(1); torch.manual_seed(1)
    config = attr.evolve(
        PPO_CONFIG, trainer_type=trainer_type, max_steps=steps, summary_freq=steps // 4,
        hyperparameters=attr.evolve(PPO_CONFIG.hyperparameters, num_epoch=3, **hyperparameters),
        network_settings=NetworkSettings(num_layers=2, hidden_units=128),
    )
    channel = EnvironmentParametersChannel()
    manager = SimpleEnvManager(SimpleEnvironment(0, [channel], **env_kwargs), channel)
    reset_timers()
    started, cpu = time.perf_counter(), time.process_time()
    result = train(manager, config, seed=1)
    whole, cpu = time.perf_counter() - started, time.process_time() - cpu

    def total(node, name):
        found = node["total"] if node.get("name") == name else 0.0
        return found + sum(total(child | {"name": key}, name) for key, child in node.get("children", {}).items())

    tree = get_timer_tree() | {"name": "root"}
    print("RESULT " + json.dumps({
        "whole_s": whole, "cpu_s": cpu, "update_s": total(tree, "_update_policy"),
        "trajectory_s": total(tree, "process_trajectory"), "final_reward": result.final_rewards["Simple"],
    }), flush=True)
""")


def run_once(trainer_type: str, env_kwargs: dict, hyperparameters: dict, steps: int) -> Dict[str, float]:
    run = subprocess.run(
        [sys.executable, "-c", ONE_RUN, trainer_type, json.dumps(env_kwargs), json.dumps(hyperparameters), str(steps)],
        capture_output=True, text=True, timeout=3600,
    )
    if run.returncode != 0:
        raise RuntimeError(run.stderr[-3000:])
    line = next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))
    result: Dict[str, float] = json.loads(line[len("RESULT "):])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20000, help="agent steps per run")
    parser.add_argument("--quick", action="store_true", help="one round of the first case, 2000 steps")
    options = parser.parse_args()
    cases = CASES[:1] if options.quick else CASES
    rounds, steps = (1, 2000) if options.quick else (options.rounds, options.steps)
    print("| case | whole run s: ppo / ppo_fast | `_update_policy` s: ppo / ppo_fast | update ratio | "
          "`process_trajectory` s | trainer CPU s: ppo / ppo_fast | final reward: ppo / ppo_fast |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, env_kwargs, hyperparameters in cases:
        runs: Dict[str, List[Dict[str, float]]] = {t: [] for t in TRAINERS}
        for _ in range(rounds):
            for trainer_type in TRAINERS:  # alternating: the machine's drift hits both alike
                runs[trainer_type].append(run_once(trainer_type, env_kwargs, hyperparameters, steps))
        slow = {key: statistics.median(r[key] for r in runs["ppo"]) for key in runs["ppo"][0]}
        fast = {key: statistics.median(r[key] for r in runs["ppo_fast"]) for key in runs["ppo_fast"][0]}
        print(
            f"| {name} | {slow['whole_s']:.1f} / {fast['whole_s']:.1f} "
            f"| {slow['update_s']:.2f} / {fast['update_s']:.2f} | {slow['update_s'] / fast['update_s']:.2f}x "
            f"| {slow['trajectory_s']:.2f} / {fast['trajectory_s']:.2f} | {slow['cpu_s']:.1f} / {fast['cpu_s']:.1f} "
            f"| {slow['final_reward']:.4f} / {fast['final_reward']:.4f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
