"""SimpleEnvironment variants that misbehave on purpose, for testing env managers.

Every variant takes, besides SimpleEnvironment's arguments:

- ``after_steps``: the fault fires on that step (counted from 1), or at ``reset`` / ``init``
  when ``during`` says so;
- ``only_worker``: fire only in that worker slot (others behave);
- ``once_file``: fire only if this file does not exist yet, and create it, so the restarted
  env behaves (a restart is a new process: the marker is how it knows).
"""
import os
import signal
import threading
import time
from typing import Any, Callable, List, Optional, Type

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
        **kwargs: Any,
    ):
        if during not in ("init", "reset", "step"):
            raise ValueError(f"during must be 'init', 'reset' or 'step', not {during!r}")
        self.after_steps = after_steps
        self.during = during
        self.only_worker = only_worker
        self.once_file = once_file
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
        self.fire()

    def fire(self) -> None:
        raise NotImplementedError


class UnexpectedExceptionEnvironment(_FaultyEnvironment):
    """Raises ``exception_type(message)``."""

    def __init__(
        self, *args: Any, exception_type: Type[BaseException] = RuntimeError,
        message: str = "injected fault", **kwargs: Any
    ):
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
    """Stops answering. With ``ignore_sigterm`` it ignores SIGTERM too, like a worker stuck in
    native code: only SIGKILL removes it."""

    def __init__(self, *args: Any, ignore_sigterm: bool = False, **kwargs: Any):
        self.ignore_sigterm = ignore_sigterm
        super().__init__(*args, **kwargs)

    def fire(self) -> None:
        if self.ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
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


def _sleep_forever() -> None:
    while True:
        time.sleep(3600)
