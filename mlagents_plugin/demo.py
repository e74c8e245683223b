"""``make demo``: stock ``mlagents-learn`` trains on four Unity-like builds, one of which
crashes mid-run and is restarted, then a summary.

    python -m mlagents_plugin.demo [--num-envs 4] [--agents-per-env 4] [--no-crash]

The builds are the headless player's goal scene (``python -m mlagents_plugin.player
make-build``); ``mlagents-learn`` launches them, exactly as it launches Unity builds, and
trains through SupervisedEnvManager. The summary is read from the run's TensorBoard events.
"""
import argparse
import glob
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from mlagents_plugin.examples import config_file
from mlagents_plugin.player.build import make_build
from mlagents_plugin.testing.ports import free_port_block

BEHAVIOR = "Goal"
REWARD = "Environment/Cumulative Reward"
RESTARTS = "Environment/Env Workers/Restarts/"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlagents_plugin.demo", description=__doc__)
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--agents-per-env", type=int, default=4)
    parser.add_argument("--results-dir", default="results")
    parser.add_argument("--run-id", default="demo")
    parser.add_argument("--no-crash", action="store_true", help="do not crash a build mid-run")
    args = parser.parse_args(argv)

    run_dir = Path(args.results_dir) / args.run_id
    builds = Path(args.results_dir) / "demo-builds"
    make_build(str(builds), "goal")
    base_port = free_port_block(args.num_envs + 8, start=5005)  # from the builds' default up
    player_args = ["--num-agents", str(args.agents_per_env)]
    if not args.no_crash:
        once = builds / "crashed-once"
        once.unlink(missing_ok=True)
        # Build 1 crashes (exit code 3) at its 150th step, the first time only.
        player_args += ["--crash-after-steps", "150", "--fault-port", str(base_port + 1), "--fault-once", str(once)]
    command = [
        str(Path(sys.executable).parent / "mlagents-learn"),
        str(config_file("goal_player.yaml")),
        f"--env={builds / 'goal'}",
        f"--num-envs={args.num_envs}",
        f"--base-port={base_port}",
        f"--run-id={args.run_id}",
        f"--results-dir={args.results_dir}",
        "--force",
        "--env-args",
        *player_args,
    ]
    print("$ " + " ".join(command), flush=True)
    started = time.monotonic()
    returncode = subprocess.call(command)
    print(summary(run_dir, returncode, time.monotonic() - started, args.agents_per_env))
    return returncode


def summary(run_dir: Path, returncode: int, elapsed_s: float, agents_per_env: int) -> str:
    lines = ["", "=" * 72, f"mlagents-learn exited with code {returncode} after {elapsed_s:.0f} s"]
    stats = _scalars(run_dir / BEHAVIOR)
    if REWARD in stats:
        steps, rewards, wall = stats[REWARD]
        rate = (steps[-1] - steps[0]) / (wall[-1] - wall[0]) if len(steps) > 1 else float("nan")
        lines.append(
            f"{BEHAVIOR}: {steps[-1]} agent steps, {rate:.0f} agent steps/s "
            f"({rate / agents_per_env:.0f} env steps/s) between the first and last summary"
        )
        lines.append(f"Final mean reward: {rewards[-1]:.3f} (the optimum is about 0.97)")
    else:
        lines.append("No reward was recorded: see the output above.")
    restarts = {
        tag[len(RESTARTS) :]: int(sum(values)) for tag, (_, values, _) in stats.items() if tag.startswith(RESTARTS)
    }
    lines.append(
        "Env worker restarts by cause: "
        + (", ".join(f"{cause} {n}" for cause, n in sorted(restarts.items())) if restarts else "none")
    )
    models = sorted(glob.glob(str(run_dir / "*.onnx")))
    lines.append("Model for Unity: " + (", ".join(models) if models else "none written"))
    lines.append(f"Env manager settings: {run_dir / 'env_manager.yaml'}; player logs: {run_dir / 'run_logs'}")
    lines.append(f"TensorBoard: tensorboard --logdir {run_dir.parent}")
    lines.append("=" * 72)
    return "\n".join(lines)


def _scalars(directory: Path) -> Dict[str, tuple]:
    """tag -> (steps, values, wall times) from the TensorBoard events in ``directory``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not directory.is_dir():
        return {}
    accumulator = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    accumulator.Reload()
    found = {}
    for tag in accumulator.Tags()["scalars"]:
        events = accumulator.Scalars(tag)
        found[tag] = ([e.step for e in events], [e.value for e in events], [e.wall_time for e in events])
    return found


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
