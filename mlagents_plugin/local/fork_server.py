"""multiprocessing's fork server as the workers need it: preloading what they import, on the
trainer's sys.path (NOTE [ Worker start-up ] in worker.py). The fork server imports this module
first, and its import applies that sys.path there and loads the env factory's modules
(NOTE [ The fork server's sys.path ])."""
import contextlib
import json
import multiprocessing.forkserver
import os
import sys
from typing import Iterator, List, Optional

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


def set_preload(factory_modules: List[str]) -> None:
    """What the fork server imports before it forks a worker: what every worker imports and the
    env factory's modules. Takes effect when the server starts; one that runs already is kept."""
    from mlagents_plugin.local.worker import worker_preload

    _factory_modules[:] = factory_modules
    multiprocessing.forkserver.set_forkserver_preload([__name__] + worker_preload())


_started_by: Optional[int] = None  # the pid of the process that started the fork server here


def ensure_running() -> None:
    """Start the fork server once per process: on the trainer's sys.path, with a socket path
    that fits, and with SIGINT and SIGHUP ignored (NOTE [ Trainer signals ]). Once it runs,
    this does nothing (the environment is not touched while other threads may read it); a
    server that died is started again by multiprocessing itself, with the next worker."""
    global _started_by
    if _started_by == os.getpid():
        return
    from mlagents_plugin.core import signals
    from mlagents_plugin.local import processes

    processes.short_socket_dir()
    with _sys_path_passed(), signals.children_ignore_interrupts():
        multiprocessing.forkserver.ensure_running()
    _started_by = os.getpid()


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
