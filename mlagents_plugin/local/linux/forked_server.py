"""The fork server as a fork of the trainer (NOTE [ A fork server forked from the trainer ] in
local/fork_server.py says when): multiprocessing's own server code, in a process that has every
module the trainer has.

# NOTE [ A fork of the trainer as the fork server ]
# The fork keeps nothing of the trainer's but its memory and where it logs. Every inherited
# descriptor but those of the trainer's logging handlers (a FileHandler's file, which an env's
# log records reach as they do from upstream's forked workers) is pointed at /dev/null: the
# server holds no port, pipe or other file of the trainer's, and a stale object that writes to
# one writes nowhere (closed, its number could be reused by a worker's pipe). stdout and stderr
# are made again on descriptors 1 and 2, as a fresh interpreter has them. Python's
# signal handlers go back to the defaults; SIGINT and SIGHUP stay blocked, as for a fresh server
# (NOTE [ Trainer signals ]). The collector leaves the trainer's objects alone (``gc.freeze``),
# so that none of their finalizers runs there, and only ``os._exit`` ends the server: the
# trainer's atexit handlers are not its own. multiprocessing's client side is untouched: the
# trainer's ForkServer gets the address, alive pipe and pid it would have set itself.
"""
import contextlib
import gc
import logging
import multiprocessing.forkserver
import os
import signal
import socket
import sys
import threading
import traceback
from multiprocessing import connection, util
from typing import Any, NoReturn, Set

assert sys.platform == "linux"  # /proc (NOTE [ Portable core, Linux hardening ])


def start(server: Any) -> None:
    """multiprocessing's ``ForkServer.ensure_running`` for ``server``, multiprocessing's one
    ForkServer, with a fork of this process as the server."""
    with server._lock:
        with socket.socket(socket.AF_UNIX) as listener:
            address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
            listener.bind(address)
            os.chmod(address, 0o600)
            listener.listen()
            alive_r, alive_w = os.pipe()  # the server ends when every holder of alive_w has
            util._flush_std_streams()  # type: ignore[attr-defined]
            try:
                pid = os.fork()
            except BaseException:
                os.close(alive_r)
                os.close(alive_w)
                raise
            if pid == 0:
                _serve(server, listener.fileno(), alive_r)
            os.close(alive_r)
        server._forkserver_address = address
        server._forkserver_alive_fd = alive_w
        server._forkserver_pid = pid


def _serve(server: Any, listener_fd: int, alive_r: int) -> NoReturn:
    """The forked server's life (NOTE [ A fork of the trainer as the fork server ])."""
    code = 0
    try:
        gc.freeze()
        _point_inherited_descriptors_at_devnull(keep={0, 1, 2, listener_fd, alive_r} | _logging_descriptors())
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)
        signal.set_wakeup_fd(-1)
        for signum in signal.valid_signals():
            if callable(signal.getsignal(signum)):
                signal.signal(signum, signal.SIG_DFL)
        server._lock = threading.Lock()  # held by the trainer's thread that forked
        multiprocessing.forkserver.main(listener_fd, alive_r, server._preload_modules)
    except SystemExit as e:  # the trainer is gone: the alive pipe closed
        code = e.code if isinstance(e.code, int) else 0
    except BaseException:  # noqa: B036 (nothing may run the trainer's code after this)
        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


def _logging_descriptors() -> Set[int]:
    """The descriptors of the trainer's logging handlers (a FileHandler's file): an env's log
    records reach them, as they do from upstream's forked workers."""
    loggers = [logging.getLogger()] + [
        logger for logger in logging.Logger.manager.loggerDict.values() if isinstance(logger, logging.Logger)
    ]
    descriptors = set()
    for logger in loggers:
        for handler in logger.handlers:
            stream = getattr(handler, "stream", None)
            with contextlib.suppress(AttributeError, OSError, ValueError):  # no file, or closed
                descriptors.add(stream.fileno())  # type: ignore[union-attr]
    return descriptors


def _point_inherited_descriptors_at_devnull(keep: Set[int]) -> None:
    """Every inherited descriptor but ``keep`` becomes /dev/null; so does a closed 0, 1 or 2."""
    inherited = [int(name) for name in os.listdir("/proc/self/fd")]
    devnull = os.open(os.devnull, os.O_RDWR)  # 0, 1 or 2 itself, if the trainer had closed it
    for fd in (0, 1, 2):
        if not _is_open(fd):
            os.dup2(devnull, fd)
    for fd in inherited:
        if fd not in keep and fd != devnull and _is_open(fd):  # the listing's own is closed again
            os.dup2(devnull, fd, inheritable=False)
    if devnull not in (0, 1, 2):
        os.close(devnull)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
