"""``ppo`` against ``ppo_fast``, learning (docs/trainers.md#learning-ppo-against-ppo_fast): does the
new trainer type learn as well as ML-Agents' own ``ppo``, on the PPO cases of ML-Agents 1.1.0's
``test_simple_rl.py`` (and ``test_hybrid.py``), over several seeds?

    python benchmarks/bench.py learning [--seeds 5] [--cases discrete ...] [--jobs 1] [--out DIR]
    python benchmarks/bench.py learning --quick          # CI's smoke run: 1 case, 1 seed, 600 steps
    python benchmarks/bench.py learning --from-json FILE # the table and the picture again, no training

Every (case, trainer type, seed) trains in a process of its own (ML-Agents keeps global state),
on ML-Agents' in-process ``SimpleEnvManager`` (no env manager, no worker), with one torch thread,
through ``mlagents_plugin.testing.training.train``. ``ppo`` and ``ppo_fast`` of the same case and
seed make a pair, which goes first alternating from seed to seed; with ``--jobs 2`` a pair's two
runs go side by side and the next pair waits for both: the machine's load hits both types alike.

The cases: the package's ``PPO_CONFIG`` (upstream's test configuration with a lower learning
rate, twice the entropy bonus and a linear learning-rate schedule: testing/training.py), with each
upstream test's own changes (learning rate, batch and buffer sizes, memory, ``max_steps``), on the
package's ``SimpleEnvironment`` and two variants of it defined here: ``MemoryEnvironment`` (the
goal seen at the first 3 decisions of an episode only, as upstream's) and
``VisualOnlyEnvironment`` (a camera and no vector observation, as upstream's ``num_vector=0``).
ML-Agents' wheel ships no tests, so upstream's own ``simple_test_envs`` (and its
``MultiAgentEnvironment``) cannot be imported: the multi-agent case is the package's
SimpleEnvironment with 2 agents stepping together (upstream's MultiAgentEnvironment is POCA's test
env: an agent that finishes before its group gets its reward as a group reward, which ``ppo``'s
``Environment/Cumulative Reward`` does not count). Two cases are not upstream's: 16 agents in one
env, without and with ``normalize: true``, the shape of a build, where a round brings many
trajectories at once (what ``ppo_fast`` processes together, NOTE [ A round at once ]).

Per summary (every 100 agent steps): the agent steps, the seconds since ``train`` started, and the
mean episode reward. What is judged, as upstream's ``check_environment_trains`` judges (the mean of
the last 5 episodes above 0.9): the mean of the last 5 summaries (the last 500 agent steps)
above the case's threshold, 0.9. Per case and type: success rate, final reward (that mean) median
[min, max] over seeds, median agent steps and seconds until it first exceeded the threshold.

Verdict, per case: EQUAL WITHIN NOISE when the success counts differ by at most max(1, N/5) of N
seeds and each type's median final reward lies within the other's [min, max] over seeds; with
fewer than 3 seeds nothing is judged. Exit code 1 if a case is not equal within noise.
"""
import argparse
import concurrent.futures
import datetime
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TRAINERS = ("ppo", "ppo_fast")
SUMMARY_FREQ = 100  # agent steps per summary: the points of the curves
WINDOW = 5  # summaries averaged for the final reward and the threshold (upstream: the last 5 episodes)
THRESHOLD = 0.9  # upstream's check_environment_trains default, and its recurrent and hybrid tests'
QUICK_STEPS = 600

