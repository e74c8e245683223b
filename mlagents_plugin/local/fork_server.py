"""multiprocessing's fork server as the workers need it: preloading what they import, on the
trainer's sys.path (NOTE [ Worker start-up ] in worker.py), or a fork of the trainer, which has
imported it all (NOTE [ A fork server forked from the trainer ]). A fresh fork server imports this
module first, and its import applies that sys.path there and loads the env factory's modules
(NOTE [ The fork server's sys.path ])."""
import contextlib
import json
import multiprocessing.forkserver
import multiprocessing.util
import os
import sys
import threading
import time
from typing import Any, Dict, Iterator, List, NamedTuple, Optional

import psutil
from mlagents_envs import logging_util

from mlagents_plugin.core.internals import Internal, verify

# NOTE [ The fork server's sys.path ]
# multiprocessing hands the fork server the trainer's sys.path and then, in every Python from
# 3.10 to 3.13, does not apply it: the server imports its preloads on the sys.path of a bare
# ``python -c`` (the working directory, the standard library, site-packages). An env module found
# through a path the trainer added (a script's own folder, a test folder pytest put on sys.path)
# failed to preload, silently, and every worker imported it on its own: with a module that
# imports torch, 8 workers took 8-17 s to start, each holding 141 MB of its own. So this module
# is the server's first preload: while the trainer starts the server, it passes its sys.path and
# the env factory's modules in an environment variable, which the import below reads and removes
# (the workers and the players they start never see it). It imports those modules itself: one
# that raises anything but ImportError would otherwise end the server (multiprocessing catches
# only that), and with it every later worker start; a worker then imports it and says why.
TRAINER_ENV = "MLAGENTS_PLUGIN_FORK_SERVER"
logger = logging_util.get_logger(__name__)

# multiprocessing's and logging's internals the process backend relies on (this module,
# local/linux/forked_server.py, and the others each entry names); ``check`` runs in the doctor
# and the test suite (core/internals.py), so that a Python upgrade that changes them fails there,
# loudly.
INTERNALS = [
    Internal("multiprocessing.forkserver:_forkserver", "the one ForkServer, whose state a forked server sets"),
    Internal("multiprocessing.forkserver:ForkServer.__init__", "set by a forked server; reset when one dies",
             "self._forkserver_address"),
    Internal("multiprocessing.forkserver:ForkServer.__init__", "", "self._forkserver_alive_fd"),
    Internal("multiprocessing.forkserver:ForkServer.__init__", "", "self._forkserver_pid"),
    Internal("multiprocessing.forkserver:ForkServer.__init__", "taken while a forked server starts", "self._lock"),
    Internal("multiprocessing.forkserver:ForkServer.__init__", "what a forked server imports",
             "self._preload_modules"),
    Internal("multiprocessing.forkserver:ForkServer.ensure_running",
             "its check of a dead server, which ours mirrors (NOTE [ A fork server dies ])",
             "os.waitpid(self._forkserver_pid, os.WNOHANG)"),
    Internal("multiprocessing.forkserver:main", "a forked server's loop, called with the trainer's listener",
             "def main(listener_fd, alive_r, preload,"),
    Internal("multiprocessing.util:_flush_std_streams", "flushed before the trainer forks"),
    Internal("multiprocessing.connection:arbitrary_address",
             "a forked server's socket, named as ForkServer's own (local/backend.py looks for listener-*)",
             "prefix='listener-', dir=util.get_temp_dir()"),
    Internal("multiprocessing.util:get_temp_dir", "the fork server's socket dir: the reaper removes it, and "
             "local/processes.py has it made under a short TMPDIR", "tempfile.mkdtemp(prefix='pymp-'"),
    Internal("multiprocessing.spawn:get_preparation_data",
             "reads the main module, which local/worker.py hides while a worker starts", "sys.modules['__main__']"),
    Internal("multiprocessing.resource_tracker:ensure_running",
             "started by core/signals.py before it blocks SIGINT, which the tracker's start unblocks"),
    Internal("multiprocessing.resource_tracker:ResourceTracker.ensure_running", "",
             "signal.pthread_sigmask(signal.SIG_UNBLOCK, _IGNORED_SIGNALS)"),
    Internal("multiprocessing.resource_tracker:unregister",
             "local/linux/hardening.py: a reaped worker's segments are forgotten there"),
    Internal("multiprocessing.popen_forkserver:Popen.poll", "exit code 255 for a worker whose server is gone",
             "returncode = 255"),
    Internal("logging:Manager.__init__", "a forked server keeps the files of every logger's handlers",
             "self.loggerDict"),
]


