"""Which path this machine takes: the portable core alone, or with the Linux hardening on top.

# NOTE [ Portable core, Linux hardening ]
# The manager, the worker, the wire format and the shutdown ladder use only what Python offers on
# Linux, macOS and Windows alike: pipes and process sentinels waited on with
# ``multiprocessing.connection.wait``, ``multiprocessing.shared_memory``, psutil for process trees,
# owner tags and kills, factories that survive spawn. That is the portable path, and all of it
# that macOS and Windows run.
# On Linux a hardening layer goes on top (local/linux/, imported only there): the fork server
# (workers start with their imports done), one epoll set instead of a poll set per wait, pidfds
# that wake a worker the instant its Unity player dies, players that the kernel kills with their
# worker (PR_SET_PDEATHSIG), a reaper that cleans up after a SIGKILLed trainer, and the sweep of
# /proc and /dev/shm for what an earlier run left. docs/platforms.md says, fault by fault, what
# each path guarantees and how it is tested.
# ``MLAGENTS_PLUGIN_PORTABLE=1`` takes the portable path on Linux too, so that CI runs exactly
# what macOS and Windows run. The ``Env manager:`` start line names the path in force.
"""
import multiprocessing
import os
import sys
from typing import Tuple

PORTABLE_ENV = "MLAGENTS_PLUGIN_PORTABLE"


def hardened() -> bool:
    """Whether this process takes the Linux hardening (NOTE above)."""
    return sys.platform == "linux" and os.environ.get(PORTABLE_ENV, "") not in ("1", "true", "yes")


def path_name() -> str:
    """The path in force, as the start line and the doctor say it."""
    return "Linux hardening" if hardened() else f"portable ({sys.platform})"


def start_methods() -> Tuple[str, ...]:
    """The start methods this operating system has (Windows: spawn only)."""
    return tuple(multiprocessing.get_all_start_methods())


def default_start_method() -> str:
    """forkserver with the hardening (NOTE [ Worker start-up ]); spawn, as macOS and Windows
    default to, on the portable path."""
    return "forkserver" if hardened() else "spawn"
