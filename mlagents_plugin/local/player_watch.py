"""Notice at once when the Unity player of a worker dies.

# NOTE [ Player death ]
# mlagents-envs notices that its Unity player died only when it next checks: it waits for each
# reply in slices of --timeout-wait / 10 seconds (6 s by default) and polls the process between
# slices, and between the two calls of the handshake it does not check at all (a build that dies
# there leaves it waiting forever). So a worker watches its players on pidfds, from a thread:
# each player mlagents-envs launches, from the moment it is launched (``hook_launches`` wraps
# mlagents-envs' ``launch_executable``), and, once the env is built, any other child of the
# worker that leads a session of its own (how an env starts a build by other means). If one
# exits while the env is inside its factory, ``reset`` or ``step``, the thread sends SIGUSR1 to
# its own process and the handler raises UnityEnvironmentException in the main thread, out of
# mlagents-envs' wait, with how the player ended and the end of its log: the worker reports it
# at once and is restarted. Outside those calls nothing is raised asynchronously (an exception
# in the middle of sending a reply would corrupt the pipe): the next call finds the player dead
# and raises then. ``disarm`` (before ``env.close()``, when the player exits on purpose) stops it.
"""
import contextlib
import os
import select
import signal
import subprocess
import threading
from typing import Any, Callable, Iterator, List, Optional, Set

import psutil
from mlagents_envs import env_utils
from mlagents_envs.exception import UnityEnvironmentException

from mlagents_plugin.local import processes

LOG_TAIL_LINES = 10


class PlayerWatch:
    def __init__(self) -> None:
        self.death: Optional[str] = None  # how a player ended, once one has
        self.in_env = False
        self.armed = True
        self.watched: Set[int] = set()
        signal.signal(signal.SIGUSR1, self._interrupt)

    def watch(self, pid: int, log_file: Optional[str] = None) -> None:
        """Watch player ``pid`` from now on; ``log_file`` is where it logs (its -logFile)."""
        if pid in self.watched:
            return
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        self.watched.add(pid)
        threading.Thread(
            target=self._wait, args=(pid, fd, log_file), name=f"player-watch-{pid}", daemon=True
        ).start()

    def watch_launch(self, process: "subprocess.Popen[bytes]", args: List[str]) -> None:
        """What ``hook_launches`` calls for each player mlagents-envs launches."""
        log_file = args[args.index("-logFile") + 1] if "-logFile" in args[:-1] else None
        self.watch(process.pid, log_file)

    def watch_other_players(self) -> None:
        """Once the env is built: watch this process's other session-leading children."""
        for child in psutil.Process().children():
            if _leads_session(child.pid):
                self.watch(child.pid)

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

    def _wait(self, pid: int, fd: int, log_file: Optional[str]) -> None:
        select.select([fd], [], [])
        if self.death is None:
            self.death = f"The Unity player (pid {pid}) {processes.describe_exit(_exit_code(fd))}."
            tail = _log_tail(log_file)
            if tail:
                self.death += f" The end of its log ({log_file}):\n{tail}"
        if self.armed and self.in_env:
            os.kill(os.getpid(), signal.SIGUSR1)

    def _interrupt(self, signum: int, frame: Any) -> None:
        if self.in_env:
            self._raise_if_dead()

    def _raise_if_dead(self) -> None:
        if self.armed and self.death is not None:
            raise UnityEnvironmentException(self.death)


def hook_launches(on_launch: Callable[["subprocess.Popen[bytes]", List[str]], None]) -> None:
    """Call ``on_launch(process, args)`` for every player mlagents-envs launches in this
    process. ``UnityEnvironment`` calls the module attribute ``env_utils.launch_executable``;
    ``integration.compat.INTERNALS`` lists it, so that the doctor checks it is still there."""
    original = env_utils.launch_executable

    def launch_executable(file_name: str, args: List[str]) -> "subprocess.Popen[bytes]":
        process = original(file_name, args)
        on_launch(process, list(args))
        return process

    env_utils.launch_executable = launch_executable


def _log_tail(log_file: Optional[str]) -> str:
    if not log_file:
        return ""
    try:
        with open(log_file, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            lines = f.read().decode(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    except OSError:
        return ""
    return "\n".join("  " + line for line in lines)


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
