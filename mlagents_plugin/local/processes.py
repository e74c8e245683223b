"""Process bookkeeping: finding a worker's descendants, killing them, naming how a process ended.

# NOTE [ No orphans ]
# mlagents-envs starts each Unity player with ``start_new_session=True``: the player is in its
# own session and process group, so neither killing the worker's process group nor a terminal's
# Ctrl-C reaches it, and once the worker is gone the player is re-parented to init and nothing
# links it to us any more. Two mechanisms, on every platform, make sure that nothing a worker
# started outlives it while its supervisor (the trainer, or a Ray actor) runs:
#
# 1. Tagging. Before it builds its env, every worker puts ``MLAGENTS_PLUGIN_OWNER=<tag>`` into
#    its environment. Every process it execs from then on (the player, and the player's own
#    children) inherits it, and psutil reads it back (``Process.environ``) whoever the parent is
#    later. ``find_tagged`` scans for it. This is what finds a player after its worker was
#    SIGKILLed or died on its own, with no help from the dead worker.
# 2. Snapshots. A process forked without exec (e.g. an env using multiprocessing's fork) keeps
#    its parent's *initial* environ, so it carries no tag. Before the shutdown ladder signals a
#    live worker it takes ``psutil.Process(pid).children(recursive=True)``, and once the worker
#    is reaped it kills what is left of those, and of the worker's tag (``kill_leftovers``).
#
# A supervisor that is killed runs neither. On the portable path a worker then notices that its
# pipe is closed as soon as it next reads or writes it, and closes its env and its player on the
# way out; a worker stuck in an env call, or killed together with its supervisor (a SIGKILL of
# the whole process group), leaves its player running (docs/platforms.md). The Linux hardening
# closes that gap three ways (local/linux/): the kernel kills each player the instant its worker
# dies (PR_SET_PDEATHSIG, NOTE [ Players die with their worker ]); each supervisor's reaper, a
# process of its own session, kills its workers and everything carrying its tag when the
# supervisor is gone (NOTE [ The reaper ]); and a new reaper first sweeps what supervisors that
# are gone left behind, for a reaper that was itself killed.
"""
import multiprocessing.util
import os
import signal
import tempfile
from typing import Iterable, Iterator, List, Optional

import psutil
from mlagents_envs import logging_util

logger = logging_util.get_logger(__name__)

OWNER_ENV = "MLAGENTS_PLUGIN_OWNER"
OWNER_ROOT = "mlagents-plugin/"  # + supervisor pid + "-" + token + "/" + worker id + "." + incarnation + "/"
# Directories a supervisor makes for itself (Ray's temp dir), + supervisor pid + "-": short, as
# Ray's socket paths must fit in 107 bytes; the Linux reaper removes them if their maker is gone.
DIR_ROOT = "/tmp/mlap-ray-"
# How long a leftover process (a player whose worker is gone) gets between SIGTERM and SIGKILL.
LEFTOVER_GRACE_S = 0.5

# By name: Windows has none of SIGKILL, SIGBUS.
_SIGNAL_HINTS = {
    "SIGKILL": "out of memory? The kernel's OOM killer sends SIGKILL (check `dmesg`)",
    "SIGSEGV": "a crash in native code: the env, a Unity plugin or a C extension",
    "SIGABRT": "an abort in native code",
    "SIGBUS": "a crash in native code (bus error)",
    "SIGTERM": "another process asked it to stop",
}


def short_socket_dir() -> None:
    """Have multiprocessing's temp dir, where the fork server's socket lives, fit a socket path.

    An AF_UNIX path is at most 107 bytes, and Python before 3.13 puts the socket under TMPDIR
    whatever its length: a long TMPDIR stopped every run with "OSError: AF_UNIX path too long".
    The dir is made under /tmp instead when TMPDIR is too long; call before the fork server
    starts (a dir made already is kept)."""
    socket_path = os.path.join(tempfile.gettempdir(), "pymp-xxxxxxxx", "listener-xxxxxxxx")
    if len(os.fsencode(socket_path)) < 100 or not os.path.isdir("/tmp"):
        return
    before = tempfile.tempdir
    tempfile.tempdir = "/tmp"
    try:
        multiprocessing.util.get_temp_dir()
    finally:
        tempfile.tempdir = before


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
    why = _SIGNAL_HINTS.get(sig.name) if hint else None
    return f"was killed by {sig.name}" + (f": {why}" if why else "")


def tag_this_process(tag: str) -> None:
    """Mark every process started from now on as belonging to ``tag`` (NOTE [ No orphans ])."""
    os.environ[OWNER_ENV] = tag


# NOTE [ Pids come back ]
# Linux hands out pids in turn up to pid_max (32768 on many machines, CI's included) and then
# starts again from the bottom: on a busy machine a pid comes back within minutes. psutil's
# ``process_iter`` keeps the Process object it made for each pid and hands it out again, so after
# the pid came back it names a process that is gone: signals sent through it are refused ("PID
# reused"), and once psutil has noticed, ``process_iter`` skips that pid in its next pass. A
# player whose pid came back was left running that way after its worker died (the ladder's scan
# skipped it; the close's scan found it). ``every_process`` makes a new Process object for each
# pid on each pass instead: what it names is what runs now.
def every_process() -> Iterator[psutil.Process]:
    """Every process running now, each as a Process object made now (NOTE [ Pids come back ])."""
    for pid in psutil.pids():
        try:
            yield psutil.Process(pid)
        except psutil.Error:  # gone since the listing
            continue


def find_tagged(prefix: str) -> List[psutil.Process]:
    """Live processes whose owner tag starts with ``prefix``, this process excluded."""
    found = []
    me = os.getpid()
    for proc in every_process():
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


def owner_prefix(supervisor_pid: int) -> str:
    """The start of the tags of every worker a supervising process starts (NOTE [ No orphans ])."""
    return f"{OWNER_ROOT}{supervisor_pid}-"


def port_holder(port: int) -> Optional[str]:
    """Which process listens on TCP ``port`` here, in words (for a worker of another
    ``mlagents-learn``, that run's command line); None if nobody or if it cannot be seen."""
    try:
        listening = [
            c.pid for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid
        ]
    except (psutil.Error, OSError):  # macOS needs root to see other processes' sockets
        return None
    if not listening:
        return None
    try:
        holder = psutil.Process(listening[0])
        for proc in [holder, *holder.parents()[:3]]:
            command = " ".join(proc.cmdline())
            if "mlagents-learn" in command:
                what = "" if proc.pid == holder.pid else f"a worker of pid {proc.pid}, "
                return f"pid {holder.pid} ({what}{_shortened(command)})"
        return f"pid {holder.pid} ({_shortened(' '.join(holder.cmdline()))})"
    except psutil.Error:
        return f"pid {listening[0]}"


def _shortened(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."

