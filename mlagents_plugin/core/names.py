"""How workers, commands and forced kills are named in messages: one place, so that every log
line and error says them the same way."""
from typing import Optional

from mlagents_plugin.core.placement import Placement
from mlagents_plugin.core.protocol import EnvironmentCommand


def worker_label(worker_id: int, pid: Optional[int], placement: Optional[Placement] = None) -> str:
    """``env worker 2 (pid 1234)``, with its Ray actor and node when it has one."""
    if placement is not None and placement.actor_pid is not None:
        node_id = (placement.node_id or "")[:8]
        return (
            f"env worker {worker_id} (pid {pid}, in Ray actor pid {placement.actor_pid} on "
            f"node {placement.node} {node_id})"
        )
    if pid is None:
        return f"env worker {worker_id} (not started yet)"
    return f"env worker {worker_id} (pid {pid})"


def command_name(command: Optional[EnvironmentCommand]) -> str:
    """A worker's last command, or that it had none yet."""
    return command.name if command is not None else "none yet: it was starting"


def zombie_report(label: str, why: str, last_command: Optional[EnvironmentCommand], action: str) -> str:
    """The warning logged whenever a worker has to be forced down: a bug worth seeing."""
    return f"Zombie worker report: {label} {why} (last command: {command_name(last_command)}); {action}."
