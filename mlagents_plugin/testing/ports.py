"""Free TCP ports for tests, demos and benchmarks: one bounded search, shared by all of them."""
import errno
import os
import random
import socket
from typing import Optional

ATTEMPTS = 200


def free_port_block(size: int, start: Optional[int] = None) -> int:
    """The first of ``size`` consecutive ports free on loopback (IPv4 and IPv6): the first block
    from ``start`` upwards, or (no ``start``) a random one in 20000-60000, so that parallel tests
    rarely meet.
    A port taken between this check and its use makes mlagents-envs raise
    UnityWorkerInUseException, which the manager answers by moving to another port. Raises
    RuntimeError after ATTEMPTS blocks."""
    rng = random.Random(os.getpid() ^ int.from_bytes(os.urandom(4), "little"))
    for attempt in range(ATTEMPTS):
        base = start + attempt * size if start is not None else rng.randrange(20000, 60000 - size)
        if all(_free(port) for port in range(base, base + size)):
            return base
    raise RuntimeError(f"no block of {size} free ports in {ATTEMPTS} tries")


def _free(port: int) -> bool:
    """Free on 127.0.0.1, and on ::1 where this machine has it (a worker listens on both)."""
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            with socket.socket(family) as s:
                s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE or family == socket.AF_INET:
                return False
            # no IPv6 loopback here: nothing can hold it
    return True