# name -> what it mirrors upstream, the env (class and keyword arguments) and upstream's changes to
# its test configuration. "env_class": simple (the package's SimpleEnvironment), memory, visual.
CASES: Dict[str, Dict[str, Any]] = {
    "discrete": {
        "mirrors": "test_simple_ppo, action_sizes (0, 1)",
        "env": {"action": "discrete"},
    },
    "continuous": {
        "mirrors": "test_simple_ppo, action_sizes (1, 0)",
        "env": {"action": "continuous"},
    },
    "hybrid": {
        "mirrors": "test_hybrid_ppo (torch_entities/test_hybrid.py): lr 1e-3, batch 64, buffer 1024, 20000 steps",
        "env": {"action": "hybrid"},
        "hyperparameters": {"learning_rate": 1.0e-3, "batch_size": 64, "buffer_size": 1024},
        "max_steps": 20000,
    },
    "visual": {
        "mirrors": "test_visual_ppo, 1 camera 3x20x20, no vector, action_sizes (0, 1): lr 3e-4",
        "env_class": "visual",
        "env": {"visual_shape": [3, 20, 20]},
        "hyperparameters": {"learning_rate": 3.0e-4},
    },
    "recurrent": {
        "mirrors": "test_recurrent_ppo on MemoryEnvironment, action_sizes (0, 1): LSTM memory 16, "
                   "lr 1e-3, batch 64, buffer 128, 6000 steps",
        "env_class": "memory",
        "memory": {"memory_size": 16},
        "hyperparameters": {"learning_rate": 1.0e-3, "batch_size": 64, "buffer_size": 128},
        "max_steps": 6000,
    },
    "curiosity": {
        "mirrors": "two reward signals: extrinsic + curiosity (strength 0.02, gamma 0.99)",
        "env": {"action": "discrete"},
        "curiosity": {"strength": 0.02, "gamma": 0.99},
    },
    "multi-agent": {
        "mirrors": "several agents in one env (upstream's MultiAgentEnvironment has 2): 2 agents",
        "env": {"num_agents": 2},
    },
    # not upstream's: a build's shape, where a round brings many trajectories (NOTE [ A round at
    # once ]), without and with the normalisers that ppo_fast updates once per round
    "16 agents": {
        "mirrors": "test_simple_ppo with 16 agents in one env, 6000 steps",
        "env": {"action": "discrete", "num_agents": 16},
        "max_steps": 6000,
    },
    "16 agents, normalize": {
        "mirrors": "test_simple_ppo with 16 agents in one env, 6000 steps, network_settings.normalize: true",
        "env": {"action": "discrete", "num_agents": 16},
        "network": {"normalize": True},
        "max_steps": 6000,
    },
}
DEFAULT_MAX_STEPS = 3000  # upstream's test configuration's


# --------------------------------------------------------------------------- one run (a child)

