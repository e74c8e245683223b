"""Process bookkeeping: finding a worker's descendants, killing them, naming how a process ended.

# NOTE [ No orphans ]
# mlagents-envs starts each Unity player with ``start_new_session=True``: the player is in its
# own session and process group, so neither killing the worker's process group nor a terminal's
# Ctrl-C reaches it, and once the worker is gone the player is re-parented to init and nothing
# links it to us any more. Three mechanisms together make sure no player outlives its worker:
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
# 3. A parent watchdog in each worker (``watch_parent``). If the trainer itself is SIGKILLed,
#    nobody is left to run 1 or 2, so each worker waits on a pidfd of the trainer (no polling)
#    and, when it becomes readable, kills its own tagged descendants and exits: players are
#    gone within a fraction of a second.
#
# A Linux child subreaper (prctl PR_SET_CHILD_SUBREAPER) was the alternative to 1: it would
# re-parent orphans to the trainer, but it cannot help when the trainer itself dies, it makes
# the trainer responsible for reaping every orphan of every library it loads, and it is
# Linux-only in the same way without covering more cases.
"""
import os
import select
import signal
import threading
from typing import Callable, Iterable, List, Optional

import psutil

OWNER_ENV = "MLAGENTS_PLUGIN_OWNER"
# How long a leftover process (a player whose worker is gone) gets between SIGTERM and SIGKILL.
LEFTOVER_GRACE_S = 0.5

_SIGNAL_HINTS = {
    signal.SIGKILL: "out of memory? The kernel's OOM killer sends SIGKILL (check `dmesg`)",
    signal.SIGSEGV: "a crash in native code: the env, a Unity plugin or a C extension",
    signal.SIGABRT: "an abort in native code",
    signal.SIGBUS: "a crash in native code (bus error)",
    signal.SIGTERM: "another process asked it to stop",
}


def describe_exit(exitcode: Optional[int]) -> str:
    """Say how a process ended, in words a user can act on."""
    if exitcode is None:
        return "is still running"
    if exitcode >= 0:
        return f"exited with code {exitcode}"
    try:
        sig = signal.Signals(-exitcode)
    except ValueError:
        return f"was killed by signal {-exitcode}"
    hint = _SIGNAL_HINTS.get(sig)
    return f"was killed by {sig.name}" + (f": {hint}" if hint else "")


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
