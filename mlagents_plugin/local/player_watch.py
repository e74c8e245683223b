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

# NOTE [ Players die with their worker ]
# However a worker ends (SIGKILL, the OOM killer, a crash, a SIGKILL of the whole process
# group), the kernel kills its Unity players in the same instant: each player mlagents-envs
# launches in a worker runs with PR_SET_PDEATHSIG=SIGKILL. ``hook_launches`` gives
# mlagents-envs' ``launch_executable`` a ``subprocess`` whose Popen starts the player through
# die_with_parent.py, which sets the signal and execs the player in its place (same pid, same
# session). The signal survives that exec (not the exec of a set-uid program), needs no Python
# of ours to run in the worker or the player, and so also holds for a worker stuck in C code
# that holds the GIL. Why not a ``preexec_fn``: it makes Python fork (not vfork) and run code in
# the child, and the worker runs a gRPC server with its threads at that moment: 1 in 300 such
# children aborted (SIGABRT) in gRPC's fork handlers. The wrapper costs a Python start-up
# (tens of milliseconds) per player launch, against seconds for a build to start.
# Conditions, each checked:
# - The signal fires when the *thread* that started the player ends, not the process. Workers
#   build their env on their main thread (worker.py, ``_Worker.run``), which lives exactly as
#   long as the worker. A player launched from any other thread (an env factory that starts its
#   build from a thread of its own, which may end at any time) is launched as before, without.
# - The worker may die between the start of the wrapper and its prctl: the wrapper then finds
#   another parent than the worker, and exits without starting the player.
# - Linux only; and only a program mlagents-envs can run (else its own error is raised as before).
# The reaper and the sweep (NOTE [ No orphans ] in processes.py) stay the second line: they
# also take down processes a player starts itself, and players an env launches other than
# through mlagents-envs, which no parent-death signal covers.
"""
import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import types
from typing import Any, Callable, Iterator, List, Optional, Set

import psutil
from mlagents_envs import env_utils
from mlagents_envs.exception import UnityEnvironmentException

from mlagents_plugin.local import die_with_parent, processes

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
    process, and have the kernel kill each of them when this process dies (NOTE [ Players die
    with their worker ]). ``UnityEnvironment`` calls the module attribute
    ``env_utils.launch_executable``, which calls ``subprocess.Popen`` through its module's
    global ``subprocess``; ``integration.compat.INTERNALS`` lists both, so that the doctor checks
    they are still there. Only worker processes call this."""
    if not isinstance(getattr(env_utils, "subprocess", None), _PlayerSubprocess):
        env_utils.subprocess = _PlayerSubprocess()
    original = env_utils.launch_executable

    def launch_executable(file_name: str, args: List[str]) -> "subprocess.Popen[bytes]":
        process = original(file_name, args)
        on_launch(process, list(args))
        return process

    env_utils.launch_executable = launch_executable


class _PlayerSubprocess(types.ModuleType):
    """``subprocess`` as mlagents-envs' env_utils sees it in a worker: its Popen starts each
    player with a parent-death signal (NOTE [ Players die with their worker ])."""

    def __init__(self) -> None:
        super().__init__("subprocess")

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    @staticmethod
    def Popen(args: Any, *rest: Any, **kwargs: Any) -> "subprocess.Popen[Any]":  # noqa: N802 (subprocess's name)
        if not (kwargs.get("shell") or kwargs.get("executable")):
            args = with_parent_death_signal(args)
        return subprocess.Popen(args, *rest, **kwargs)


def with_parent_death_signal(command: Any) -> Any:
    """Popen's ``command``, to be run so that it gets SIGKILL when the calling thread ends, if
    that is this process's main thread, the system is Linux and the program can be run; else
    as it is (NOTE [ Players die with their worker ])."""
    if (
        not isinstance(command, (list, tuple))
        or not command
        or not sys.platform.startswith("linux")
        or not sys.executable
        or threading.current_thread() is not threading.main_thread()
        or os.sep not in str(command[0])  # a name for Popen to look up in PATH: left to it
        or not os.access(command[0], os.X_OK)  # mlagents-envs' own Popen says why it cannot run
    ):
        return command
    return [sys.executable, "-I", "-S", die_with_parent.__file__, str(os.getpid()), *command]


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
