"""The vocabulary both sides of a worker pipe speak.

Requests travel trainer -> worker, responses worker -> trainer, one duplex ``Pipe`` per
worker. Both envelopes carry the worker id and the incarnation (how many times that worker
slot has been started before), so the supervisor can drop anything sent by a worker it has
already replaced. Names follow ML-Agents' ``subprocess_env_manager`` so the two diff well.

This module imports nothing from the rest of the package: the worker and the supervisor both
depend on it, never on each other.
"""
import enum
import pickle
import traceback
from typing import Any, Dict, NamedTuple, Optional

import cloudpickle


class EnvironmentCommand(enum.Enum):
    """What a request asks for, or what a response answers.

    The numbering of the commands shared with upstream is upstream's.
    """

    # trainer -> worker
    STEP = 1
    ENVIRONMENT_PARAMETERS = 3
    RESET = 4
    CLOSE = 5
    TRAINING_STARTED = 8
    # worker -> trainer
    ENV_EXITED = 6  # the env raised; payload is an ExceptionEnvelope. The worker exits next.
    CLOSED = 7  # shutdown sentinel: the env is closed and the worker is about to exit.
    READY = 9  # the env exists; payload is a WorkerHello.


class EnvironmentRequest(NamedTuple):
    cmd: EnvironmentCommand
    worker_id: int
    incarnation: int
    payload: Any = None


class EnvironmentResponse(NamedTuple):
    cmd: EnvironmentCommand
    worker_id: int
    incarnation: int
    payload: Any = None


class WorkerHello(NamedTuple):
    """Sent once with READY, after the env factory returned."""

    pid: int
    behavior_specs: Dict[str, Any]


class StepPayload(NamedTuple):
    """The payload of a STEP or RESET response.

    ``behavior_specs`` is only set when the env reports behaviours it had not reported
    before, and ``timer_root`` only about once a second: neither is sent on every step.
    """

    all_step_result: Dict[str, Any]
    environment_stats: Dict[str, Any]
    behavior_specs: Optional[Dict[str, Any]] = None
    timer_root: Any = None


class ExceptionEnvelope(NamedTuple):
    """An exception raised in a worker, made safe to send.

    The text fields always arrive. ``pickled`` holds the exception itself only when the
    worker checked that it survives a pickle round trip as the same type; the trainer rebuilds
    it from there, or falls back to the text.
    """

    type_name: str
    message: str
    traceback: str
    command: Optional[EnvironmentCommand]
    pickled: Optional[bytes]


def qualified_name(cls: type) -> str:
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def wrap_exception(
    exc: BaseException, command: Optional[EnvironmentCommand]
) -> ExceptionEnvelope:
    """Describe ``exc`` so that the trainer can raise it again (see NOTE [ Exception round trip ])."""
    tb_text = "".join(traceback.format_exception(exc))
    return ExceptionEnvelope(
        type_name=qualified_name(type(exc)),
        message=_safe_str(exc),
        traceback=tb_text,
        command=command,
        pickled=_round_trip_or_none(exc),
    )


# NOTE [ Exception round trip ]
# An exception can fail to cross a process boundary in three ways: pickling raises (it holds a
# lock, a socket, a generator), unpickling raises (an ``__init__`` with two required arguments:
# pickle rebuilds exceptions as ``cls(*self.args)``), or unpickling yields something else. Upstream
# sends the exception object itself through the pipe, so the first kills the worker's reply and
# the second raises an unrelated TypeError inside the trainer's ``recv``. Here the worker tries
# the round trip before sending and ships the bytes only if it gives back the same type with the
# same message (a rebuilt UnityWorkerInUseException, for one, formats its message twice); the
# envelope itself holds only strings and bytes, so sending it cannot fail. The trainer unpickles
# again (it may lack a module the worker had) and falls back to RemoteWorkerError built from the
# text fields. cloudpickle is used so exception classes defined by value (in ``__main__``, in a
# test module shipped by value) survive as well as importable ones.
def _round_trip_or_none(exc: BaseException) -> Optional[bytes]:
    try:
        data = cloudpickle.dumps(exc)
        rebuilt = pickle.loads(data)
    except Exception:
        return None
    if type(rebuilt) is not type(exc) or _safe_str(rebuilt) != _safe_str(exc):
        return None  # e.g. an __init__ that formats its argument: rebuilt, it says something else
    return data


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return f"<str() of {type(exc).__name__} failed>"
