"""The platform layer's hooks as the portable path has them: what every platform gets (NOTE
[ Portable core, Linux hardening ] in core/platform.py): a wait through
``multiprocessing.connection.wait``, nothing to take workers down if the supervisor is killed,
shared memory removed by name, the portable player watch. ``LinuxHardening``
(local/linux/hardening.py) overrides each hook; ``local/hardening.layer`` chooses between them.
"""
from typing import Optional

from mlagents_plugin.core import wire
from mlagents_plugin.local.player_watch import PlayerWatch
from mlagents_plugin.local.readiness import PortableReadiness, Readiness


class Hardening:
    """The platform's layer, each hook as the portable path has it."""

    hardened = False  # what the supervisor tells its workers

    def readiness(self) -> Readiness:
        """How the supervisor waits on its workers' pipes and sentinels."""
        return PortableReadiness()

    def watch_worker(self, pid: int) -> None:
        """Have worker ``pid`` taken down, with its tree, if this process is killed. Portable:
        nothing outside can; the worker finds its pipe closed (NOTE [ No orphans ])."""

    def remove_with_me(self, directory: str) -> None:
        """Have ``directory`` removed if this process is killed. Portable: nothing can."""

    def remove_segments(self, prefix: str, last_seen: Optional[str]) -> None:
        """Remove the shared memory a reaped worker incarnation left: its segments' names start
        with ``prefix``, and its replies last named ``last_seen`` (NOTE [ Step wire format ])."""
        for name in wire.departed_segments(prefix, last_seen):
            wire.unlink(name)

    def player_watch(self) -> PlayerWatch:
        """A worker's watch over its Unity players (NOTE [ Player death ])."""
        return PlayerWatch()
