"""The record of a run: the facts it found and the phase it is in, in a JSON file that the run
rewrites after every change, so that the parent can read it even when it has to kill the run."""
import json
import os
import time
from typing import Any, Dict


def record_path(run_dir: str) -> str:
    return os.path.join(run_dir, "report.json")


class RunRecord:
    """The run's side: writes the record."""

    def __init__(self, run_dir: str):
        self.path = record_path(run_dir)
        self.data: Dict[str, Any] = {
            "facts": [],
            "phase": "starting",
            "phase_at": time.time(),
            "last_return": None,  # when get_steps last returned
            "worker_pids": [],
            "returned_at": None,  # when the scenario function returned
            "grep_console": None,  # a string the parent looks for in the run's console output
        }
        self.save()

    def fact(self, text: str) -> None:
        self.data["facts"].append(text)
        self.save()

    def phase(self, name: str) -> None:
        self.data["phase"], self.data["phase_at"] = name, time.time()
        self.save()

    def save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f)
        os.replace(tmp, self.path)


def read_record(run_dir: str) -> Dict[str, Any]:
    """The parent's side: the record as last saved."""
    try:
        with open(record_path(run_dir)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"facts": [], "phase": "not started", "phase_at": None}


def first_line(text: str, limit: int = 170) -> str:
    lines = str(text).strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def describe_exception(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {first_line(str(exc))}"
