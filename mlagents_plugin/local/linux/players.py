"""The Linux player watch: pidfds, SIGUSR1, and players that die with their worker.

``LinuxPlayerWatch`` is the portable watch (NOTE [ Player death ] in local/player_watch.py) with
three differences: it waits on pidfds, without reaping, so it can also watch players an env
started by other means (any child of the worker that leads a session of its own); it wakes the
main thread with SIGUSR1, which interrupts a blocking call at once, the handshake's included; and
each player mlagents-envs launches runs with a parent-death signal.

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
# - Only a program mlagents-envs can run (else its own error is raised as before).
# The reaper and the sweep (NOTE [ No orphans ] in processes.py) stay the second line: they
# also take down processes a player starts itself, and players an env launches other than
# through mlagents-envs, which no parent-death signal covers.
"""
import os
import select
import signal
import subprocess
import sys
import threading
import types
from typing import Any, Optional

import psutil
from mlagents_envs import env_utils

from mlagents_plugin.local.linux import die_with_parent
from mlagents_plugin.local.player_watch import ExitWait, PlayerWatch

assert sys.platform == "linux"


class LinuxPlayerWatch(PlayerWatch):
    def _install_wake_up(self) -> None:
        signal.signal(signal.SIGUSR1, self._interrupt)

    def _wake_main_thread(self) -> None:
        os.kill(os.getpid(), signal.SIGUSR1)

    def _exit_wait(self, process: "subprocess.Popen[bytes]") -> Optional[ExitWait]:
        return _pidfd_wait(process.pid)

    def hook_launches(self) -> None:
        """The portable hook, and every player launched with a parent-death signal (NOTE above).
        mlagents-envs' ``launch_executable`` calls ``subprocess.Popen`` through its module's
        global ``subprocess``, which compat.INTERNALS lists too."""
        if not isinstance(getattr(env_utils, "subprocess", None), _PlayerSubprocess):
            env_utils.subprocess = _PlayerSubprocess()
        super().hook_launches()

    def watch_other_players(self) -> None:
        for child in psutil.Process().children():
            if child.pid not in self.watched and _leads_session(child.pid):
                wait = _pidfd_wait(child.pid)
                if wait is not None:
                    self.watch(child.pid, wait)


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
    that is this process's main thread and the program can be run; else as it is (NOTE
    [ Players die with their worker ])."""
    if (
        not isinstance(command, (list, tuple))
        or not command
        or not sys.executable
        or threading.current_thread() is not threading.main_thread()
        or os.sep not in str(command[0])  # a name for Popen to look up in PATH: left to it
        or not os.access(command[0], os.X_OK)  # mlagents-envs' own Popen says why it cannot run
    ):
        return command
    return [sys.executable, "-I", "-S", die_with_parent.__file__, str(os.getpid()), *command]


def _pidfd_wait(pid: int) -> Optional[ExitWait]:
    """A wait for ``pid``'s exit on a pidfd, which leaves the exit status to the env's own
    ``Popen``; None if ``pid`` is gone already."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None

    def wait() -> Optional[int]:
        select.select([fd], [], [])
        try:
            return _exit_code(fd)
        finally:
            os.close(fd)

    return wait


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