def one_run(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Train one (case, trainer type, seed) in this process; called in a child process."""
    import random

    import attr
    import torch
    from mlagents.trainers.settings import CuriositySettings, NetworkSettings, RewardSignalType
    from mlagents.trainers.simple_env_manager import SimpleEnvManager
    from mlagents_envs.side_channel.environment_parameters_channel import EnvironmentParametersChannel

    from mlagents_plugin.testing import SimpleEnvironment, training
    from mlagents_plugin.trainers import ppo_fast

    class MemoryEnvironment(SimpleEnvironment):
        """The goal is seen until ``SHOW_STEPS`` steps of an episode have been taken (at its first 3
        decisions), then 0, as in upstream's MemoryEnvironment."""

        SHOW_STEPS = 2

        def _observations(self, name, which):
            obs = super()._observations(name, which)
            hidden = self._episode_steps[name][which] > self.SHOW_STEPS
            obs[0][hidden] = 0.0
            return obs

    class VisualOnlyEnvironment(SimpleEnvironment):
        """The camera alone: no vector observation (upstream's ``num_vector=0``)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._specs = {
                name: spec._replace(observation_specs=spec.observation_specs[1:])
                for name, spec in self._specs.items()
            }
            self.reset()  # its first steps again, with the camera alone

        def _observations(self, name, which):
            return super()._observations(name, which)[1:]

    case = spec["case"]
    seed = spec["seed"]
    torch.set_num_threads(1)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    config = attr.evolve(
        training.PPO_CONFIG, trainer_type=spec["trainer_type"], max_steps=spec["max_steps"], summary_freq=SUMMARY_FREQ
    )
    if case.get("hyperparameters"):
        config = attr.evolve(config, hyperparameters=attr.evolve(config.hyperparameters, **case["hyperparameters"]))
    if case.get("network"):
        config = attr.evolve(config, network_settings=attr.evolve(config.network_settings, **case["network"]))
    if case.get("memory"):
        memory = NetworkSettings.MemorySettings(**case["memory"])
        config = attr.evolve(config, network_settings=attr.evolve(config.network_settings, memory=memory))
    if case.get("curiosity"):
        signals = dict(config.reward_signals)
        signals[RewardSignalType.CURIOSITY] = CuriositySettings(**case["curiosity"])
        config = attr.evolve(config, reward_signals=signals)
    env_class = {"simple": SimpleEnvironment, "memory": MemoryEnvironment, "visual": VisualOnlyEnvironment}[
        case.get("env_class", "simple")
    ]
    channel = EnvironmentParametersChannel()
    env = env_class(0, [channel], seed=seed, **case.get("env", {}))

    curve: List[Tuple[int, float, float, int]] = []  # (agent steps, seconds, mean reward, episodes)

    class TimedRecorder(training.StatsRecorder):
        """train()'s recorder, which also notes each summary's step and time."""

        def write_stats(self, category, values, step):
            super().write_stats(category, values, step)
            summary = values.get(training.REWARD_KEY)
            if summary is not None and summary.num > 0:
                curve.append((int(step), time.perf_counter() - started, float(summary.aggregated_value), summary.num))

    training.StatsRecorder = TimedRecorder  # train() makes its recorder from the module's name
    cpu = time.process_time()
    started = time.perf_counter()
    training.train(SimpleEnvManager(env, channel), config, seed=seed)
    return {
        "whole_s": time.perf_counter() - started,
        "cpu_s": time.process_time() - cpu,
        "steps": [c[0] for c in curve],
        "seconds": [c[1] for c in curve],
        "rewards": [c[2] for c in curve],
        "episodes": [c[3] for c in curve],
        "ppo_fast_blob": git_blob_sha1(Path(ppo_fast.__file__)),
        "plugin_path": str(Path(ppo_fast.__file__).parents[1]),
    }


def git_blob_sha1(path: Path) -> str:
    """The file's git blob id, as ``git rev-parse HEAD:path`` names the committed one."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def run_child(spec: Dict[str, Any], timeout: float) -> Dict[str, Any]:
    run = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--one-run", json.dumps(spec)],
        capture_output=True, text=True, timeout=timeout,
    )
    if run.returncode != 0:
        raise RuntimeError(f"{spec['name']} {spec['trainer_type']} seed {spec['seed']} failed:\n{run.stderr[-3000:]}")
    line = next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))
    result: Dict[str, Any] = json.loads(line[len("RESULT "):])
    return result


# --------------------------------------------------------------------------- what a run scored

def windowed(rewards: Sequence[float], window: int = WINDOW, partial: bool = False) -> List[float]:
    """The mean of the ``window`` summaries ending at each summary: NaN where fewer have been
    made, or with ``partial`` (the curves' start) the mean of those there are."""
    values = np.asarray(rewards, dtype=float)
    return [
        float(values[max(0, end - window):end].mean()) if end >= window or partial else float("nan")
        for end in range(1, len(values) + 1)
    ]


def score(run: Dict[str, Any], threshold: float) -> Dict[str, Any]:
    """Final reward (the mean of the last summaries), success, and when the threshold was first passed."""
    means = windowed(run["rewards"])
    final = means[-1] if means else float("nan")
    first = next((i for i, value in enumerate(means) if value > threshold), None)
    return {
        "final": final,
        "success": bool(final > threshold),
        "steps_to_threshold": run["steps"][first] if first is not None else None,
        "seconds_to_threshold": run["seconds"][first] if first is not None else None,
    }


