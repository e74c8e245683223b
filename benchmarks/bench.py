"""The one front of benchmarks/ (its README says which command answers which question).

    python benchmarks/bench.py [--quick] [--only SECTION ...] [--ray-address ADDR]
    python benchmarks/bench.py RUN [its options]

Sections (``make bench``: all of them, side by side in one run; JSON and Markdown in
results/bench/): throughput trainer unity startup faults drift ray training concurrent.
``--quick`` (CI's smoke run) runs a little of each and asserts nothing about speed.

Runs that stand alone, with options of their own (``bench.py RUN --help``): chaos, compare-faults
(the fault benchmarks, with the ``faults`` section), ray-faults, ray-scale, training-python (the
``training`` section's Python-env cases alone), training-trainers (``ppo`` and ``ppo_fast``
end to end: issue 33's speed table), ppo-update (``ppo`` against ``ppo_fast``: the
trainer's time), learning (``ppo`` against ``ppo_fast``: what they learn, over seeds).
"""
import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

RUNS = {  # stand-alone runs: each its own process, as it needs (a Ray cluster, a live training)
    "chaos": ["chaos.py"],
    "compare-faults": ["compare_faults.py"],
    "ray-faults": ["ray_faults.py"],
    "ray-scale": ["ray_scale.py"],
    "training-python": ["training.py", "--python-only"],
    "training-trainers": ["training.py", "--trainers"],
    "ppo-update": ["ppo_update.py"],
    "learning": ["learning.py"],
}
HERE = os.path.dirname(os.path.abspath(__file__))
if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] in RUNS:
    # the run replaces this process (its Ctrl-C handling and clean-up are its own), before the
    # sections' imports below
    script, *options = RUNS[sys.argv[1]]
    os.execv(sys.executable, [sys.executable, os.path.join(HERE, script), *options, *sys.argv[2:]])

# The sections sit beside this script, whose folder Python puts first on sys.path.
import concurrent_runs  # noqa: E402
import drift  # noqa: E402
import fault_costs  # noqa: E402
import ray_vs_subprocess  # noqa: E402
import startup  # noqa: E402
import throughput  # noqa: E402
import trainer_loop  # noqa: E402
import training  # noqa: E402
import unity_path  # noqa: E402

SECTIONS = {
    "throughput": throughput,
    "trainer": trainer_loop,
    "unity": unity_path,
    "startup": startup,
    "faults": fault_costs,
    "drift": drift,
    "ray": ray_vs_subprocess,
    "training": training,
    "concurrent": concurrent_runs,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="*", choices=list(SECTIONS), default=list(SECTIONS))
    parser.add_argument("--out", default="results/bench")
    parser.add_argument("--ray-address", help="an existing Ray cluster for the ray section (default: start one)")
    args = parser.parse_args()
    ray_vs_subprocess.ADDRESS = args.ray_address
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "load_average_at_start": os.getloadavg()}, "quick": args.quick}
    markdown = [f"# Benchmarks ({time.strftime('%Y-%m-%d %H:%M')}{', quick' if args.quick else ''})"]
    for name in args.only:
        section = SECTIONS[name]
        print(f"== {name}", flush=True)
        rows = section.run(args.quick)
        report[name] = rows
        markdown += [f"\n## {name}\n", section.markdown(rows)]
        # written after every section, so that a late failure keeps what was measured
        (out / "bench.json").write_text(json.dumps(report, indent=1))
        (out / "bench.md").write_text("\n".join(markdown) + "\n")
    print("\n".join(markdown))
    print(f"\nWritten: {out / 'bench.json'}, {out / 'bench.md'}")


if __name__ == "__main__":
    main()
