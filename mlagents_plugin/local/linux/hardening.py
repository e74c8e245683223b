"""The Linux hardening: one epoll set, the reaper (reaper_client.py), /dev/shm listing, the Linux player watch.

See NOTE [ Portable core, Linux hardening ] in core/platform.py for what it adds to the portable
path, and NOTE [ No orphans ] in local/processes.py for why.
"""
import os
import sys
from multiprocessing import resource_tracker
from typing import List, Optional

from mlagents_envs import logging_util

from mlagents_plugin.local.linux import reaper as reaper_script
from mlagents_plugin.local.linux import reaper_client
from mlagents_plugin.local.player_watch import PlayerWatch
from mlagents_plugin.local.portable import Hardening
from mlagents_plugin.local.readiness import EpollReadiness, Readiness

assert sys.platform == "linux"

logger = logging_util.get_logger(__name__)

SHM_DIR = reaper_script.SHM_DIR  # where Linux keeps POSIX shared memory


class LinuxHardening(Hardening):
    hardened = True

    def readiness(self) -> Readiness:
        return EpollReadiness()

    def watch_worker(self, pid: int) -> None:
        reaper_client.reaper.watch_worker(pid)

    def remove_with_me(self, directory: str) -> None:
        reaper_client.reaper.remove_with_me(directory)

    def remove_segments(self, prefix: str, last_seen: Optional[str]) -> None:
        remove_segments(prefix)

    def player_watch(self) -> PlayerWatch:
        from mlagents_plugin.local.linux.players import LinuxPlayerWatch

        return LinuxPlayerWatch()


def remove_segments(prefix: str, ours: bool = True) -> List[str]:
    """Unlink every segment whose name starts with ``prefix``; return their names.

    ``ours``: they were created by this manager's workers, which share this process's
    multiprocessing resource tracker (every start method passes it on). The tracker would
    unlink them again at exit, and warn about a leak, so they are forgotten there too. The file
    is unlinked directly: attaching first would register it with the tracker once more, and a
    worker closing at the same moment could leave that registration behind.
    """
    removed = []
    for name in _segment_names(prefix):
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except FileNotFoundError:
            continue  # its worker removed it (and told the tracker) first
        if ours:
            resource_tracker.unregister("/" + name, "shared_memory")
        removed.append(name)
    return removed


def _segment_names(prefix: str) -> List[str]:
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix))
    except FileNotFoundError:
        return []