def check() -> List[str]:
    """What of ``INTERNALS`` this Python no longer has (not checked on Windows: no fork server)."""
    if sys.platform == "win32":
        return []
    return [f"Python {sys.version.split()[0]}: {p} (local/fork_server.py)." for p in verify(INTERNALS)]

_factory_modules: List[str] = []  # in the trainer: what the next server start preloads
_fork_this_process = False  # in the trainer: whether the next server start forks it
_UNITY_MODULE = "mlagents_envs.environment"  # in a factory's modules: it makes Unity environments


def _load_what_the_trainer_passed() -> None:
    given = os.environ.pop(TRAINER_ENV, None)
    if given is None:
        return
    passed = json.loads(given)
    sys.path[:] = passed["sys_path"]
    for name in passed["modules"]:
        try:
            __import__(name)
        except BaseException:  # noqa: B036 (SystemExit too: nothing may end the server)
            pass


_load_what_the_trainer_passed()


def set_preload(factory_modules: List[str], may_fork_this_process: bool = False) -> None:
    """What the fork server imports before it forks a worker: what every worker imports and the
    env factory's modules; with ``may_fork_this_process``, the server may be a fork of this
    process (NOTE [ A fork server forked from the trainer ]). Takes effect when the server
    starts; one that runs already is kept."""
    from mlagents_plugin.local.worker import worker_preload

    global _fork_this_process
    _factory_modules[:] = factory_modules
    _fork_this_process = may_fork_this_process and _UNITY_MODULE not in factory_modules
    multiprocessing.forkserver.set_forkserver_preload([__name__] + worker_preload())


_started_by: Optional[int] = None  # the pid of the process that started the fork server here
_how = "no fork server yet"  # how the running one was made, for the start line
_servers: List[int] = []  # the pid of each fork server this process started; the index is its generation
_ended: Dict[int, "ServerEnd"] = {}  # by generation: the servers that died (NOTE [ A fork server dies ])
# Deaths of the fork server in one process whose workers are restarted without counting; from
# the next one on, each worker lost with it counts as a restart (a server killed again and again).
FREE_DEATHS = 3


class ServerEnd(NamedTuple):
    """How a fork server of this process ended."""

    pid: int
    how: str  # "was killed by SIGKILL: ..."
    free: bool  # whether its workers restart without counting


def ensure_running() -> None:
    """Start the fork server once per process: on the trainer's sys.path, with a socket path
    that fits, and with SIGINT and SIGHUP blocked (NOTE [ Trainer signals ]); a fork of this
    process where NOTE [ A fork server forked from the trainer ] says so. Once it runs, this only
    checks that it still does (the environment is not touched while other threads may read it);
    one that died is recorded (NOTE [ A fork server dies ]) and a fresh one started."""
    global _started_by, _how
    generation = current()
    if generation is not None and ended(generation) is None:
        return
    from mlagents_plugin.core import platform, signals
    from mlagents_plugin.local import hardening, processes

    processes.short_socket_dir()
    # The server's socket lives in multiprocessing's temp dir, which only an exit of this process
    # removes: the reaper removes it after a SIGKILL too. It is told before the dir can hold
    # anything, as a kill can come at any moment (a Ray actor's, in the middle of a launch).
    hardening.layer(platform.hardened()).remove_with_me(multiprocessing.util.get_temp_dir())
    not_forked = _why_not_fork() if _fork_this_process else None
    with signals.children_ignore_interrupts():
        if sys.platform == "linux" and _fork_this_process and not_forked is None:
            from mlagents_plugin.local.linux import forked_server

            forked_server.start(_multiprocessings_server())
            _how = f"a fork server forked from this process (pid {running_pid()})"
        else:
            with _sys_path_passed():
                multiprocessing.forkserver.ensure_running()
            _how = f"a fresh fork server (pid {running_pid()})"
            if not_forked is not None:
                _how += f", not a fork of this process: {not_forked}"
    pid = running_pid()
    assert pid is not None  # started
    _servers.append(pid)
    _started_by = os.getpid()
    logger.info(f"Env workers start from {_how}.")


