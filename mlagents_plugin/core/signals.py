"""Ctrl-C and SIGTERM in the trainer process of ``mlagents-learn``.

# NOTE [ Trainer signals ]
# One Ctrl-C raises KeyboardInterrupt in the trainer; ML-Agents' TrainerController catches it,
# saves the model, and ``run_training`` closes the env manager: the ordinary, bounded ladder.
# Workers ignore SIGINT (NOTE [ Worker signals ]), so they are still there to be closed in order.
# A second Ctrl-C means "stop now": ``close()`` then kills the workers at once, whether the second
# interrupt lands during the model save (it raises out of the save, and ``close`` sees the count)
# or during ``close`` itself. SIGTERM and SIGHUP (a closed terminal, an SSH session that drops)
# get the same treatment as Ctrl-C: by default they would end the trainer on the spot, with no
# model saved and nobody left to close the workers. Workers ignore SIGHUP as they ignore SIGINT.
#
# The handlers are installed only in ``mlagents-learn`` (by the plugin, from the main thread) and
# only over Python's defaults, so a program that handles these signals itself keeps its handlers.
#
# A hangup reaches multiprocessing's helpers too (the fork server, the resource tracker), which
# ignore SIGINT but not SIGHUP: killed by it, the fork server takes the workers' exit codes with
# it and the resource tracker its registrations. An ignored signal stays ignored across fork and
# exec, so they are started with SIGHUP ignored (``hangup_ignored``).
"""
import contextlib
import signal
import sys
import threading
from typing import Any, Iterator, List

_interrupts = 0


def _stop_signals() -> List[signal.Signals]:
    """What asks the trainer to stop: Ctrl-C and SIGTERM, and SIGHUP where there is one (on
    Windows, Ctrl-Break instead)."""
    if sys.platform == "win32":
        return [signal.SIGINT, signal.SIGTERM, signal.SIGBREAK]
    return [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]


def install() -> None:
    """Count the stop signals and turn them into KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _stop_signals():
        if signal.getsignal(sig) in (signal.default_int_handler, signal.SIG_DFL):
            signal.signal(sig, _interrupt)


def interrupted_twice() -> bool:
    return _interrupts >= 2


def _interrupt(signum: int, frame: Any) -> None:
    global _interrupts
    _interrupts += 1
    raise KeyboardInterrupt(f"{signal.Signals(signum).name} received")


@contextlib.contextmanager
def hangup_ignored() -> Iterator[None]:
    """Processes started inside ignore SIGHUP (NOTE [ Trainer signals ]); main thread only.
    (Windows has no SIGHUP: a closed console ends its processes.)"""
    if sys.platform == "win32" or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)
