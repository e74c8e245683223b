"""End-to-end training speed: upstream's SubprocessEnvManager, ours without batched inference,
ours with it, side by side, alternating, the same YAML and seed.

(a) stock ``mlagents-learn`` on the project's player builds (goal scene), 4 and 8 builds, 1 and 16
    agents per build; upstream's manager through ``env_manager: {enabled: false}``.
(b) Python envs (SimpleEnvironment, 1 or 8 agents each), 8 and 16 workers: stock mlagents-learn cannot
    give upstream's manager a Python env, so each run drives the same trainer loop
    (``mlagents_plugin.testing.training.train``) with a manager built on the same factory: the
    shape of upstream's test harness (``check_environment_trains``). The env's module imports
    torch (torch_env.py), as upstream's test envs do. Ours starts its workers from a fresh fork
    server, or from a fork of the trainer with ``OMP_NUM_THREADS=1`` in the environment (NOTE
    [ A fork server forked from the trainer ]).

Per run: agent steps/s and trainer CPU (the trainer process alone, not its workers) per agent
step, both measured between the first and the last summary (start-up and close excluded);
policy forward passes (``TorchPolicy.evaluate``) per env step; the final mean reward. For (b)
also the whole run (the manager's construction to the end of its close) and the time to the
first summary, which include start-up.
"""
import argparse
import functools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Tuple

import psutil
import yaml

from mlagents_plugin.testing.ports import free_port_block

MLAGENTS_LEARN = str(Path(sys.executable).parent / "mlagents-learn")
MANAGERS = ("upstream", "ours unbatched", "ours batched")
ENV_MANAGER_SECTION = {
    "upstream": {"enabled": False},
    "ours unbatched": {"batch_inference": False},
    "ours batched": {},
}
SUMMARY = re.compile(r"\] (\S+)\. Step: (\d+)\. Time Elapsed: [\d.]+ s\. Mean Reward: (-?\d+\.\d+)")
PLAYER_CASES = [(4, 1), (4, 16), (8, 1), (8, 16)]  # (builds, agents per build)
PYTHON_CASES = [(8, 1), (16, 1), (8, 8), (16, 8)]  # (workers, agents per worker)


class Summaries:
    """Each summary line of a training run, with when it came and the trainer's CPU then."""

    def __init__(self, process: "psutil.Process"):
        self.process = process
        self.rows: List[Tuple[float, float, int, float]] = []  # (time, trainer cpu s, step, reward)

    def add(self, step: int, reward: float) -> None:
        cpu = self.process.cpu_times()
        self.rows.append((time.perf_counter(), cpu.user + cpu.system, step, reward))

    def figures(self, agents_per_env: int, evaluate_calls: int) -> Dict[str, float]:
        if len(self.rows) < 2:
            raise RuntimeError(f"too few summaries to measure: {self.rows}")
        (t0, cpu0, step0, _), (t1, cpu1, step1, reward) = self.rows[0], self.rows[-1]
        return {
            "agent_steps_per_s": (step1 - step0) / (t1 - t0),
            "trainer_cpu_us_per_agent_step": 1e6 * (cpu1 - cpu0) / (step1 - step0),
            "evaluate_per_env_step": evaluate_calls / (step1 / agents_per_env),
            "final_reward": reward,
        }


# ------------------------------------------------------------------- (a) mlagents-learn


def _timer_count(node: Dict, name: str) -> int:
    found = node.get("count", 0) if node.get("name") == name else 0
    return found + sum(_timer_count(dict(child, name=key), name) for key, child in node.get("children", {}).items())