def running_pid() -> Optional[int]:
    """The pid of the fork server running now, if any."""
    pid: Optional[int] = _multiprocessings_server()._forkserver_pid
    return pid


def current() -> Optional[int]:
    """The generation of the fork server this process started last, if it started one: what a
    worker records, to ask ``ended`` about (a pid can come back; a generation cannot)."""
    return len(_servers) - 1 if _servers and _started_by == os.getpid() else None


def describe() -> str:
    """How the running fork server was made, for the ``Env manager:`` start line."""
    return _how


# NOTE [ A fork server dies ]
# Every worker is a child of the fork server, and the server reports each one's exit through a
# status pipe: multiprocessing's ``Popen.poll`` reads it, and once the server is gone the read
# fails and every worker "exits with code 255" at once, whether it died or not. The fork server
# is as likely an OOM victim as any process (a fork of the trainer holds what the trainer held),
# and a user may kill it. So a worker that reads 255 asks ``ended`` about the server it came from
# (by generation: pids come back). The server is this process's child: once dead it is reaped
# here (the status pipe closes a moment before: a server that is not asleep in its loop is given
# up to a second). multiprocessing's record of it is reset, as its own ``ensure_running`` does,
# under multiprocessing's lock, which that method also takes (a user's own forkserver processes in
# another thread); a server that multiprocessing replaced already died too, as it replaces only
# a dead one. The worker is then killed (it may run on, orphaned, its exit status lost) and
# started again, from a fresh server (a fork of the trainer as it is now could be as large as the
# one the OOM killer chose), without counting as one of its restarts (restart.py's
# ``Cause.FORK_SERVER``): it did nothing wrong. A server killed again and again is a fault all
# the same: past ``FREE_DEATHS`` deaths in a process, each lost worker counts as a restart. The
# next worker start notices a death too (``ensure_running``), if no worker did first.
def ended(generation: Optional[int], within_s: float = 0.0) -> Optional[ServerEnd]:
    """How fork server ``generation`` of this process ended, if it did, waiting up to
    ``within_s`` for one caught in the middle of its exit."""
    if generation is None or sys.platform == "win32":  # Windows has no fork server
        return None
    if generation in _ended:
        return _ended[generation]
    pid, server = _servers[generation], _multiprocessings_server()
    with server._lock:
        if generation in _ended:  # another thread recorded it meanwhile
            return _ended[generation]
        if server._forkserver_pid != pid:
            how = "died, and multiprocessing has started another"
        else:
            reaped = _reap(pid, within_s)
            if reaped is None:
                return None
            how = reaped
            if server._forkserver_alive_fd is not None:
                os.close(server._forkserver_alive_fd)
            for attribute in ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid"):
                setattr(server, attribute, None)
        end = _ended[generation] = ServerEnd(pid, how, free=len(_ended) < FREE_DEATHS)
    logger.warning(
        f"The fork server (pid {pid}) {how}. The env workers forked from it are started again from "
        + (
            "a fresh one, without counting as restarts"
            if end.free
            else f"a fresh one; it has died {len(_ended)} times in this process, so each counts as a restart"
        )
        + " (NOTE [ A fork server dies ])."
    )
    return end


def _reap(pid: int, within_s: float) -> Optional[str]:
    """How child ``pid`` exited, if it has; None if it lives (asleep in its loop, or still
    running after ``within_s``)."""
    from mlagents_plugin.local import processes

    if sys.platform == "win32":  # no fork server there (and no WNOHANG)
        return None
    deadline = time.monotonic() + within_s
    while True:
        try:
            reaped, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return "died (its exit status was collected elsewhere)"
        if reaped:
            return processes.describe_exit(os.waitstatus_to_exitcode(status))
        if time.monotonic() >= deadline or _asleep(pid):
            return None
        time.sleep(0.01)


