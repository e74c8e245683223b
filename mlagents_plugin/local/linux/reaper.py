"""The reaper: cleans up after a process that supervises env workers, once that process is gone.

# NOTE [ The reaper ]
# Run as ``python -I -S reaper.py NAMES_JSON``, in a session of its own, by ``Reaper`` in
# hardening.py (NOTE [ No orphans ] in local/processes.py). NAMES_JSON says whom it watches and what
# is theirs: ``supervisor`` (a pid), ``owner_env`` (the variable workers are tagged with),
# ``owner_root`` and ``owner_prefix`` (all supervisors' tags, this one's), ``segment_root`` and
# ``segment_prefix`` (shared memory names, likewise), ``dir_root`` (Ray temp dirs). It forks once
# and lets its parent exit, so that it is nobody's child: whoever kills a dying process's children
# (Ray does, for its workers) does not find it. It uses the standard library only, and is passed
# everything it needs, so that it starts in milliseconds without site-packages or the package.
#
# On its standard input the supervisor tells it, a line each:
#
#     worker PID STARTTIME    a worker process to take down, with its whole tree
#     dir PATH                a directory to remove (a Ray temp dir, the fork server's temp dir)
#
# When it starts, it sweeps: processes tagged by supervisors that are gone, their shared memory
# segments and their directories. When the supervisor is gone (a pidfd: no polling), it reads
# what is left of its input (lines written just before the death may be unread), SIGKILLs
# every worker it was told of that still runs (checked by start time, so a reused pid is spared)
# and their descendants, and every process tagged with owner_prefix; then it removes the
# supervisor's segments and directories, says what it did on stderr if it did anything, and exits.
"""
import io
import json
import os
import select
import shutil
import signal
import sys
from typing import Dict, List, NamedTuple, Optional, Set, Tuple, cast

assert sys.platform == "linux"  # /proc, pidfds (NOTE [ Portable core, Linux hardening ])

SHM_DIR = "/dev/shm"


class Names(NamedTuple):
    """What the reaper is passed (NOTE [ The reaper ])."""

    supervisor: int
    owner_env: str
    owner_root: str
    owner_prefix: str
    segment_root: str
    segment_prefix: str
    dir_root: str