def player_run(manager: str, builds: int, agents: int, max_steps: int, work: Path) -> Dict[str, float]:
    from mlagents_plugin.examples import config_file

    config = yaml.safe_load(config_file("goal_player.yaml").read_text())
    config["behaviors"]["Goal"].update(max_steps=max_steps, summary_freq=max_steps // 8)
    config["env_manager"] = ENV_MANAGER_SECTION[manager]
    run_id = f"{manager.replace(' ', '-')}-{builds}x{agents}-{time.monotonic_ns()}"
    config_path = work / f"{run_id}.yaml"
    config_path.write_text(yaml.safe_dump(config))
    command = [
        MLAGENTS_LEARN, str(config_path), f"--env={work / 'builds' / 'goal'}", f"--num-envs={builds}",
        f"--run-id={run_id}", "--seed=1", f"--base-port={free_port_block(builds + 1)}", "--no-graphics",
        "--env-args", "--num-agents", str(agents),
    ]
    trainer = subprocess.Popen(  # its own group: a failed run is killed with its workers and players
        command, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    summaries = Summaries(psutil.Process(trainer.pid))
    output: List[str] = []

    def read() -> None:
        assert trainer.stdout is not None
        for line in trainer.stdout:
            output.append(line)
            match = SUMMARY.search(line)
            if match:
                summaries.add(int(match.group(2)), float(match.group(3)))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        trainer.wait(timeout=1200)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
        reader.join(timeout=10)
    if trainer.returncode != 0:
        raise RuntimeError(f"mlagents-learn ({manager}) exited {trainer.returncode}:\n{''.join(output[-40:])}")
    timers = json.loads((work / "results" / run_id / "run_logs" / "timers.json").read_text())
    return summaries.figures(agents, _timer_count(timers, "TorchPolicy.evaluate"))


def python_run(manager: str, workers: int, agents: int, max_steps: int) -> Dict[str, float]:
    result = subprocess.run(
        [sys.executable, __file__, "--child", manager, str(workers), str(agents), str(max_steps)],
        capture_output=True, text=True, timeout=1200,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{manager} with {workers} workers: {result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _child(manager: str, workers: int, agents: int, max_steps: int) -> Dict[str, float]:
    """One training run in this fresh process: the trainer loop of mlagents-learn."""
    import attr
    from mlagents.trainers.policy.torch_policy import TorchPolicy
    from mlagents.trainers.ppo.optimizer_torch import PPOSettings
    from mlagents.trainers.settings import RunOptions, ScheduleType
    from mlagents.trainers.subprocess_env_manager import SubprocessEnvManager

    from mlagents_plugin import EnvManagerSettings, SupervisedEnvManager
    from mlagents_plugin.testing import training

    calls = [0]
    evaluate = TorchPolicy.evaluate

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return evaluate(self, *args, **kwargs)

    TorchPolicy.evaluate = counted
    summaries = Summaries(psutil.Process())
    write_stats = training.StatsRecorder.write_stats

    def recorded(self, category, values, step):  # type: ignore[no-untyped-def]
        write_stats(self, category, values, step)
        if training.REWARD_KEY in values and values[training.REWARD_KEY].num > 0:
            summaries.add(step, float(values[training.REWARD_KEY].aggregated_value))

    training.StatsRecorder.write_stats = recorded
    import torch_env  # the trainer imported the env's module, as a test module is

    factory = functools.partial(torch_env.make_env, num_agents=agents)
    start = time.perf_counter()
    if manager == "upstream":
        env_manager = SubprocessEnvManager(factory, RunOptions(), workers)
    else:
        settings = EnvManagerSettings(**ENV_MANAGER_SECTION[manager])
        env_manager = SupervisedEnvManager(factory, RunOptions(), workers, settings)
    try:
        config = attr.evolve(
            training.PPO_CONFIG,
            hyperparameters=PPOSettings(  # ML-Agents' usual sizes: the update is not the whole cost
                learning_rate=3.0e-3, learning_rate_schedule=ScheduleType.CONSTANT, batch_size=128, buffer_size=2048
            ),
            summary_freq=max_steps // 8,
            max_steps=max_steps,
        )
        training.train(env_manager, config)
    finally:
        env_manager.close()
    return {
        **summaries.figures(agents, calls[0]),
        "whole_run_s": time.perf_counter() - start,
        "first_summary_s": summaries.rows[0][0] - start,
    }


# ------------------------------------------------------------------------- the section


def run(quick: bool, players: bool = True) -> List[Dict]:
    rounds = 1 if quick else 2
    player_cases = [] if not players else PLAYER_CASES[:1] if quick else PLAYER_CASES
    python_cases = PYTHON_CASES[:1] if quick else PYTHON_CASES
    rows = []
    with tempfile.TemporaryDirectory(prefix="mlap-training-") as tmp:
        work = Path(tmp)
        from mlagents_plugin.player.build import make_build

        if player_cases:
            make_build(str(work / "builds"), "goal")
        for builds, agents in player_cases:
            max_steps = (2000 if quick else 8000) * (2 if agents > 1 else 1)
            rows.append(_alternate(
                f"player, {builds} builds x {agents} agents", rounds,
                lambda m, b=builds, a=agents, s=max_steps: player_run(m, b, a, s, work),
            ))
        for workers, agents in python_cases:
            max_steps = 4000 if quick else 16000
            rows.append(_alternate(
                f"Python env, {workers} workers x {agents} agents", rounds,
                lambda m, w=workers, a=agents, s=max_steps: python_run(m, w, a, s),
            ))
    return rows


def _alternate(case: str, rounds: int, measure) -> Dict:  # type: ignore[no-untyped-def]
    runs: Dict[str, List[Dict[str, float]]] = {m: [] for m in MANAGERS}
    for _ in range(rounds):
        for manager in MANAGERS:
            runs[manager].append(measure(manager))
    results = {m: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for m, rs in runs.items()}
    row = {"case": case, "rounds": rounds, "results": results}
    print(_line(row), flush=True)
    return row


def _line(row: Dict) -> str:
    parts = [f"{row['case']}:"]
    for name, r in row["results"].items():
        parts.append(
            f"{name} {r['agent_steps_per_s']:.0f}/s {r['evaluate_per_env_step']:.2f}ev r={r['final_reward']:.2f}"
        )
    return " | ".join(parts)


def markdown(rows: List[Dict]) -> str:
    out = [
        "| Case | agent steps/s: upstream / unbatched / batched | batched / upstream "
        "| trainer CPU µs per agent step: upstream / unbatched / batched "
        "| evaluate per env step: upstream / unbatched / batched | final reward: upstream / unbatched / batched |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        r = [row["results"][m] for m in MANAGERS]

        def cells(key: str, fmt: str, r=r) -> str:  # type: ignore[no-untyped-def]
            return " / ".join(format(x[key], fmt) for x in r)

        out.append(
            f"| {row['case']} | {cells('agent_steps_per_s', '.0f')} "
            f"| {r[2]['agent_steps_per_s'] / r[0]['agent_steps_per_s']:.2f} "
            f"| {cells('trainer_cpu_us_per_agent_step', '.0f')} | {cells('evaluate_per_env_step', '.2f')} "
            f"| {cells('final_reward', '.2f')} |"
        )
    whole = [row for row in rows if "whole_run_s" in row["results"]["upstream"]]
    if whole:
        out += [
            "",
            "| Case | whole run s: upstream / unbatched / batched | upstream s / batched s "
            "| first summary s: upstream / unbatched / batched |",
            "| --- | --- | --- | --- |",
        ]
        for row in whole:
            r = [row["results"][m] for m in MANAGERS]
            out.append(
                f"| {row['case']} | {' / '.join(format(x['whole_run_s'], '.1f') for x in r)} "
                f"| {r[0]['whole_run_s'] / r[2]['whole_run_s']:.2f} "
                f"| {' / '.join(format(x['first_summary_s'], '.1f') for x in r)} |"
            )
    return "\n".join(out)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))))
    else:
        parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("--quick", action="store_true", help="one case of each kind, one round")
        parser.add_argument("--python-only", action="store_true", help="the Python-env cases alone (about 15 min)")
        args = parser.parse_args()
        print(markdown(run(quick=args.quick, players=not args.python_only)))
