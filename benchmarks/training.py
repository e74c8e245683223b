"""End-to-end training speed, side by side, alternating, the same YAML and seed. Two sets of
configurations (trainer type + env manager):

- by default (``bench.py --only training``), the managers with ``ppo``: upstream's
  SubprocessEnvManager, ours without batched inference, ours with it (the default);
- with ``--trainers`` (issue 33's table), ``ppo`` + upstream's manager, ``ppo`` + ours (batched,
  the default) and ``ppo_fast`` + ours, in 3 rounds.

    python benchmarks/training.py [--trainers] [--python-only] [--quick]

(a) stock ``mlagents-learn`` on the project's player builds (goal scene), builds x agents per
    build; upstream's manager through ``env_manager: {enabled: false}``.
(b) Python envs (SimpleEnvironment, 1 or 8 agents each), 8 and 16 workers: stock mlagents-learn cannot
    give upstream's manager a Python env, so each run drives the same trainer loop
    (``mlagents_plugin.testing.training.train``) with a manager built on the same factory: the
    shape of upstream's test harness (``check_environment_trains``). The env's module imports
    torch (torch_env.py), as upstream's test envs do. Ours starts its workers from a fresh fork
    server, or from a fork of the trainer with ``OMP_NUM_THREADS=1`` in the environment (NOTE
    [ A fork server forked from the trainer ]).

Per run, agent steps/s and trainer CPU (the trainer process's own user + system time, not its
workers' or players') per agent step, over two windows:

- between the first and the last summary: start-up and close excluded;
- the whole run: for (a) the ``mlagents-learn`` process from its start to its exit (the
  interpreter's start, imports, builds' launch and close included; its CPU is read once it has
  exited, before it is reaped), for (b) the manager's construction to the end of its close (the
  child process's imports of torch and ML-Agents, the same for every configuration, excluded).
  Agent steps are the last summary's step (the run's ``max_steps``).

Also the time to the first summary, the final mean reward, policy forward passes
(``TorchPolicy.evaluate``) per env step, and where the trainer's wall time goes: ML-Agents'
timers (``run_logs/timers.json`` for (a), the same tree in the process for (b)) ``env_step``
(getting the envs' steps: the wait, the policy's forward passes, the agent processor),
``process_trajectory``, ``_update_policy`` and ``TorchPPOOptimizer.update`` within it, and
``TorchPolicy.evaluate``, each as a share of the timer root (for (a) from ML-Agents' import to the
end of the run, for (b) the whole run). Medians over the rounds, ratios of the medians.
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
from typing import Any, Callable, Dict, List, Optional, Tuple

import psutil
import yaml

from mlagents_plugin.testing.ports import free_port_block

MLAGENTS_LEARN = str(Path(sys.executable).parent / "mlagents-learn")
ENV_MANAGER_SECTION = {
    "upstream": {"enabled": False},
    "ours unbatched": {"batch_inference": False},
    "ours batched": {},
}
# Each mode's configurations, side by side: name -> (trainer type, env manager)
MANAGERS = {manager: ("ppo", manager) for manager in ENV_MANAGER_SECTION}
TRAINERS = {
    "ppo + upstream": ("ppo", "upstream"),
    "ppo + ours": ("ppo", "ours batched"),
    "ppo_fast + ours": ("ppo_fast", "ours batched"),
}
# (kind, envs, agents per env, max_steps of a full run; a quick run takes a quarter)
MANAGER_CASES = [
    ("player", 4, 1, 8000), ("player", 4, 16, 16000), ("player", 8, 1, 8000), ("player", 8, 16, 16000),
    ("python", 8, 1, 16000), ("python", 16, 1, 16000), ("python", 8, 8, 16000), ("python", 16, 8, 16000),
]
TRAINER_CASES = [
    ("player", 4, 16, 48000), ("player", 8, 1, 16000),
    ("python", 8, 1, 24000), ("python", 16, 1, 24000), ("python", 8, 8, 48000),
]
TIMERS = ("env_step", "process_trajectory", "_update_policy", "TorchPPOOptimizer.update", "TorchPolicy.evaluate")
SUMMARY = re.compile(r"\] (\S+)\. Step: (\d+)\. Time Elapsed: [\d.]+ s\. Mean Reward: (-?\d+\.\d+)")


class Summaries:
    """Each summary line of a training run, with when it came and the trainer's CPU then; the
    run's start is when this is made, its end when ``finish`` is called."""

    def __init__(self, process: "psutil.Process"):
        self.process = process
        self.start = self._now()
        self.end: Optional[Tuple[float, float]] = None
        self.rows: List[Tuple[float, float, int, float]] = []  # (time, trainer cpu s, step, reward)

    def _now(self) -> Tuple[float, float]:
        cpu = self.process.cpu_times()  # the process's own: its workers' are children_*
        return time.perf_counter(), cpu.user + cpu.system

    def add(self, step: int, reward: float) -> None:
        self.rows.append((*self._now(), step, reward))

    def finish(self) -> None:
        self.end = self._now()

    def figures(self, agents_per_env: int, timers: Dict[str, Any]) -> Dict[str, float]:
        if len(self.rows) < 2 or self.end is None:
            raise RuntimeError(f"too few summaries to measure: {self.rows}")
        (t0, cpu0, step0, _), (t1, cpu1, step1, reward) = self.rows[0], self.rows[-1]
        (start, start_cpu), (end, end_cpu) = self.start, self.end
        return {
            "agent_steps_per_s": (step1 - step0) / (t1 - t0),
            "trainer_cpu_us_per_agent_step": 1e6 * (cpu1 - cpu0) / (step1 - step0),
            "whole_run_s": end - start,
            "whole_agent_steps_per_s": step1 / (end - start),
            "whole_trainer_cpu_us_per_agent_step": 1e6 * (end_cpu - start_cpu) / step1,
            "first_summary_s": t0 - start,
            "final_reward": reward,
            "evaluate_per_env_step": _timer(timers, "TorchPolicy.evaluate", "count") / (step1 / agents_per_env),
            **{f"{name} share": _timer(timers, name, "total") / timers["total"] for name in TIMERS},
        }


