"""Notice at once when the Unity player of a worker dies.

# NOTE [ Player death ]
# mlagents-envs notices that its Unity player died only when it next checks: it waits for each
# reply in slices of --timeout-wait / 10 seconds (6 s by default) and polls the process between
# slices, and between the two calls of the handshake it does not check at all (a build that dies
# there leaves it waiting forever). So a worker watches each player mlagents-envs launches, from
# the moment it is launched (``hook_launches`` wraps mlagents-envs' ``launch_executable``), from a
# thread. If one exits while the env is inside its factory, ``reset`` or ``step``, the thread
# wakes the main thread, whose signal handler raises UnityEnvironmentException there, out of
# mlagents-envs' wait, with how the player ended and the end of its log: the worker reports it at
# once and is restarted. Outside those calls nothing is raised asynchronously (an exception in
# the middle of sending a reply would corrupt the pipe): the next call finds the player dead and
# raises then. ``disarm`` (before ``env.close()``, when the player exits on purpose) stops it.
#
# How the thread waits, and how it wakes the main thread, is the platform's. This portable watch
# waits in the player's own ``Popen.wait`` and sends the main thread a SIGINT, which the worker
# handles here and otherwise ignores (NOTE [ Worker signals ]): on Linux and macOS with
# ``pthread_kill``, whose signal interrupts the main thread's wait at once; on Windows with
# ``raise_signal``, whose SIGINT sets the event that Python's waits in the main thread watch.
# The Linux watch (local/linux/players.py) waits on pidfds, also watches players an env started
# by other means, and has the kernel kill each player with its worker.
"""
import contextlib
import os
import signal
import subprocess
import sys
import threading
from typing import Any, Callable, Iterator, List, Optional, Set

from mlagents_envs import env_utils
from mlagents_envs.exception import UnityEnvironmentException

from mlagents_plugin.local import processes

LOG_TAIL_LINES = 10

ExitWait = Callable[[], Optional[int]]  # blocks until a player exits; its exit code, if known


class PlayerWatch:
    def __init__(self) -> None:
        self.death: Optional[str] = None  # how a player ended, once one has
        self.in_env = False
        self.armed = True
        self.watched: Set[int] = set()
        self._install_wake_up()

    # ------------------------------------------------------------- the platform's part

    def _install_wake_up(self) -> None:
        """Route the thread's wake-up to ``_interrupt`` in the main thread."""
        signal.signal(signal.SIGINT, self._interrupt)

    def _wake_main_thread(self) -> None:
        if sys.platform == "win32":
            signal.raise_signal(signal.SIGINT)
        else:
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    def _exit_wait(self, process: "subprocess.Popen[bytes]") -> Optional[ExitWait]:
        """How to wait for a launched player's exit (None: it cannot be watched)."""
        return process.wait

    def hook_launches(self) -> None:
        """Watch every player mlagents-envs launches in this process from now on.
        ``UnityEnvironment`` calls the module attribute ``env_utils.launch_executable``
        (integration/compat.INTERNALS lists it, so that the doctor checks it is still there).
        Only worker processes call this."""
        original = env_utils.launch_executable

        def launch_executable(file_name: str, args: List[str]) -> "subprocess.Popen[bytes]":
            process = original(file_name, args)
            self.watch_launch(process, list(args))
            return process

        env_utils.launch_executable = launch_executable

    def watch_other_players(self) -> None:
        """Once the env is built: watch players it started by other means (Linux only)."""

    # ------------------------------------------------------------------------ the rest

    def watch_launch(self, process: "subprocess.Popen[bytes]", args: List[str]) -> None:
        """Watch a player mlagents-envs launched with ``args``."""
        log_file = args[args.index("-logFile") + 1] if "-logFile" in args[:-1] else None
        if process.pid not in self.watched:
            wait = self._exit_wait(process)
            if wait is not None:
                self.watch(process.pid, wait, log_file)

    def watch(self, pid: int, wait: ExitWait, log_file: Optional[str] = None) -> None:
        """Watch player ``pid`` from now on; ``log_file`` is where it logs (its -logFile)."""
        self.watched.add(pid)
        threading.Thread(
            target=self._wait, args=(pid, wait, log_file), name=f"player-watch-{pid}", daemon=True
        ).start()

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

    def _wait(self, pid: int, wait: ExitWait, log_file: Optional[str]) -> None:
        exit_code = wait()
        if self.death is None:
            self.death = f"The Unity player (pid {pid}) {processes.describe_exit(exit_code)}."
            tail = _log_tail(log_file)
            if tail:
                self.death += f" The end of its log ({log_file}):\n{tail}"
        if self.armed and self.in_env:
            self._wake_main_thread()

    def _interrupt(self, signum: int, frame: Any) -> None:
        if self.in_env:
            self._raise_if_dead()

    def _raise_if_dead(self) -> None:
        if self.armed and self.death is not None:
            raise UnityEnvironmentException(self.death)


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
