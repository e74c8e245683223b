"""Finding the processes a run started: every one inherits the run's tag in its environment, and
the stand-in "players" of PlayerLaunchingEnvironment, which run in a session of their own, also
leave a file named by their pid in the run's ``players/`` folder."""
import os
from typing import Any, List, Optional

import psutil

from mlagents_plugin.local.processes import every_process

TAG_ENV = "COMPARE_FAULTS_TAG"  # inherited by every process a run starts


def players_dir(run_dir: str) -> str:
    return os.path.join(run_dir, "players")


def player_pids(run_dir: str) -> List[int]:
    folder = players_dir(run_dir)
    return sorted(int(name) for name in os.listdir(folder)) if os.path.isdir(folder) else []


def living_process(pid: int) -> Optional[Any]:
    """The process ``pid``, or None if it is gone or a zombie."""
    try:
        proc = psutil.Process(pid)
        return proc if proc.status() != psutil.STATUS_ZOMBIE else None
    except psutil.Error:
        return None


def tagged_processes(tag: str) -> List[Any]:
    found = []
    for proc in every_process():
        try:
            if proc.environ().get(TAG_ENV) == tag and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def kill_and_wait(procs: List[Any]) -> None:
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=5)