def judge(ppo: Sequence[Dict[str, Any]], fast: Sequence[Dict[str, Any]]) -> Tuple[Optional[bool], str]:
    """Equal within noise? (None: fewer than 3 seeds, not judged.) ``ppo`` and ``fast`` are scores."""
    n = min(len(ppo), len(fast))
    if n < 3:
        return None, f"not judged ({n} seed{'s' if n != 1 else ''}: at least 3 are needed)"
    tolerance = max(1, round(n / 5))
    wins = sum(s["success"] for s in ppo), sum(s["success"] for s in fast)
    finals = [s["final"] for s in ppo], [s["final"] for s in fast]
    medians = statistics.median(finals[0]), statistics.median(finals[1])
    reasons = []
    if abs(wins[0] - wins[1]) > tolerance:
        reasons.append(f"successes {wins[0]} against {wins[1]} of {n} (more than {tolerance} apart)")
    for name, median, other, other_name in (
        ("ppo", medians[0], finals[1], "ppo_fast"), ("ppo_fast", medians[1], finals[0], "ppo")
    ):
        if not min(other) <= median <= max(other):
            reasons.append(
                f"{name}'s median final reward {median:.3f} outside {other_name}'s [{min(other):.3f}, {max(other):.3f}]"
            )
    return (False, "; ".join(reasons)) if reasons else (True, "equal within noise")


# --------------------------------------------------------------------------- the report

def case_threshold(name: str, report: Dict[str, Any]) -> float:
    return float(report["cases"][name].get("threshold", THRESHOLD))


def fmt_median(values: Sequence[Optional[float]], digits: int) -> str:
    reached = [v for v in values if v is not None]
    if not reached:
        return "not reached"
    text = f"{statistics.median(reached):.{digits}f}"
    return text if len(reached) == len(values) else f"{text} ({len(reached)} of {len(values)})"


