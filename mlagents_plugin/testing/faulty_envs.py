"""SimpleEnvironment variants that misbehave on purpose, for testing env managers.

Every variant takes, besides SimpleEnvironment's arguments:

- ``after_steps``: the fault fires on that step (counted from 1), or in ``init``, ``reset`` or
  ``close`` when ``during`` says so;
- ``only_worker``: fire only in that worker slot (others behave);
- ``once_file``: fire only if this file does not exist yet, and create it, so the restarted
  env behaves (a restart is a new process: the marker is how it knows).
"""
import builtins
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterator, List, Optional, Sequence, Type, Union

from mlagents_envs.exception import UnityCommunicationException
from mlagents_envs.side_channel.side_channel import SideChannel

from mlagents_plugin.testing.simple_env import SimpleEnvironment


class _FaultyEnvironment(SimpleEnvironment):
    def __init__(
        self,
        *args: Any,
        after_steps: int = 1,
        during: str = "step",
        only_worker: Optional[int] = None,
        once_file: Optional[str] = None,
        fired_dir: Optional[str] = None,
        **kwargs: Any,
    ):
        if during not in ("init", "reset", "step", "close"):
            raise ValueError(f"during must be 'init', 'reset', 'step' or 'close', not {during!r}")
        self.after_steps = after_steps
        self.during = during
        self.only_worker = only_worker
        self.once_file = once_file
        self.fired_dir = fired_dir  # where a file named after the worker id says the fault is firing
        self._initialized = False
        super().__init__(*args, **kwargs)
        self._initialized = True
        self._maybe_fire("init")

    def reset(self) -> None:
        super().reset()
        if self._initialized:
            self._maybe_fire("reset")

    def step(self) -> None:
        super().step()
        if self.step_count >= self.after_steps:
            self._maybe_fire("step")

    def close(self) -> None:
        self._maybe_fire("close")
        super().close()

    def _maybe_fire(self, moment: str) -> None:
        if moment != self.during:
            return
        if self.only_worker is not None and self.worker_id != self.only_worker:
            return
        if self.once_file is not None:
            try:
                with open(self.once_file, "x"):
                    pass
            except FileExistsError:
                return
        if self.fired_dir is not None:
            with open(os.path.join(self.fired_dir, str(self.worker_id)), "w"):
                pass
        self.fire()

    def fire(self) -> None:
        raise NotImplementedError


class UnexpectedExceptionEnvironment(_FaultyEnvironment):
    """Raises ``exception_type(message)``: a class, or the name of a builtin one (for YAML:
    ``exception_type: KeyboardInterrupt``)."""

    def __init__(
        self, *args: Any, exception_type: Union[Type[BaseException], str] = RuntimeError,
        message: str = "injected fault", **kwargs: Any
    ):
        if isinstance(exception_type, str):
            exception_type = getattr(builtins, exception_type)
        assert isinstance(exception_type, type) and issubclass(exception_type, BaseException)
        self.exception_type = exception_type
        self.message = message
        super().__init__(*args, **kwargs)

    def fire(self) -> None:
        raise self.exception_type(self.message)


class HardExitEnvironment(_FaultyEnvironment):
    """Ends its process without a word: ``os._exit(exit_code)``, or ``signal`` sent to itself."""

    def __init__(
        self, *args: Any, exit_code: int = 3, signal_number: Optional[int] = None, **kwargs: Any
    ):
        self.exit_code = exit_code
        self.signal_number = signal_number
        super().__init__(*args, **kwargs)

    def fire(self) -> None:
        if self.signal_number is not None:
            os.kill(os.getpid(), self.signal_number)
            time.sleep(10)  # a handled or blocked signal must not let the env carry on
        os._exit(self.exit_code)


class HangingEnvironment(_FaultyEnvironment):
    """Stops answering. With ``ignore_sigterm`` it ignores SIGTERM too: only SIGKILL removes it.
    With ``in_c`` it spins in C code that holds the GIL (a catastrophic regex), like an env stuck
    in a native loop: no Python code of its process (signal handlers, threads) runs again."""

    def __init__(self, *args: Any, ignore_sigterm: bool = False, in_c: bool = False, **kwargs: Any):
        self.ignore_sigterm = ignore_sigterm
        self.in_c = in_c
        super().__init__(*args, **kwargs)

    def fire(self) -> None:
        if self.ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if self.in_c:
            re.match(r"(a+)+$", "a" * 64 + "b")  # 2**64 steps of backtracking, GIL held
        _sleep_forever()


class LockHoldingError(Exception):
    """Cannot be pickled: it holds a lock."""

    def __init__(self, message: str):
        super().__init__(message)
        self.lock = threading.Lock()


class TwoArgumentError(Exception):
    """Pickles, but cannot be rebuilt: pickle calls ``cls(*args)`` with one argument."""

    def __init__(self, code: int, detail: str):
        super().__init__(f"{detail} (code {code})")
        self.code = code
        self.detail = detail


