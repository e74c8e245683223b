"""The Markdown report: one row per scenario, one cell per manager, made of the facts its run found."""
import os
import shlex
import sys
import time
from typing import List, Optional

from faults import MANAGERS, N_ENV
from faults.observer import RUNS_DIR, run_one
from faults.scenarios import SCENARIOS


def compare(only: Optional[List[str]], managers: List[str], save: Optional[str]) -> str:
    """Run the scenarios (``only`` these, if given) against ``managers``; return the table, and
    with ``save`` also write it, with the command that made it, to that file."""
    scenarios = [s for s in SCENARIOS if not only or s.key in only]
    rows = []
    for scenario in scenarios:
        cells = []
        for manager_name in MANAGERS:
            if manager_name not in managers:
                cells.append("(not run)")
                continue
            t0 = time.time()
            print(f"[{time.strftime('%H:%M:%S')}] {scenario.key} / {manager_name} ...", file=sys.stderr, flush=True)
            cells.append(cell(run_one(scenario, manager_name)))
            print(f"    done in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
        rows.append(f"| {scenario.title} | {cells[0]} | {cells[1]} |")
    table = "\n".join(
        [
            "| scenario | upstream `SubprocessEnvManager` | ours `SupervisedEnvManager` |",
            "| --- | --- | --- |",
            *rows,
        ]
    )
    if save:
        write(save, table)
    return table


def cell(facts: List[str]) -> str:
    return "<br>".join(f.replace("|", "\\|").replace("\n", " ") for f in facts)


def write(path: str, table: str) -> None:
    command = " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv])
    with open(path, "w") as f:
        f.write(
            f"# Fault scenarios: upstream vs ours\n\nCommand (run from {os.getcwd()}):\n\n"
            f"    {command}\n\nRun at {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, "
            f"{N_ENV} workers per manager, per-run logs in {RUNS_DIR}/.\n\n{table}\n"
        )