def _timer(node: Dict[str, Any], name: str, field: str) -> float:
    """``field`` (count, total) of every timer ``name`` in ML-Agents' timer tree, the workers'
    trees merged into it excepted."""
    children = node.get("children", {})
    found = sum(child.get(field, 0) for key, child in children.items() if key == name)
    return found + sum(_timer(child, name, field) for key, child in children.items() if key != "workers")


# ------------------------------------------------------------------- (a) mlagents-learn


def player_run(
    trainer_type: str, manager: str, envs: int, agents: int, max_steps: int, work: Path
) -> Dict[str, float]:
    from mlagents_plugin.examples import config_file

    config = yaml.safe_load(config_file("goal_player.yaml").read_text())
    config["behaviors"]["Goal"].update(trainer_type=trainer_type, max_steps=max_steps, summary_freq=max_steps // 8)
    config["env_manager"] = ENV_MANAGER_SECTION[manager]
    run_id = f"{trainer_type}-{manager.replace(' ', '-')}-{envs}x{agents}-{time.monotonic_ns()}"
    config_path = work / f"{run_id}.yaml"
    config_path.write_text(yaml.safe_dump(config))
    command = [
        MLAGENTS_LEARN, str(config_path), f"--env={work / 'builds' / 'goal'}", f"--num-envs={envs}",
        f"--run-id={run_id}", "--seed=1", f"--base-port={free_port_block(envs + 1)}", "--no-graphics",
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
    deadline = time.monotonic() + 1200
    try:
        # exited but not reaped (WNOWAIT): its CPU times can still be read
        while os.waitid(os.P_PID, trainer.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"mlagents-learn ({trainer_type}, {manager}) still running after 1200 s")
            time.sleep(0.05)
        summaries.finish()
        trainer.wait()
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
        reader.join(timeout=10)
    if trainer.returncode != 0:
        raise RuntimeError(
            f"mlagents-learn ({trainer_type}, {manager}) exited {trainer.returncode}:\n{''.join(output[-40:])}"
        )
    timers = json.loads((work / "results" / run_id / "run_logs" / "timers.json").read_text())
    return summaries.figures(agents, timers)


def python_run(trainer_type: str, manager: str, envs: int, agents: int, max_steps: int) -> Dict[str, float]:
    result = subprocess.run(
        [sys.executable, __file__, "--child", trainer_type, manager, str(envs), str(agents), str(max_steps)],
        capture_output=True, text=True, timeout=1200,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{trainer_type}, {manager} with {envs} workers: {result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _child(trainer_type: str, manager: str, workers: int, agents: int, max_steps: int) -> Dict[str, float]:
    """One training run in this fresh process: the trainer loop of mlagents-learn."""
    import attr
    from mlagents.trainers.ppo.optimizer_torch import PPOSettings
    from mlagents.trainers.settings import RunOptions, ScheduleType
    from mlagents.trainers.subprocess_env_manager import SubprocessEnvManager
    from mlagents_envs.timers import get_timer_tree, reset_timers

    from mlagents_plugin import EnvManagerSettings, SupervisedEnvManager
    from mlagents_plugin.testing import training

    write_stats = training.StatsRecorder.write_stats

    def recorded(self, category, values, step):
        write_stats(self, category, values, step)
        if training.REWARD_KEY in values and values[training.REWARD_KEY].num > 0:
            summaries.add(step, float(values[training.REWARD_KEY].aggregated_value))

    training.StatsRecorder.write_stats = recorded  # type: ignore[method-assign]
    import torch_env  # the trainer imported the env's module, as a test module is

    factory = functools.partial(torch_env.make_env, num_agents=agents)
    reset_timers()
    summaries = Summaries(psutil.Process())
    if manager == "upstream":
        env_manager = SubprocessEnvManager(factory, RunOptions(), workers)
    else:
        settings = EnvManagerSettings(**ENV_MANAGER_SECTION[manager])
        env_manager = SupervisedEnvManager(factory, RunOptions(), workers, settings)
    try:
        config = attr.evolve(
            training.PPO_CONFIG,
            trainer_type=trainer_type,
            hyperparameters=PPOSettings(  # ML-Agents' usual sizes: the update is not the whole cost
                learning_rate=3.0e-3, learning_rate_schedule=ScheduleType.CONSTANT, batch_size=128, buffer_size=2048
            ),
            summary_freq=max_steps // 8,
            max_steps=max_steps,
        )
        training.train(env_manager, config)
    finally:
        env_manager.close()
    summaries.finish()
    return summaries.figures(agents, get_timer_tree())


# ------------------------------------------------------------------------- the section


def run(quick: bool, players: bool = True, trainers: bool = False) -> List[Dict]:
    configs, cases = (TRAINERS, TRAINER_CASES) if trainers else (MANAGERS, MANAGER_CASES)
    cases = [case for case in cases if players or case[0] == "python"]
    if quick:  # the first case of each kind, a quarter of its steps, one round
        firsts: Dict[str, Tuple[str, int, int, int]] = {}
        for kind, envs, agents, steps in cases:
            firsts.setdefault(kind, (kind, envs, agents, steps // 4))
        cases = list(firsts.values())
    rounds = 1 if quick else 3 if trainers else 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="mlap-training-") as tmp:
        work = Path(tmp)
        from mlagents_plugin.player.build import make_build

        if any(kind == "player" for kind, *_ in cases):
            make_build(str(work / "builds"), "goal")
        for kind, envs, agents, max_steps in cases:
            name = f"player, {envs} builds" if kind == "player" else f"Python env, {envs} workers"
            measure = functools.partial(player_run, work=work) if kind == "player" else python_run
            rows.append(_alternate(
                f"{name} x {agents} agents, {max_steps} steps", configs, rounds,
                functools.partial(measure, envs=envs, agents=agents, max_steps=max_steps),
            ))
    return rows


def _alternate(
    case: str, configs: Dict[str, Tuple[str, str]], rounds: int, measure: Callable[[str, str], Dict[str, float]]
) -> Dict:
    runs: Dict[str, List[Dict[str, float]]] = {name: [] for name in configs}
    for _ in range(rounds):
        for name, (trainer_type, manager) in configs.items():
            runs[name].append(measure(trainer_type, manager))
    results = {name: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for name, rs in runs.items()}
    row = {"case": case, "rounds": rounds, "results": results}
    print(_line(row), flush=True)
    return row


def _line(row: Dict) -> str:
    parts = [f"{row['case']}:"]
    for name, r in row["results"].items():
        parts.append(
            f"{name} {r['agent_steps_per_s']:.0f}/s (whole {r['whole_agent_steps_per_s']:.0f}/s) "
            f"{r['evaluate_per_env_step']:.2f}ev r={r['final_reward']:.2f}"
        )
    return " | ".join(parts)


def markdown(rows: List[Dict]) -> str:
    """Three tables: between the first and the last summary, whole runs, where the trainer's time
    goes; each cell "a / b / c" in the order of the configurations, ratios against the first."""
    if not rows:
        return ""
    names = list(rows[0]["results"])
    first, others = names[0], names[1:]

    def cells(row: Dict, key: str, fmt: str) -> str:
        return " / ".join(format(row["results"][name][key], fmt) for name in names)

    def ratios(row: Dict, key: str) -> str:
        return " / ".join(f"{row['results'][n][key] / row['results'][first][key]:.2f}" for n in others)

    def table(title: str, columns: List[Tuple[str, Any]]) -> List[str]:
        out = [f"**{title}**", "", "| Case | " + " | ".join(h for h, _ in columns) + " |",
               "|" + " --- |" * (len(columns) + 1)]
        return out + ["| " + " | ".join([row["case"], *(cell(row) for _, cell in columns)]) + " |" for row in rows]

    all_, rest = " / ".join(names), " / ".join(others)

    def window(prefix: str) -> List[Tuple[str, Any]]:
        """Speed and trainer CPU over one window: between summaries (""), or the whole run."""
        return [
            (f"agent steps/s: {all_}", lambda r: cells(r, f"{prefix}agent_steps_per_s", ".0f")),
            (f"speed-up: {rest}", lambda r: ratios(r, f"{prefix}agent_steps_per_s")),
            (f"trainer CPU ms per 1000 agent steps: {all_}",
             lambda r: cells(r, f"{prefix}trainer_cpu_us_per_agent_step", ".0f")),
            (f"CPU per agent step, fraction of {first}'s: {rest}",
             lambda r: ratios(r, f"{prefix}trainer_cpu_us_per_agent_step")),
        ]

    return "\n".join([
        f"Configurations: {all_}. {rows[0]['rounds']} round(s), medians; ratios against {first}.", "",
        *table("Between the first and the last summary", [
            *window(""),
            (f"evaluate per env step: {all_}", lambda r: cells(r, "evaluate_per_env_step", ".2f")),
            (f"final reward: {all_}", lambda r: cells(r, "final_reward", ".2f")),
        ]), "",
        *table("Whole runs (player: the mlagents-learn process, start to exit; Python: the manager's "
               "construction to the end of its close)", [
            (f"whole run s: {all_}", lambda r: cells(r, "whole_run_s", ".1f")),
            *window("whole_"),
            (f"first summary s: {all_}", lambda r: cells(r, "first_summary_s", ".1f")),
        ]), "",
        *table("Where the trainer's wall time goes (ML-Agents' timers, shares of the timer root)", [
            (f"`{timer}`: {all_}", lambda r, t=timer: cells(r, f"{t} share", ".2f")) for timer in TIMERS
        ]),
    ])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        trainer_type, manager, *numbers = sys.argv[2:]
        print(json.dumps(_child(trainer_type, manager, *map(int, numbers))))
    else:
        parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("--quick", action="store_true",
                            help="the first case of each kind, a quarter of its steps, one round")
        parser.add_argument("--python-only", action="store_true", help="the Python-env cases alone")
        parser.add_argument("--trainers", action="store_true",
                            help="ppo + upstream's manager, ppo + ours, ppo_fast + ours (issue 33), 3 rounds")
        args = parser.parse_args()
        print(markdown(run(quick=args.quick, players=not args.python_only, trainers=args.trainers)))