def starttime(pid: int) -> Optional[int]:
    """When ``pid`` started, in clock ticks since boot; None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()  # after the command name, which may hold spaces
    if fields[0] == b"Z":
        return None
    return int(fields[19])


def _processes() -> Dict[int, int]:
    """pid -> ppid of every process."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
                found[int(name)] = int(stat[stat.rindex(b")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return found


def _owner(pid: int, owner_env: str) -> Optional[str]:
    key = owner_env.encode() + b"="
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:
        return None
    for entry in environ.split(b"\0"):
        if entry.startswith(key):
            return entry[len(key):].decode(errors="replace")
    return None


def _supervisor_of(owner: str, owner_root: str) -> Optional[int]:
    rest = owner[len(owner_root):] if owner.startswith(owner_root) else ""
    pid = rest.partition("-")[0]
    return int(pid) if pid.isdigit() else None


def _gone(supervisor: int, since: Optional[int]) -> bool:
    """Is ``supervisor`` gone (its pid free, or taken by a process younger than ``since``)?"""
    started = starttime(supervisor)
    return started is None or (since is not None and started > since)


def _descendants(roots: Set[int], parents: Dict[int, int]) -> Set[int]:
    found = set(roots)
    grew = True
    while grew:
        children = {pid for pid, ppid in parents.items() if ppid in found} - found
        found |= children
        grew = bool(children)
    return found


def _kill(pids: Set[int]) -> List[int]:
    killed = []
    for pid in sorted(pids):
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
    return killed


def _remove_segments(prefix: str) -> List[str]:
    removed: List[str] = []
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return removed
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed.append(name)
            except OSError:
                pass
    return removed


def sweep(names: Names) -> Tuple[List[int], List[str], List[str]]:
    """Kill tagged processes of supervisors that are gone; remove their segments and dirs."""
    parents = _processes()
    orphans = set()
    for pid in parents:
        owner = _owner(pid, names.owner_env)
        supervisor = _supervisor_of(owner, names.owner_root) if owner else None
        if supervisor is not None and _gone(supervisor, starttime(pid)):
            orphans.add(pid)
    killed = _kill(orphans)
    segments: List[str] = []
    for name in os.listdir(SHM_DIR) if os.path.isdir(SHM_DIR) else []:
        root = names.segment_root
        owner_pid = name[len(root):].partition("_")[0] if name.startswith(root) else ""
        if owner_pid.isdigit() and _gone(int(owner_pid), None):
            segments += _remove_segments(name)
    dirs = []
    parent, stem = os.path.split(names.dir_root)
    for name in os.listdir(parent):
        owner_pid = name[len(stem):].partition("-")[0] if name.startswith(stem) else ""
        if owner_pid.isdigit() and _gone(int(owner_pid), None):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
            dirs.append(name)
    return killed, segments, dirs


class Told:
    """What the supervisor told the reaper on its standard input (NOTE [ The reaper ])."""

    def __init__(self) -> None:
        self.workers: Dict[int, int] = {}  # pid -> start time
        self.dirs: List[str] = []
        self._pending = b""

    def read(self, fd: int) -> bool:
        """Read what is there and take its whole lines; False at the end of the input."""
        chunk = os.read(fd, 65536)
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        for line in lines:
            kind, _, rest = line.decode().partition(" ")
            if kind == "worker":
                pid, start = rest.split()
                self.workers[int(pid)] = int(start)
            elif kind == "dir":
                self.dirs.append(rest)
        return bool(chunk)


def main(argv: List[str]) -> int:
    names = Names(**json.loads(argv[0]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the supervisor, not for us
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        watched = os.pidfd_open(names.supervisor)
    except ProcessLookupError:
        watched = None
    sweep(names)
    told = Told()
    # unbuffered: select() must see what is not yet read (typeshed types stdin's buffer as BinaryIO)
    stdin: Optional[io.FileIO] = cast("io.BufferedReader[io.FileIO]", sys.stdin.buffer).raw
    while watched is not None:
        ready, _, _ = select.select([watched] + ([stdin] if stdin else []), [], [])
        if watched in ready:
            break
        assert stdin is not None  # once it is closed, only the pidfd can be ready
        if not told.read(stdin.fileno()):
            stdin = None  # the supervisor closed it (or exited): wait for its pidfd alone
    if stdin is not None:
        # What the supervisor wrote before it died may not be read yet: a reaper slow to start
        # (its sweep, a loaded machine) finds the pidfd and unread lines ready together.
        os.set_blocking(stdin.fileno(), False)
        try:
            while told.read(stdin.fileno()):
                pass
        except BlockingIOError:
            pass  # all read; a fork of the supervisor may still hold the pipe open
    workers, dirs = told.workers, told.dirs
    parents = _processes()
    alive = {pid for pid, start in workers.items() if starttime(pid) == start}
    doomed = _descendants(alive, parents)
    doomed |= {pid for pid in parents if (_owner(pid, names.owner_env) or "").startswith(names.owner_prefix)}
    killed = _kill(doomed)
    segments = _remove_segments(names.segment_prefix)
    for path in dirs:
        shutil.rmtree(path, ignore_errors=True)
    if killed or segments:
        try:
            sys.stderr.write(
                f"[mlagents-plugin] process {names.supervisor} is gone; its reaper killed what it left "
                f"running (pids {', '.join(map(str, killed)) or 'none'}) and removed "
                f"{len(segments)} shared memory segment(s).\n"
            )
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    if os.fork() > 0:  # out of the supervisor's process tree (see the docstring)
        os._exit(0)
    sys.exit(main(sys.argv[1:]))
