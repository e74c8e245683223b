"""Notice at once when the Unity player of a worker dies.

# NOTE [ Player death ]
# mlagents-envs notices that its Unity player died only when it next checks: it waits for each
# reply in slices of --timeout-wait / 10 seconds (6 s by default) and polls the process between
# slices. So a worker watches the players its env started (its children that lead a session of
# their own: that is how mlagents-envs starts builds) on pidfds, from a thread. If one exits
# while the env is inside ``reset`` or ``step``, the thread sends SIGUSR1 to its own process and
# the handler raises UnityEnvironmentException in the main thread, out of mlagents-envs' wait:
# the worker reports it at once and is restarted. Outside those calls nothing is raised
# asynchronously (an exception in the middle of sending a reply would corrupt the pipe): the
# next call finds the player dead and raises then. ``disarm`` (before ``env.close()``, when the
# player exits on purpose) stops it.
"""
import contextlib
import os
import select
import signal
import threading
from typing import Any, Iterator, List, Optional

import psutil
from mlagents_envs.exception import UnityEnvironmentException

from mlagents_plugin import processes


class PlayerWatch:
    def __init__(self) -> None:
        self.death: Optional[str] = None  # how a player ended, once one has
        self.in_env = False
        self.armed = False

    def start(self) -> List[int]:
        """Watch this process's session-leading children; return their pids."""
        players = [c.pid for c in psutil.Process().children() if _leads_session(c.pid)]
        if players:
            self.armed = True
            signal.signal(signal.SIGUSR1, self._interrupt)
            threading.Thread(target=self._watch, args=(players,), name="player-watch", daemon=True).start()
        return players

    def disarm(self) -> None:
        self.armed = False

    @contextlib.contextmanager
    def env_call(self) -> Iterator[None]:
        """Around a call into the env: a player's death raises in it."""
        self._raise_if_dead()
        self.in_env = True
        try:
            yield
        finally:
            self.in_env = False

    def _watch(self, players: List[int]) -> None:
        fds = {}
        for pid in players:
            try:
                fds[os.pidfd_open(pid)] = pid
            except ProcessLookupError:
                pass
        if not fds:
            return
        ready, _, _ = select.select(list(fds), [], [])
        pid = fds[ready[0]]
        self.death = f"The Unity player (pid {pid}) {processes.describe_exit(_exit_code(ready[0]))}."
        if self.armed and self.in_env:
            os.kill(os.getpid(), signal.SIGUSR1)

    def _interrupt(self, signum: int, frame: Any) -> None:
        if self.in_env:
            self._raise_if_dead()

    def _raise_if_dead(self) -> None:
        if self.armed and self.death is not None:
            raise UnityEnvironmentException(self.death)


def _leads_session(pid: int) -> bool:
    try:
        return os.getsid(pid) == pid
    except ProcessLookupError:
        return False


def _exit_code(pidfd: int) -> Optional[int]:
    """The exit code (negative: the signal) of the process behind ``pidfd``, without reaping
    it: the env's own ``Popen`` does that."""
    try:
        info = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOWAIT)
    except (ChildProcessError, OSError):
        return None
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
