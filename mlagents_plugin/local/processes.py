"""Process bookkeeping: finding a worker's descendants, killing them, naming how a process ended.

# NOTE [ No orphans ]
# mlagents-envs starts each Unity player with ``start_new_session=True``: the player is in its
# own session and process group, so neither killing the worker's process group nor a terminal's
# Ctrl-C reaches it, and once the worker is gone the player is re-parented to init and nothing
# links it to us any more. Four mechanisms together make sure that nothing a worker started
# outlives its supervisor (the trainer, or a Ray actor), however the supervisor ends:
#
# 1. Tagging. Before it builds its env, every worker puts ``MLAGENTS_PLUGIN_OWNER=<tag>`` into
#    its environment. Every process it execs from then on (the player, and the player's own
#    children) inherits it, and ``/proc/<pid>/environ`` keeps showing it whoever the parent is
#    later. ``find_tagged`` scans for it with psutil. This is what finds a player after its
#    worker was SIGKILLed or died on its own, with no help from the dead worker.
# 2. Snapshots. A process forked without exec (e.g. an env using multiprocessing's fork) keeps
#    its parent's *initial* environ, so it carries no tag. Before the shutdown ladder signals a
#    live worker it takes ``psutil.Process(pid).children(recursive=True)``, and once the worker
#    is reaped it kills what is left of those, and of the worker's tag (``kill_leftovers``).
# 3. The reaper (reaper.py). If the supervisor itself is killed, nobody is left to run 1 or 2,
#    and a watchdog inside each worker is no answer: a worker stuck in C code that holds the GIL
#    never runs it, and a SIGKILL of the whole process group (``timeout -s KILL``, a cancelled
#    CI job, an SSH hangup) takes the workers down with the supervisor while the players, in
#    sessions of their own, run on. (A Ray actor's death is no better: Ray kills the actor's
#    children, the worker among them, but not the player, a grandchild.) So each supervising
#    process starts one small stdlib-only process in a session of its own, out of reach of the
#    group's signals, and nobody's child (it forks away from its launcher, so that whoever kills
#    the supervisor's children spares it), and tells it the pid of every worker it starts. The
#    reaper waits on a pidfd of the supervisor (no polling) and, when it is gone, SIGKILLs those
#    workers with their process trees and everything carrying the supervisor's tag, removes its
#    shared memory segments and Ray temp dir, and exits.
# 4. The sweep. When a reaper starts, it first removes what supervisors that are gone left
#    behind (tagged processes, segments, Ray temp dirs): the second line, for a reaper that was
#    itself killed.
#
# The first line, before all four, is the kernel's: each player mlagents-envs launches in a
# worker gets a parent-death signal (PR_SET_PDEATHSIG=SIGKILL), so it dies in the instant its
# worker does, however the worker ends (NOTE [ Players die with their worker ] in
# player_watch.py). It does not cover the player's own children, players an env launches by
# other means, or the workers themselves, which is why 1 to 4 stay.
#
# A Linux child subreaper (prctl PR_SET_CHILD_SUBREAPER) was the alternative to 1: it would
# re-parent orphans to the trainer, but it cannot help when the trainer itself dies. A parent-
# death signal on each worker would kill a worker stuck in C code, but under forkserver a
# worker's parent is the fork server, not the trainer, and the reaper (3) already does it.
"""
import os
import select
import signal
import subprocess
import sys
import threading
from typing import IO, Callable, Iterable, List, Optional

import psutil
from mlagents_envs import logging_util

from mlagents_plugin.local import reaper as reaper_script

logger = logging_util.get_logger(__name__)

OWNER_ENV = "MLAGENTS_PLUGIN_OWNER"
assert OWNER_ENV.encode() + b"=" == reaper_script.OWNER_ENV
# How long a leftover process (a player whose worker is gone) gets between SIGTERM and SIGKILL.
LEFTOVER_GRACE_S = 0.5

_SIGNAL_HINTS = {
    signal.SIGKILL: "out of memory? The kernel's OOM killer sends SIGKILL (check `dmesg`)",
    signal.SIGSEGV: "a crash in native code: the env, a Unity plugin or a C extension",
    signal.SIGABRT: "an abort in native code",
    signal.SIGBUS: "a crash in native code (bus error)",
    signal.SIGTERM: "another process asked it to stop",
}


