"""Fault scenarios against ML-Agents' SubprocessEnvManager and SupervisedEnvManager, side by side.

Every (scenario, manager) pair runs in a Python subprocess of its own, in a session of its own,
under a hard wall-clock bound: a manager that hangs cannot hang this script. After each run the
script reports, then kills, every process the run left behind: workers, forkservers, and the
stand-in "players" of PlayerLaunchingEnvironment (they run in a session of their own; they are
found through an environment variable every process of the run inherits, and through the pid
files the env writes).

    python compare_faults.py [--only kill exit ...] [--managers upstream ours] [--save RESULTS.md]

It prints a Markdown table: scenario | upstream | ours. Per-run console output and the JSON each
run reports through are kept in ``results/fault-runs/`` of the checkout.

Internally the script re-runs itself as ``--child SCENARIO MANAGER --run-dir DIR`` for each run.
The parts are in ``faults/`` (its ``__init__`` lists them).
"""
import argparse

from faults import MANAGERS
from faults.child import child_main
from faults.report import compare
from faults.scenarios import BY_KEY


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(BY_KEY), help="run only these scenarios")
    parser.add_argument("--managers", nargs="+", choices=MANAGERS, default=list(MANAGERS))
    parser.add_argument("--save", help="also write the table, with this command, to this file")
    parser.add_argument("--child", nargs=2, metavar=("SCENARIO", "MANAGER"), help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child[0], args.child[1], args.run_dir)
    else:
        print(compare(args.only, args.managers, args.save))


if __name__ == "__main__":
    main()
