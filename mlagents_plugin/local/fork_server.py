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
from typing import Any, Iterator, List, Optional

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


def ensure_running() -> None:
    """Start the fork server once per process: on the trainer's sys.path, with a socket path
    that fits, and with SIGINT and SIGHUP blocked (NOTE [ Trainer signals ]); a fork of this
    process where NOTE [ A fork server forked from the trainer ] says so. Once it runs, this does
    nothing (the environment is not touched while other threads may read it); a server that
    died is started again by multiprocessing itself, with the next worker."""
    global _started_by
    if _started_by == os.getpid():
        return
    from mlagents_plugin.core import platform, signals
    from mlagents_plugin.local import hardening, processes

    processes.short_socket_dir()
    # The server's socket lives in multiprocessing's temp dir, which only an exit of this process
    # removes: the reaper removes it after a SIGKILL too. It is told before the dir can hold
    # anything, as a kill can come at any moment (a Ray actor's, in the middle of a launch).
    hardening.layer(platform.hardened()).remove_with_me(multiprocessing.util.get_temp_dir())
    forked = _fork_this_process and _can_fork_here()
    with signals.children_ignore_interrupts():
        if sys.platform == "linux" and forked:
            from mlagents_plugin.local.linux import forked_server

            forked_server.start(_multiprocessings_server())
        else:
            with _sys_path_passed():
                multiprocessing.forkserver.ensure_running()
    _started_by = os.getpid()


def running_pid() -> Optional[int]:
    """The pid of the fork server this process started, if it started one."""
    pid: Optional[int] = _multiprocessings_server()._forkserver_pid
    return pid


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
# - in a trainer that has used CUDA already: a fork cannot use it again (torch says so);
# - on Python 3.14 and later, whose server takes an authentication key this does not pass;
# - without the Linux hardening (the portable path, macOS, Windows), which the fork needs.
# The fork keeps nothing of the trainer's but its memory (local/linux/forked_server.py says
# how). Its command line is the trainer's, as a forked worker's is upstream; ``running_pid``
# names it. Threads of C libraries (torch starts one at import) are let be: they take none of
# Python's locks, and upstream forks the trainer with them at every worker start (Python 3.12
# and 3.13 warn about such a fork all the same). As for any fork server, the first manager of a
# process decides: later ones, whatever their env, get their workers from the server that runs.
def _multiprocessings_server() -> Any:
    """multiprocessing's one ForkServer (a forked server takes over its private state)."""
    return multiprocessing.forkserver._forkserver  # type: ignore[attr-defined,unused-ignore]  # on win32


def _can_fork_here() -> bool:
    """Where NOTE [ A fork server forked from the trainer ] allows the fork, the env aside."""
    from mlagents_plugin.core import platform

    torch, ray = sys.modules.get("torch"), sys.modules.get("ray")
    return (
        platform.hardened()
        and sys.version_info < (3, 14)
        and threading.current_thread() is threading.main_thread()
        and threading.active_count() == 1
        and not (torch is not None and torch.cuda.is_initialized())
        and not (ray is not None and ray.is_initialized())
    )


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
