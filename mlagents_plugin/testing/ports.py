"""Free TCP ports for tests, demos and benchmarks: one bounded search, shared by all of them."""
import os
import random
import socket
from typing import Optional

ATTEMPTS = 200


def free_port_block(size: int, start: Optional[int] = None) -> int:
    """The first of ``size`` consecutive ports free on loopback: the first block from ``start``
    upwards, or (no ``start``) a random one in 20000-60000, so that parallel tests rarely meet.
    A port taken between this check and its use makes mlagents-envs raise
    UnityWorkerInUseException, which the manager answers by moving to another port. Raises
    RuntimeError after ATTEMPTS blocks."""
    rng = random.Random(os.getpid() ^ int.from_bytes(os.urandom(4), "little"))
    for attempt in range(ATTEMPTS):
        base = start + attempt * size if start is not None else rng.randrange(20000, 60000 - size)
        try:
            for port in range(base, base + size):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no block of {size} free ports in {ATTEMPTS} tries")
