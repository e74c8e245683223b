"""What a supervising process and its workers do beyond the portable core: the platform's layer.

``Hardening`` is the portable path, what every platform gets (NOTE [ Portable core, Linux
hardening ] in core/platform.py): a wait through ``multiprocessing.connection.wait``, nothing to
take workers down if the supervisor is killed, shared memory removed by name, the portable
player watch. ``LinuxHardening`` (local/linux/hardening.py, imported only on Linux) overrides each
hook. The supervisor picks the layer once (``layer(platform.hardened())``) and tells its workers
which (``WorkerSpec.hardened``), so that both sides of a pipe take the same path.
"""
import sys
from typing import Optional

from mlagents_plugin.core import wire
from mlagents_plugin.local.player_watch import PlayerWatch
from mlagents_plugin.local.readiness import PortableReadiness, Readiness


class Hardening:
    hardened = False  # what WorkerSpec.hardened tells the workers

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


def layer(hardened: bool) -> Hardening:
    """The Linux hardening where asked for and available, else the portable path."""
    if sys.platform == "linux" and hardened:
        from mlagents_plugin.local.linux.hardening import LinuxHardening

        return LinuxHardening()
    return Hardening()
