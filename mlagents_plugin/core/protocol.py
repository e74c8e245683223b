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
from typing import Any, Dict, NamedTuple, Optional, Tuple, Union

import cloudpickle
import numpy as np
from mlagents_envs.base_env import ActionTuple
from mlagents_envs.side_channel.engine_configuration_channel import EngineConfig
from mlagents_envs.side_channel.stats_side_channel import StatsAggregationMethod


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
    ENV_EXITED = 6  # the env raised an Exception; payload: ExceptionEnvelope. The worker exits next.
    CLOSED = 7  # shutdown sentinel: the env is closed and the worker is about to exit.
    READY = 9  # the env exists; payload is a WorkerHello.
    STOPPED = 10  # a signal or a BaseException stops the worker; payload: StopReport. It exits next.


# What a worker says last before it exits by itself: its backend reads nothing after it.
LAST_WORDS = (EnvironmentCommand.ENV_EXITED, EnvironmentCommand.STOPPED)


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


# ENVIRONMENT_PARAMETERS carries calls to make on the worker's EnvironmentParametersChannel,
# recorded in the trainer from ML-Agents' ParameterRandomizationSettings (which a worker does
# not import: they live beside the trainer settings). Only these methods may be called.
PARAMETER_METHODS = (
    "set_float_parameter",
    "set_uniform_sampler_parameters",
    "set_gaussian_sampler_parameters",
    "set_multirangeuniform_sampler_parameters",
)
ParameterCall = Tuple[str, Tuple[Any, ...]]


class WorkerSpec(NamedTuple):
    """Everything the trainer starts a worker incarnation with, on any backend (the process
    backend adds its own part: local/worker.py's ``ProcessOptions``)."""

    worker_id: int  # the trainer's index for this worker slot
    incarnation: int  # how many times this slot was started before
    env_worker_id: int  # passed to the env factory; a Unity build's port is base_port + this
    pickled_env_factory: bytes
    env_path: Optional[str]  # the Unity build the factory launches (--env), if any
    engine_config: EngineConfig
    # ML-Agents' "environment initialized" analytics message, for worker 0 only: sent if the
    # env asks for training analytics, as upstream's worker 0 does
    analytics: Optional[bytes]
    log_level: int
    listen: str  # env_manager.listen: where its gRPC server for a Unity build listens


class WorkerHello(NamedTuple):
    """Sent once with READY, after the env factory returned."""

    pid: int
    behavior_specs: Optional[Dict[str, Any]]  # None if the env knows of no behaviour yet


class EncodedSteps(NamedTuple):
    """A step's results as wire.py lays them out (NOTE [ Step wire format ])."""

    # per behaviour: (name, decision obs count, mask branch count or -1, terminal obs count)
    behaviors: Tuple[Tuple[str, int, int, int], ...]
    slots: Tuple[Tuple[str, Tuple[int, ...], bool, int], ...]  # dtype, shape, shared?, offset
    buffer: bytearray
    segment: Optional[str]  # the worker's shared memory segment, if any array is there


class StepPayload(NamedTuple):
    """The payload of a STEP or RESET response.

    ``all_step_result`` is encoded (wire.py, NOTE [ Step wire format ]). ``behavior_specs`` is
    only set when the env reports behaviours it had not reported before, and ``timer_root`` only
    about once a second: neither is sent on every step. ``step_s`` is how long the worker spent
    on the request, from reading it to replying (NOTE [ Gathering a batch ] in gathering.py).
    """

    all_step_result: EncodedSteps
    environment_stats: Dict[str, Any]
    behavior_specs: Optional[Dict[str, Any]] = None
    timer_root: Any = None
    step_s: float = 0.0


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


# NOTE [ Packing messages ]
# Pickle rebuilds a NamedTuple or an enum member through a global lookup and a Python call:
# about 10 µs per message each way for our envelopes, against half a microsecond for plain
# tuples and ints, on every step of every worker. ``pack`` and ``unpack`` put the messages on
# the wire as plain tuples (commands as their values; a step's payload, its encoded results and
# its stats' aggregation methods flattened; actions as (dtype, shape, bytes)) and rebuild the
# named forms on the other side. Pickle rebuilds an ndarray through numpy's reduce, about 4 µs
# per array each way, and a STEP carries two per behaviour; the worker still gets writable
# arrays, as unpickled ones are (an env may clip its actions in place). Plain ``pickle`` is
# used, not multiprocessing's ForkingPickler, whose per-message setup costs as much again and
# whose extra reducers (for sockets, pipes) nothing here needs.
_COMMANDS = {command.value: command for command in EnvironmentCommand}
_STEP_RESULTS = (EnvironmentCommand.STEP, EnvironmentCommand.RESET)


