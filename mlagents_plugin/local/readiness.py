"""Waiting on every pipe and process sentinel the trainer watches, at once.

``PortableReadiness`` is the one for every platform: ``multiprocessing.connection.wait``, which takes Connections
and process sentinels on every platform (file descriptors on Linux and macOS, handles on
Windows). It builds a new poll set, registering every object again, on each call; with a step
every few hundred microseconds that bookkeeping was about a tenth of the trainer's CPU per step
(docs/benchmarks.md). So the Linux hardening uses ``EpollReadiness``: one epoll set, whose
members are registered once, when a worker starts, and unregistered before they are closed.
"""
import abc
import selectors
import sys
import time
from multiprocessing import connection
from typing import Any, Dict, List, Tuple

# One end of a worker's duplex pipe: what ``Pipe()`` makes on this platform.
if sys.platform == "win32":
    from multiprocessing.connection import PipeConnection as WorkerConnection
else:
    from multiprocessing.connection import Connection as WorkerConnection

__all__ = ["WorkerConnection", "Readiness", "PortableReadiness", "EpollReadiness"]


class Readiness(abc.ABC):
    @abc.abstractmethod
    def watch(self, obj: Any, data: Any) -> None:
        """Wake ``wait`` when ``obj`` (a Connection or a process sentinel) is readable."""

    @abc.abstractmethod
    def forget(self, obj: Any) -> None:
        """Stop watching ``obj``; call it before closing ``obj``."""

    @abc.abstractmethod
    def wait(self, timeout: float) -> List[Tuple[Any, Any]]:
        """(object, data) of everything readable, within ``timeout`` seconds (0: just look)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Let go of everything watched."""


class PortableReadiness(Readiness):
    def __init__(self) -> None:
        self._watched: Dict[Any, Any] = {}

    def watch(self, obj: Any, data: Any) -> None:
        self._watched[obj] = data

    def forget(self, obj: Any) -> None:
        self._watched.pop(obj, None)

    def wait(self, timeout: float) -> List[Tuple[Any, Any]]:
        timeout = max(timeout, 0.0)
        if not self._watched:  # on Windows, waiting on nothing returns at once
            time.sleep(timeout)
            return []
        return [(obj, self._watched[obj]) for obj in connection.wait(list(self._watched), timeout)]

    def close(self) -> None:
        self._watched.clear()


class EpollReadiness(Readiness):
    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()  # epoll on Linux

    def watch(self, obj: Any, data: Any) -> None:
        self._selector.register(obj, selectors.EVENT_READ, data)

    def forget(self, obj: Any) -> None:
        try:
            self._selector.unregister(obj)
        except (KeyError, ValueError):
            pass

    def wait(self, timeout: float) -> List[Tuple[Any, Any]]:
        return [(key.fileobj, key.data) for key, _ in self._selector.select(max(timeout, 0.0))]

    def close(self) -> None:
        self._selector.close()