def table(report: Dict[str, Any]) -> Tuple[str, List[Tuple[str, Optional[bool], str]]]:
    lines = [
        f"| case | type | success (final > {THRESHOLD}) | final reward: median [min, max] | "
        "agent steps to threshold: median | seconds to threshold: median | whole run s: median | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    verdicts = []
    for name in report["cases"]:
        threshold = case_threshold(name, report)
        scores = {
            t: [score(r, threshold) for r in report["runs"] if r["case"] == name and r["trainer_type"] == t]
            for t in TRAINERS
        }
        whole = {
            t: [r["whole_s"] for r in report["runs"] if r["case"] == name and r["trainer_type"] == t] for t in TRAINERS
        }
        if not all(scores.values()):
            continue
        ok, why = judge(scores["ppo"], scores["ppo_fast"])
        verdicts.append((name, ok, why))
        for t in TRAINERS:
            s = scores[t]
            finals = [x["final"] for x in s]
            lines.append(
                f"| {name if t == 'ppo' else ''} | `{t}` | {sum(x['success'] for x in s)}/{len(s)} "
                f"| {statistics.median(finals):.3f} [{min(finals):.3f}, {max(finals):.3f}] "
                f"| {fmt_median([x['steps_to_threshold'] for x in s], 0)} "
                f"| {fmt_median([x['seconds_to_threshold'] for x in s], 1)} "
                f"| {statistics.median(whole[t]):.1f} "
                f"| {('yes' if ok else '**no**') if ok is not None and t == 'ppo' else ''} |"
            )
    return "\n".join(lines), verdicts


def plot(report: Dict[str, Any], path: Path) -> None:
    """Reward against agent steps and against seconds: median line, min-max band over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in report["cases"] if any(r["case"] == n for r in report["runs"])]
    colours = {"ppo": "tab:blue", "ppo_fast": "tab:orange"}
    styles = {"ppo": "-", "ppo_fast": "--"}
    fig, axes = plt.subplots(len(names), 2, figsize=(11, 2.3 * len(names) + 0.8), squeeze=False)
    for row, name in enumerate(names):
        threshold = case_threshold(name, report)
        for t in TRAINERS:
            runs = [r for r in report["runs"] if r["case"] == name and r["trainer_type"] == t and r["steps"]]
            if not runs:
                continue
            curves = [np.asarray(windowed(r["rewards"], partial=True)) for r in runs]
            # against agent steps: every run summarises at the same steps
            length = min(len(c) for c in curves)
            steps = np.asarray(runs[0]["steps"][:length])
            stacked = np.vstack([c[:length] for c in curves])
            label = f"{t} ({len(runs)} seed{'s' if len(runs) != 1 else ''})"
            _band(axes[row][0], steps, stacked, colours[t], styles[t], label)
            # against seconds: each summary at the median over seeds of the time it was written
            seconds = np.median(np.vstack([r["seconds"][:length] for r in runs]), 0)
            _band(axes[row][1], seconds, stacked, colours[t], styles[t], t)
        for col, xlabel in enumerate(("agent steps", "seconds since the start of training (median over seeds)")):
            ax = axes[row][col]
            ax.axhline(threshold, color="grey", linestyle=":", linewidth=1)
            ax.set_xlabel(xlabel, fontsize=8)
            ax.set_ylim(-1.05, 1.05)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
        axes[row][0].set_ylabel(f"{name}\nmean reward", fontsize=9)
        axes[row][0].legend(fontsize=7, loc="lower right")
    meta = report["meta"]
    fig.suptitle(
        f"ppo against ppo_fast: mean episode reward of the last {WINDOW} summaries (the last {WINDOW * SUMMARY_FREQ} "
        f"agent steps), median and min-max over seeds;\nagainst seconds, each summary at the median over seeds of "
        f"the time it was written (since the start of training); dotted: the threshold, {THRESHOLD}\n"
        f"{meta['date']}, {meta['commit']}, {meta['cpus']} cores, {meta['jobs']} run(s) at a time, "
        f"load average {meta['load_before'][0]:.1f} at the start",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.96 if len(names) > 2 else 0.85))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _band(ax: Any, x: np.ndarray, stacked: np.ndarray, colour: str, style: str, label: str) -> None:
    median, low, high = np.median(stacked, 0), np.min(stacked, 0), np.max(stacked, 0)
    ax.plot(x, median, color=colour, linestyle=style, linewidth=1.4, label=label)
    ax.fill_between(x, low, high, color=colour, alpha=0.18, linewidth=0)


# --------------------------------------------------------------------------- the run of runs

def git(*args: str) -> Optional[str]:
    try:
        run = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=20)
    except OSError:
        return None
    return run.stdout.strip() if run.returncode == 0 else None


def describe_code(blob: Optional[str]) -> str:
    """Which commit, and whether the ppo_fast.py that ran is the committed one."""
    head = git("rev-parse", "--short", "HEAD")
    if head is None:
        return f"no git checkout (ppo_fast.py blob {str(blob)[:10]})"
    committed = git("rev-parse", "HEAD:mlagents_plugin/trainers/ppo_fast.py")
    same = "as committed" if blob == committed else "with uncommitted changes"
    return f"commit {head}, ppo_fast.py {same} (blob {str(blob)[:10]})"


def jobs_for(cases: Sequence[str], seeds: Sequence[int], quick: bool) -> List[Dict[str, Any]]:
    jobs = []
    for index, seed in enumerate(seeds):
        for name in cases:
            order = TRAINERS if index % 2 == 0 else TRAINERS[::-1]  # alternating: who goes first
            for trainer_type in order:
                case = CASES[name]
                jobs.append({
                    "name": name, "case": case, "trainer_type": trainer_type, "seed": seed,
                    "max_steps": QUICK_STEPS if quick else case.get("max_steps", DEFAULT_MAX_STEPS),
                })
    return jobs


def run_all(jobs: List[Dict[str, Any]], parallel: int, report: Dict[str, Any], json_path: Path) -> None:
    lock = threading.Lock()
    done = 0

    def one(job: Dict[str, Any]) -> None:
        nonlocal done
        result = run_child(job, timeout=1800)
        with lock:
            done += 1
            report["runs"].append({"case": job["name"], "trainer_type": job["trainer_type"], "seed": job["seed"],
                                   "max_steps": job["max_steps"], **result})
            json_path.write_text(json.dumps(report, indent=1))  # after every run: a late failure keeps the rest
            final = windowed(result["rewards"])[-1] if result["rewards"] else float("nan")
            print(f"[{done}/{len(jobs)}] {job['name']} {job['trainer_type']} seed {job['seed']}: final {final:.3f}, "
                  f"{result['whole_s']:.1f} s (load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)

    # A pair (ppo and ppo_fast of one case and seed) at a time: with --jobs 2 its two runs go side
    # by side and the next pair waits for both, so that each run shares the machine with its twin.
    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
        for start in range(0, len(jobs), len(TRAINERS)):
            futures = [pool.submit(one, job) for job in jobs[start:start + len(TRAINERS)]]
            try:
                for future in futures:
                    future.result()
            except BaseException:
                for future in futures:
                    future.cancel()
                raise


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5, help="seeds per case and type (1, 2, ... N)")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--jobs", type=int, choices=(1, 2), default=1, help="runs at once (at most 2)")
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke run: the first case given, 1 seed, {QUICK_STEPS} steps")
    parser.add_argument("--out", type=Path,
                        help="where learning_curves.png and learning.json go (default: docs/ and results/learning/)")
    parser.add_argument("--from-json", type=Path, help="no training: the table and the picture of a saved run")
    parser.add_argument("--one-run", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.one_run:
        print("RESULT " + json.dumps(one_run(json.loads(options.one_run))), flush=True)
        return 0
    png = (options.out or REPO / "docs") / "learning_curves.png"
    json_path = (options.out or REPO / "results" / "learning") / "learning.json"
    if options.from_json:
        report = json.loads(options.from_json.read_text())
    else:
        cases = options.cases[:1] if options.quick else options.cases
        seeds = [1] if options.quick else list(range(1, options.seeds + 1))
        jobs = jobs_for(cases, seeds, options.quick)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "meta": {
                "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
                "command": " ".join(["benchmarks/learning.py", *sys.argv[1:]]),
                "cpus": os.cpu_count(), "python": platform.python_version(), "jobs": options.jobs,
                "seeds": seeds, "quick": options.quick, "load_before": list(os.getloadavg()),
                "commit": "", "summary_freq": SUMMARY_FREQ, "window": WINDOW, "torch_threads": 1,
            },
            "cases": {name: CASES[name] for name in cases},
            "runs": [],
        }
        print(f"{len(jobs)} runs ({len(cases)} case(s) x {len(TRAINERS)} types x {len(seeds)} seed(s)), "
              f"{options.jobs} at a time; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
              file=sys.stderr, flush=True)
        started = time.perf_counter()
        run_all(jobs, options.jobs, report, json_path)
        blobs = sorted({r["ppo_fast_blob"] for r in report["runs"]})
        report["meta"].update({
            "load_after": list(os.getloadavg()), "wall_s": time.perf_counter() - started,
            "commit": describe_code(blobs[0]) + ("" if len(blobs) == 1 else " (ppo_fast.py CHANGED DURING THE RUN)"),
            "plugin_path": report["runs"][0]["plugin_path"],
        })
        json_path.write_text(json.dumps(report, indent=1))
    markdown, verdicts = table(report)
    meta = report["meta"]
    print(f"Learning: `ppo` against `ppo_fast` ({meta['date']}, {meta['commit']}; seeds {meta['seeds']}; "
          f"{meta['jobs']} run(s) at a time; load average {meta['load_before'][0]:.1f} at the start"
          + (f", {meta['load_after'][0]:.1f} at the end; {meta['wall_s'] / 60:.1f} min" if "load_after" in meta else "")
          + ")\n")
    print(markdown)
    failed = [(name, why) for name, ok, why in verdicts if ok is False]
    unjudged = [name for name, ok, _ in verdicts if ok is None]
    print()
    if failed:
        print("Verdict: NOT equal within noise on " + "; ".join(f"{name}: {why}" for name, why in failed))
    elif unjudged:
        print(f"Verdict: {verdicts[0][2]}" if verdicts else "Verdict: no run")
    else:
        print(f"Verdict: equal within noise on all {len(verdicts)} cases (success counts at most max(1, N/5) of N "
              "apart, each type's median final reward within the other's range over seeds)")
    plot(report, png)
    print(f"\nWritten: {png}, {json_path}" if not options.from_json else f"\nWritten: {png}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
