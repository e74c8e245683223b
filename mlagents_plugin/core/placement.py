"""Where a worker runs: what a backend reports and ``manager.placements`` shows."""
from typing import NamedTuple, Optional


class Placement(NamedTuple):
    """Where a worker runs: ``manager.placements[worker_id]``."""

    worker_id: int
    pid: Optional[int]  # the env worker process (None until it has reported)
    node: str  # "localhost", or the Ray node's address
    node_id: Optional[str] = None  # the Ray node's id
    actor_pid: Optional[int] = None  # the Ray actor hosting the worker process
