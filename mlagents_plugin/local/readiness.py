"""One epoll set for every pipe and process sentinel the trainer waits on.

``multiprocessing.connection.wait`` does the same job but builds a new poll set, and registers
every file descriptor again, on each call; with a step every few hundred microseconds that
bookkeeping was about a tenth of the trainer's CPU per step (docs/benchmarks.md). Here objects
are registered once, when a worker starts, and unregistered before they are closed.
"""
import selectors
from typing import Any, List, Tuple


class Readiness:
    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()

    def watch(self, obj: Any, data: Any) -> None:
        """Wake ``wait`` when ``obj`` (a Connection or a process sentinel) is readable."""
        self._selector.register(obj, selectors.EVENT_READ, data)

    def forget(self, obj: Any) -> None:
        """Stop watching ``obj``; call it before closing ``obj``."""
        try:
            self._selector.unregister(obj)
        except (KeyError, ValueError):
            pass

    def wait(self, timeout: float) -> List[Tuple[Any, Any]]:
        """(object, data) of everything readable, within ``timeout`` seconds (0: just look)."""
        return [(key.fileobj, key.data) for key, _ in self._selector.select(max(timeout, 0.0))]

    def fileno(self) -> int:
        """A descriptor that is readable while anything watched is (for an event loop)."""
        return self._selector.fileno()  # epoll, on Linux

    def close(self) -> None:
        self._selector.close()
