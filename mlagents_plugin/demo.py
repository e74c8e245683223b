"""``make demo``: stock ``mlagents-learn`` trains through SupervisedEnvManager, then a summary.

    python -m mlagents_plugin.demo [--num-envs 4] [--results-dir results]

It runs ``mlagents-learn config/simple_python_env.yaml`` in a subprocess (exactly what a user
types), streams its output, and then reads the run's TensorBoard events and model files.
"""
import argparse
import glob
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "config" / "simple_python_env.yaml"
REWARD_TAG = "Environment/Cumulative Reward"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlagents_plugin.demo", description=__doc__)
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--results-dir", default="results")
    parser.add_argument("--run-id", default="demo")
    args = parser.parse_args(argv)

    learn = str(Path(sys.executable).parent / "mlagents-learn")
    command = [
        learn,
        args.config,
        f"--run-id={args.run_id}",
        f"--num-envs={args.num_envs}",
        f"--results-dir={args.results_dir}",
        "--force",
    ]
    print("$ " + " ".join(command), flush=True)
    started = time.monotonic()
    returncode = subprocess.call(command)
    elapsed = time.monotonic() - started
    run_dir = Path(args.results_dir) / args.run_id
    print(summary(run_dir, returncode, elapsed, args.num_envs))
    return returncode


def summary(run_dir: Path, returncode: int, elapsed_s: float, num_envs: int) -> str:
    scalars = _read_rewards(run_dir)
    models = sorted(glob.glob(str(run_dir / "*.onnx")))
    lines = ["", "=" * 72, f"mlagents-learn exited with code {returncode} after {elapsed_s:.1f} s"]
    for behavior, (steps, reward, steps_per_s) in scalars.items():
        lines.append(
            f"{behavior}: {steps} steps with {num_envs} env workers, {steps_per_s:.0f} steps/s; "
            f"final mean reward {reward:.3f}"
        )
    if not scalars:
        lines.append("No reward was recorded: see the output above.")
    lines.append("Models: " + (", ".join(models) if models else "none written"))
    lines.append(f"Env manager settings: {run_dir / 'env_manager.yaml'}")
    lines.append(f"TensorBoard: tensorboard --logdir {run_dir.parent}")
    lines.append("=" * 72)
    return "\n".join(lines)


def _read_rewards(run_dir: Path) -> Dict[str, Tuple[int, float, float]]:
    """Per behaviour: the last step, the last mean reward, and steps/s between summaries."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found = {}
    for behavior_dir in sorted(p for p in run_dir.glob("*") if p.is_dir()):
        accumulator = EventAccumulator(str(behavior_dir))
        accumulator.Reload()
        if REWARD_TAG not in accumulator.Tags().get("scalars", []):
            continue
        events = accumulator.Scalars(REWARD_TAG)
        first, last = events[0], events[-1]
        span_s = last.wall_time - first.wall_time
        rate = (last.step - first.step) / span_s if span_s > 0 else float("nan")
        found[behavior_dir.name] = (last.step, last.value, rate)
    return found


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
