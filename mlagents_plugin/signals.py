"""Ctrl-C and SIGTERM in the trainer process of ``mlagents-learn``.

# NOTE [ Trainer signals ]
# One Ctrl-C raises KeyboardInterrupt in the trainer; ML-Agents' TrainerController catches it,
# saves the model, and ``run_training`` closes the env manager: the ordinary, bounded ladder.
# Workers ignore SIGINT (NOTE [ Worker signals ]), so they are still there to be closed in order.
# A second Ctrl-C means "stop now": ``close()`` then kills the workers at once, whether the second
# interrupt lands during the model save (it raises out of the save, and ``close`` sees the count)
# or during ``close`` itself. SIGTERM gets the same treatment as Ctrl-C: by default it would end
# the trainer on the spot, with no model saved and nobody left to close the workers.
#
# The handlers are installed only in ``mlagents-learn`` (by the plugin, from the main thread) and
# only over Python's defaults, so a program that handles these signals itself keeps its handlers.
"""
import signal
import threading
from typing import Any

_interrupts = 0


def install() -> None:
    """Count SIGINT and SIGTERM, and turn both into KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) in (signal.default_int_handler, signal.SIG_DFL):
            signal.signal(sig, _interrupt)


def interrupted_twice() -> bool:
    return _interrupts >= 2


def _interrupt(signum: int, frame: Any) -> None:
    global _interrupts
    _interrupts += 1
    raise KeyboardInterrupt(f"{signal.Signals(signum).name} received")