def _asleep(pid: int) -> bool:
    """Whether the process waits in its loop (a fork server that serves), not on its way out."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_SLEEPING)
    except psutil.Error:
        return False


# NOTE [ A fork server forked from the trainer ]
# Upstream's workers are forks of the trainer: whatever the trainer imported, they have, and a
# Python env module that imports torch costs them nothing. A fork server started fresh imports
# that module once more, about a second of CPU before the first worker can start. So where the
# trainer is a program of its own (a script, a test, a sweep) and the env is a Python env, the
# fork server is a fork of the trainer, made before any worker: it has every module the trainer
# has, and each worker is a fork of it, as under multiprocessing's own server. Elsewhere the
# server is a fresh interpreter, as multiprocessing starts it:
# - under mlagents-learn (plugin.py starts it as soon as the YAML is read, while the trainer
#   still imports its stack): its workers need none of ML-Agents' trainers or torch;
# - for Unity builds and the Editor (the pickled factory names UnityEnvironment, as
#   mlagents-learn's ``create_environment_factory`` does): the same, and the player's start
#   dwarfs the worker's (a factory of the user's own module that makes one inside is forked);
# - in a Ray actor or a Ray driver, from any thread but the main one, and while the trainer runs
#   other Python threads: a fork copies one thread of many, and a lock another held at that
#   moment (a stream's, a logging handler's) would stay held in the server and in every worker
#   forked from it, restarts included;
# - while the trainer runs any native thread, as the kernel counts them (/proc/self/task): a
#   BLAS or OpenMP pool (numpy's OpenBLAS starts one at import on any machine of two cores or
#   more; torch's intra-op pool at its first parallel op) is copied without its threads, and
#   GNU OpenMP in a fork waits for them for ever: an env whose step ran a torch op hung at it in
#   every worker, restarts included, once the trainer had run torch on 4 threads (upstream's
#   forked workers hang the same way). In practice the fork is taken where the trainer runs with
#   ``OMP_NUM_THREADS=1`` (common in sweeps and on clusters) or on one core;
# - in a trainer that has used CUDA already: a fork cannot use it again (torch says so);
# - on Python 3.14 and later, whose server takes an authentication key this does not pass;
# - without the Linux hardening (the portable path, macOS, Windows), which the fork needs.
# The fork keeps nothing of the trainer's but its memory and its log files
# (local/linux/forked_server.py says how); the memory it keeps for its life, and its workers
# share it (docs/benchmarks.md measures it). Its command line is the trainer's, as a forked
# worker's is upstream; ``running_pid`` names it, and the log line and mlagents-learn's
# ``Env manager:`` line say which server runs and, for a fresh one, why it is not a fork. As for
# any fork server, the first manager of a process decides: later ones, whatever their env, get
# their workers from the server that runs (or from the one made when it died).
def _multiprocessings_server() -> Any:
    """multiprocessing's one ForkServer (a forked server takes over its private state)."""
    return multiprocessing.forkserver._forkserver  # type: ignore[attr-defined,unused-ignore]  # on win32


def _why_not_fork() -> Optional[str]:
    """Why NOTE [ A fork server forked from the trainer ] does not allow the fork here, the env
    aside; None where it does."""
    from mlagents_plugin.core import platform

    torch, ray = sys.modules.get("torch"), sys.modules.get("ray")
    if not platform.hardened():
        return "the portable path"
    if _ended:
        return "a fork server of this process died (NOTE [ A fork server dies ])"
    if ray is not None and ray.is_initialized():
        return "this process is a Ray driver"
    if sys.version_info >= (3, 14):
        return "Python 3.14 and later"
    if threading.current_thread() is not threading.main_thread() or threading.active_count() > 1:
        return "this process runs other Python threads"
    if torch is not None and torch.cuda.is_initialized():
        return "this process has used CUDA"
    threads = native_threads()
    if threads > 1:
        return (
            f"it runs {threads - 1} native thread(s) besides its own (a BLAS or OpenMP pool, as "
            "numpy and torch start: a fork would copy the pool without its threads)"
        )
    return None


def native_threads() -> int:
    """The kernel's count of this process's threads (Python's and C libraries' alike)."""
    return len(os.listdir("/proc/self/task"))


@contextlib.contextmanager
def _sys_path_passed() -> Iterator[None]:
    # what the import system uses: str and os.PathLike entries (it skips others, as bytes)
    entries = (os.fspath(p) for p in sys.path if isinstance(p, (str, os.PathLike)))
    sys_path = [entry for entry in entries if isinstance(entry, str)]
    os.environ[TRAINER_ENV] = json.dumps({"sys_path": sys_path, "modules": _factory_modules})
    try:
        yield
    finally:
        os.environ.pop(TRAINER_ENV, None)