def pack(message: Union[EnvironmentRequest, EnvironmentResponse]) -> bytes:
    payload = message.payload
    if isinstance(payload, StepPayload):
        stats = {k: [(value, method.value) for value, method in v] for k, v in payload.environment_stats.items()}
        payload = (tuple(payload.all_step_result), stats, payload.behavior_specs, payload.timer_root, payload.step_s)
    elif message.cmd is EnvironmentCommand.STEP and isinstance(message, EnvironmentRequest):
        payload = {name: (_raw(a.continuous), _raw(a.discrete)) for name, a in payload.items()}
    return pickle.dumps(
        (message.cmd.value, message.worker_id, message.incarnation, payload), pickle.HIGHEST_PROTOCOL
    )


def unpack_request(data: bytes) -> EnvironmentRequest:
    command, worker_id, incarnation, payload = pickle.loads(data)
    command = _COMMANDS[command]
    if command is EnvironmentCommand.STEP:
        payload = {name: ActionTuple(_array(*c), _array(*d)) for name, (c, d) in payload.items()}
    return EnvironmentRequest(command, worker_id, incarnation, payload)


def _raw(array: np.ndarray) -> Tuple[str, Tuple[int, ...], bytes]:
    return array.dtype.str, array.shape, array.tobytes()


def _array(dtype: str, shape: Tuple[int, ...], raw: bytes) -> np.ndarray:
    return np.frombuffer(bytearray(raw), dtype).reshape(shape)


def unpack_response(data: bytes) -> EnvironmentResponse:
    command, worker_id, incarnation, payload = pickle.loads(data)
    command = _COMMANDS[command]
    if command in _STEP_RESULTS:
        encoded, stats, specs, timer_root, step_s = payload
        stats = {k: [(value, StatsAggregationMethod(m)) for value, m in v] for k, v in stats.items()}
        payload = StepPayload(EncodedSteps(*encoded), stats, specs, timer_root, step_s)
    return EnvironmentResponse(command, worker_id, incarnation, payload)


# NOTE [ Exceptions cross as themselves; the rest is a worker failure ]
# What ends a worker reaches the trainer one of two ways, by one rule. An ``Exception`` the env
# raised (in its factory, reset, step, or side-channel handling) is the env's error: it crosses
# as an ExceptionEnvelope and the trainer raises the same type (NOTE [ Exception round trip ]),
# restarted only if it is one of ML-Agents' Unity exceptions or listed in ``restart_on``.
# Anything else is the worker failing, never the env's error for the trainer to raise: a
# signal (SIGTERM from ``kill``, earlyoom or a container runtime, turned into SystemExit by
# NOTE [ Worker signals ]) or a BaseException from the env (KeyboardInterrupt, ``sys.exit(0)``).
# It crosses as a StopReport and becomes a WorkerDiedError naming the signal or the exception,
# restarted like any death. Raised in the trainer as itself, a SystemExit would end
# ``mlagents-learn`` as if asked to, and a KeyboardInterrupt would be ML-Agents' Ctrl-C: "Learning
# was interrupted", exit code 0, and a CI job that passes.
class StopReport(NamedTuple):
    """Why a worker stopped, when it was not its env raising an Exception."""

    signal: Optional[int]  # the signal that stopped it, if one did
    type_name: str
    message: str
    traceback: str
    command: Optional[EnvironmentCommand]  # being served, if any
    env_built: bool = False  # else it stopped while building its env


def describe_stop(
    exc: BaseException, command: Optional[EnvironmentCommand], signum: Optional[int], env_built: bool = False
) -> StopReport:
    return StopReport(
        signum,
        qualified_name(type(exc)),
        _safe_str(exc),
        "".join(traceback.format_exception(exc)),
        command,
        env_built,
    )


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