class UnpicklableExceptionEnvironment(UnexpectedExceptionEnvironment):
    """Raises an exception that cannot cross a process boundary: ``kind`` "lock" or "two_args"."""

    def __init__(self, *args: Any, kind: str = "lock", **kwargs: Any):
        self.kind = kind
        super().__init__(*args, **kwargs)

    def fire(self) -> None:
        if self.kind == "lock":
            raise LockHoldingError(self.message)
        raise TwoArgumentError(7, self.message)


def raising_factory(
    exception_type: Type[BaseException] = RuntimeError, message: str = "factory failed"
) -> Callable[[int, List[SideChannel]], Any]:
    """An env factory that raises instead of building an env."""

    def factory(worker_id: int, side_channels: List[SideChannel]) -> Any:
        raise exception_type(message)

    return factory


@contextlib.contextmanager
def locked(file: Any) -> Iterator[None]:
    """Hold an exclusive lock on ``file`` (released, too, if this process dies)."""
    if sys.platform == "win32":
        import msvcrt

        file.seek(0)
        msvcrt.locking(file.fileno(), msvcrt.LK_LOCK, 1)
        try:
            yield
        finally:
            file.seek(0)
            msvcrt.locking(file.fileno(), msvcrt.LK_UNLCK, 1)
    else:
        import fcntl

        fcntl.flock(file, fcntl.LOCK_EX)
        yield  # released when the file is closed


def _sleep_forever() -> None:
    while True:
        time.sleep(3600)


class PlayerLaunchingEnvironment(SimpleEnvironment):
    """Starts a stand-in for a Unity player, the way mlagents-envs starts one: a child process in
    its own session (``start_new_session=True``), so it is outside the worker's process group.

    Each player's pid is written as a file name into ``player_pid_dir``, so a test can check
    afterwards that every player is gone. ``close()`` stops the player, as UnityEnvironment does.
    """

    def __init__(self, *args: Any, player_pid_dir: str, **kwargs: Any):
        self.player = subprocess.Popen(
            [sys.executable, "-c", "import time\nwhile True: time.sleep(3600)"],
            start_new_session=True,
        )
        open(os.path.join(player_pid_dir, str(self.player.pid)), "w").close()
        super().__init__(*args, **kwargs)

    def close(self) -> None:
        self.player.kill()
        self.player.wait()


class SlowClosingEnvironment(SimpleEnvironment):
    """``close()`` takes ``close_s`` seconds, as a Unity player may to quit. Into ``closed_dir``
    it writes ``<worker id>.closing`` when it starts and ``<worker id>`` when it is done, so a
    test can tell where it is."""

    def __init__(self, *args: Any, close_s: float, closed_dir: str, **kwargs: Any):
        self.close_s = close_s
        self.closed_dir = closed_dir
        super().__init__(*args, **kwargs)

    def close(self) -> None:
        open(os.path.join(self.closed_dir, f"{self.worker_id}.closing"), "w").close()
        time.sleep(self.close_s)
        open(os.path.join(self.closed_dir, str(self.worker_id)), "w").close()


FAULT_KINDS = ("exception", "exit", "hang", "unity")


class RandomFaultEnvironment(SimpleEnvironment):
    """Fails at random steps, in a random way, and writes each fault to ``fault_log`` first.

    :param fault_probability: the chance that a step fails.
    :param kinds: which of "exception" (``exception_type``), "exit" (``os._exit(5)``), "hang"
        and "unity" (UnityCommunicationException) to draw from.
    :param max_faults: faults stop once ``fault_log`` holds this many, across all workers.
    """

    def __init__(
        self,
        *args: Any,
        fault_log: str,
        fault_probability: float = 0.01,
        kinds: Sequence[str] = FAULT_KINDS,
        exception_type: Type[BaseException] = RuntimeError,
        max_faults: Optional[int] = None,
        **kwargs: Any,
    ):
        self.fault_log = fault_log
        self.fault_probability = fault_probability
        self.kinds = tuple(kinds)
        self.exception_type = exception_type
        self.max_faults = max_faults
        super().__init__(*args, **kwargs)
        self.fault_rng = random.Random(os.getpid())

    def step(self) -> None:
        super().step()
        if self.fault_rng.random() < self.fault_probability:
            kind = self.fault_rng.choice(self.kinds)
            if self._log_fault(kind):
                self._fire(kind)

    def _log_fault(self, kind: str) -> bool:
        """Append the fault to the log, unless ``max_faults`` are in it already (locked: every
        worker writes to the same log)."""
        with open(self.fault_log, "a+") as log, locked(log):
            log.seek(0)
            if self.max_faults is not None and len(log.readlines()) >= self.max_faults:
                return False
            log.write(f"{self.worker_id} {os.getpid()} {kind}\n")
            return True

    def _fire(self, kind: str) -> None:
        if kind == "exception":
            raise self.exception_type("random fault")
        if kind == "exit":
            os._exit(5)
        if kind == "hang":
            _sleep_forever()
        raise UnityCommunicationException("random fault")