def describe_exit(exitcode: Optional[int], hint: bool = True) -> str:
    """Say how a process ended, in words a user can act on (``hint``: and what may have done it)."""
    if exitcode is None:
        return "is still running"
    if exitcode >= 0:
        return f"exited with code {exitcode}"
    try:
        sig = signal.Signals(-exitcode)
    except ValueError:
        return f"was killed by signal {-exitcode}"
    why = _SIGNAL_HINTS.get(sig) if hint else None
    return f"was killed by {sig.name}" + (f": {why}" if why else "")


def tag_this_process(tag: str) -> None:
    """Mark every process started from now on as belonging to ``tag`` (NOTE [ No orphans ])."""
    os.environ[OWNER_ENV] = tag


def find_tagged(prefix: str) -> List[psutil.Process]:
    """Live processes whose owner tag starts with ``prefix``, this process excluded."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            tag = proc.environ().get(OWNER_ENV)
        except (psutil.Error, OSError):
            continue
        if tag is not None and tag.startswith(prefix):
            found.append(proc)
    return found


def descendants(pid: int) -> List[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def kill_processes(procs: Iterable[psutil.Process], grace_s: float) -> List[psutil.Process]:
    """SIGTERM, wait up to ``grace_s``, SIGKILL what is left; return the ones that had to be killed."""
    procs = list(procs)
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    return alive


def kill_leftovers(owner_tag: str, known: Iterable[psutil.Process] = ()) -> List[psutil.Process]:
    """Kill what a reaped worker left running: its tagged processes, and ``known`` ones.

    Returns what was found alive, for the caller to report.
    """
    found = {p.pid: p for p in find_tagged(owner_tag)}
    for proc in known:
        try:
            if proc.is_running():  # also false if the pid was reused since the snapshot
                found.setdefault(proc.pid, proc)
        except psutil.Error:
            pass
    kill_processes(found.values(), LEFTOVER_GRACE_S)
    return list(found.values())


def watch_parent(pid: int, on_death: Callable[[], None]) -> None:
    """Call ``on_death`` from a daemon thread as soon as process ``pid`` is gone.

    Uses a pidfd, which becomes readable when the process exits: no polling. ``pid`` must be
    the trainer, not ``os.getppid()``: under forkserver the parent is the fork server.
    """
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        on_death()
        return

    def wait() -> None:
        select.select([fd], [], [])
        on_death()

    threading.Thread(target=wait, name="parent-watchdog", daemon=True).start()


def owner_prefix(supervisor_pid: int) -> str:
    """The start of the tags of every worker a supervising process starts (NOTE [ No orphans ])."""
    return f"{reaper_script.OWNER_ROOT}{supervisor_pid}-"


class Reaper:
    """This process's reaper (NOTE [ No orphans ], 3.), started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stdin: Optional[IO[bytes]] = None
        self._for_pid = 0  # the process it watches: a fork of this one needs its own

    def watch_worker(self, pid: int) -> None:
        """Have the reaper take ``pid`` down, with its tree, if this process is killed."""
        self._tell(f"worker {pid} {reaper_script.starttime(pid) or 0}")

    def remove_with_me(self, directory: str) -> None:
        """Have the reaper remove ``directory`` if this process is killed."""
        self._tell(f"dir {directory}")

    def _tell(self, line: str) -> None:
        with self._lock:
            for _ in range(2):  # a reaper that was killed is replaced, once
                if self._stdin is None or self._for_pid != os.getpid():
                    self._stdin = self._start()
                try:
                    self._stdin.write((line + "\n").encode())
                    self._stdin.flush()
                    return
                except OSError:
                    self._stdin = None
            logger.warning("Could not start a reaper: if this process is killed, its workers' "
                           "players may outlive it until the next run's sweep.")

    def _start(self) -> IO[bytes]:
        me = os.getpid()
        segments = f"{reaper_script.SEGMENT_ROOT}{me}_"  # wire.py names segments so
        launcher = subprocess.Popen(
            [sys.executable, "-I", "-S", reaper_script.__file__, str(me), owner_prefix(me), segments],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # out of reach of signals to our process group
        )
        launcher.wait()  # it forks the reaper and exits at once (reaper.py)
        assert launcher.stdin is not None
        self._for_pid = me
        return launcher.stdin


reaper = Reaper()  # this process's (a fork of it starts its own on first use)
