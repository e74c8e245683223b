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
# only over Python's defaults, so a program that handles these signals itself keeps its handlers,
# and a signal ignored from the start stays ignored (``nohup mlagents-learn ...``: SIGHUP).
#
# A stop signal is held (``deferred``) while the manager starts a worker (a restart: with its env
# parameters and RESET) or hands one to the shutdown ladder, while the ladder takes a step, while
# it handles what a wait brought (NOTE [ A wait is handled whole ]) and while it delivers what it
# sent: an interrupt in the middle would leave a process nobody knows of, a slot half released
# ("KeyError" from close()), a reply read and dropped, or a request taken out of the outbox and
# never sent. It is raised as soon as the block ends, a few milliseconds later (a write to a worker
# that does not read, stopped by SIGSTOP with a request over the pipe's 64 KiB waiting, holds it
# until the worker goes on). The waits themselves are not held: a Ctrl-C ends one at once.
#
# A KeyboardInterrupt can be lost: raised while a finalizer runs (a ``__del__``, a weakref
# callback: shared memory that is let go of, a generator closed by the collector), Python prints
# "Exception ignored in ..." and goes on, and training would go on after a Ctrl-C, a SIGTERM or
# a hangup. So the manager asks ``raise_if_lost`` before each step and reset: a trainer that asks for more after a
# stop signal was raised did not get it, and it is raised again there. (ML-Agents closes the env
# manager after an interrupt; it never steps it again.)
#
# A hangup reaches multiprocessing's helpers too (the fork server, the resource tracker), which
# ignore SIGINT but not SIGHUP: killed by it, the fork server takes the workers' exit codes with
# it and the resource tracker its registrations. An ignored signal stays ignored across fork and
# exec, so they are started with SIGHUP ignored.
"""
import contextlib
import signal
import sys
import threading
from typing import Any, Iterator, List, Optional

_interrupts = 0
_raised: Optional[int] = None  # the last stop signal raised as KeyboardInterrupt


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
    global _interrupts, _raised
    if _held is not None:  # inside ``deferred``: handled when it ends
        _held.append(signum)
        return
    _interrupts += 1
    _raised = signum
    raise KeyboardInterrupt(f"{signal.Signals(signum).name} received")


def interrupts() -> int:
    """How many stop signals this process has received so far."""
    return _interrupts


def raise_if_lost(since: int) -> None:
    """Raise again a stop signal's KeyboardInterrupt that a finalizer swallowed (NOTE [ Trainer
    signals ]): called where the trainer asks for more steps; ``since``: the count of ``interrupts``
    when the manager was built (one handled before, by an earlier run in the process, is not lost)."""
    if _interrupts > since and _raised is not None and threading.current_thread() is threading.main_thread():
        raise KeyboardInterrupt(f"{signal.Signals(_raised).name} received (raised again: it was lost)")


# The signals ``deferred`` holds, while it does; None outside it.
_held: Optional[List[int]] = None


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold the stop signals until the block ends, then handle them (NOTE [ Trainer signals ]).

    Our handler (``install``) holds them itself, so no handler is ever swapped under a signal;
    where Python's own Ctrl-C handler is in force (a program of its own, tests), SIGINT's alone
    is swapped for the block. Only the main thread receives signals; elsewhere, and inside an
    outer ``deferred``, this does nothing."""
    global _held
    if threading.current_thread() is not threading.main_thread() or _held is not None:
        yield
        return
    held: List[int] = []
    pythons = False
    _held = held
    try:
        pythons = signal.getsignal(signal.SIGINT) is signal.default_int_handler
        if pythons:
            signal.signal(signal.SIGINT, _interrupt)  # holds while _held is set
        yield
    finally:
        _held = None  # first: a SIGINT now is our handler's, not held (and never leaves _held set)
        if pythons:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if held and pythons:
            raise KeyboardInterrupt
        for signum in held[:-1]:  # each one counts (a second Ctrl-C is a second one) ...
            try:
                _interrupt(signum, None)
            except KeyboardInterrupt:
                pass
        if held:  # ... and the last one raises
            _interrupt(held[-1], None)


_INTERRUPTS = ("SIGINT", "SIGHUP")


@contextlib.contextmanager
def children_ignore_interrupts() -> Iterator[None]:
    """Processes started inside begin with SIGINT and SIGHUP blocked (NOTE [ Trainer
    signals ]); main thread only. The trainer receives its own when the block ends. On Windows a
    no-op: a console's Ctrl-C reaches every process in it."""
    if sys.platform == "win32" or threading.current_thread() is not threading.main_thread():
        yield
        return
    # multiprocessing starts its resource tracker on first need, blocking SIGINT for it and then
    # *unblocking* SIGINT here (bpo-33613): started first, it cannot undo our block of SIGINT, and
    # it inherits our block of SIGHUP, which it does not handle itself.
    from multiprocessing import resource_tracker

    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        resource_tracker.ensure_running()
        signal.pthread_sigmask(signal.SIG_BLOCK, {getattr(signal, name) for name in _INTERRUPTS})
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def unblock_interrupts() -> None:
    """In a process started by ``children_ignore_interrupts``, once it ignores (or handles) them."""
    if sys.platform != "win32":
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {getattr(signal, name) for name in _INTERRUPTS})
