"""The env worker process: build the env, serve the trainer's requests, report what goes wrong.

It imports mlagents-envs and the worker side of this package, never ML-Agents' trainers, torch
or the supervisor (NOTE [ Workers get no trainer settings ] in worker_inputs.py): a worker
starts in tens of milliseconds. About 400 lines: a worker's whole life (start, serve, the env's
failures, its signals, its end) reads in one place, and it is what a fork server preloads.
"""
import atexit
import contextlib
import os
import signal
import sys
import time
import types
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple

import cloudpickle
from mlagents_envs import logging_util
from mlagents_envs.base_env import BaseEnv
from mlagents_envs.env_utils import validate_environment_path
from mlagents_envs.exception import UnityEnvironmentException
from mlagents_envs.side_channel.default_training_analytics_side_channel import (
    DefaultTrainingAnalyticsSideChannel,
)
from mlagents_envs.side_channel.engine_configuration_channel import EngineConfigurationChannel
from mlagents_envs.side_channel.environment_parameters_channel import (
    EnvironmentParametersChannel,
)
from mlagents_envs.side_channel.side_channel import SideChannel
from mlagents_envs.side_channel.stats_side_channel import StatsSideChannel
from mlagents_envs.timers import get_timer_root, reset_timers

from mlagents_plugin.core import platform, signals, wire
from mlagents_plugin.core.errors import BuildNotFoundError, ProtocolError
from mlagents_plugin.core.names import command_name
from mlagents_plugin.core.protocol import (
    PARAMETER_METHODS,
    EnvironmentCommand,
    EnvironmentResponse,
    StepPayload,
    WorkerHello,
    WorkerSpec,
    describe_stop,
    pack,
    unpack_request,
    wrap_exception,
)
from mlagents_plugin.local import hardening, processes, rpc_server
from mlagents_plugin.local.readiness import WorkerConnection

logger = logging_util.get_logger(__name__)

TIMER_REPORT_INTERVAL_S = 1.0


# NOTE [ Worker signals ]
# SIGINT and SIGHUP: a Ctrl-C in a terminal, or the terminal's hangup, reaches the whole
# foreground process group, workers included (on Windows, a Ctrl-C reaches every process of the
# console). Workers ignore both so that the trainer alone decides how to stop: ML-Agents saves
# the model, then the env manager closes the workers in order (CLOSE, then the ladder). (The
# portable player watch handles SIGINT instead, to wake the main thread when a player dies, and
# ignores every other: NOTE [ Player death ].) A worker whose trainer is gone is the reaper's, on
# Linux; elsewhere it finds its pipe closed and leaves (NOTE [ No orphans ]).
# A worker starts with both blocked, and ignores them before it unblocks them (NOTE [ Trainer
# signals ]). SIGTERM (the ladder's, or anyone's: ``kill PID``, earlyoom, a container runtime): the default
# action would end the worker without running ``finally``, leaving its Unity player behind. The
# handler raises SystemExit instead, so the env is closed and the player killed on the way out,
# and the worker tells the trainer it was stopped (STOPPED: a worker failure, restarted like a
# death; never "the env raised SystemExit"). Two rules keep that safe. The handler never raises
# while the worker writes to its pipe: a message cut in half would corrupt the pipe for the
# trainer; it raises right after the write instead. And it acts once: a second SIGTERM must not
# cut the shutdown short (the ladder's SIGKILL bounds it). If the worker is stuck in native code
# the handler cannot run; the ladder then escalates to SIGKILL and kills the tagged player. (On
# Windows the ladder's SIGTERM is TerminateProcess: no handler runs, and the ladder kills the
# player it snapshotted.)
class _Stop(SystemExit):
    """A signal asked the worker to stop."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


def _kill_descendants() -> None:
    """Kill this worker's children and theirs."""
    processes.kill_processes(processes.descendants(os.getpid()), processes.LEFTOVER_GRACE_S)


class ProcessOptions(NamedTuple):
    """What a worker process gets from the process backend, besides the trainer's WorkerSpec."""

    owner_tag: str  # see NOTE [ No orphans ] in local/processes.py
    hardened: bool  # the Linux hardening, or the portable path (NOTE [ Portable core, Linux hardening ])
    # of its shared memory segments (NOTE [ Step wire format ]); None: the trainer may be on
    # another machine, so everything goes through the pipe
    segment_prefix: Optional[str]


def worker_main(conn: WorkerConnection, spec: WorkerSpec, options: ProcessOptions) -> None:
    """Process entry point."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # NOTE [ Worker signals ]
    if sys.platform != "win32":
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signals.unblock_interrupts()  # blocked since it started: NOTE [ Trainer signals ]
    processes.tag_this_process(options.owner_tag)
    logging_util.set_log_level(spec.log_level)
    code = 1  # what multiprocessing's bootstrap makes of the way the worker ends
    try:
        _Worker(conn, spec, options).run()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        raise
    finally:
        # The worker closed its env itself. A forked worker leaves by os._exit once
        # multiprocessing is done with it, and runs no atexit handler; a spawned one would run
        # them, then tear its modules down: mlagents-envs registers a handler for every
        # UnityEnvironment, which fails noisily on an env stopped while it was being built (no
        # ``_communicator`` yet), and torch's library finalizers fail once their module's globals
        # are gone. So a spawned one leaves the same way: registered last, this runs first.
        atexit.register(_leave, code)


def _leave(code: int) -> None:
    """The end of a worker, whatever started it: its output flushed, then ``os._exit``."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # closed, or gone
            stream.flush()
    os._exit(code)


def worker_preload() -> List[str]:
    """What a fork server imports once for all workers (NOTE [ Worker start-up ]): this module and
    the Linux layer its workers load (what the fork server has loaded, they share instead of each
    holding its own); the env factory's modules come on top (for a Unity build: mlagents-envs'
    UnityEnvironment)."""
    linux = ["mlagents_plugin.local.linux.hardening", "mlagents_plugin.local.linux.players"]
    return [__name__, *linux] if platform.hardened() else [__name__]


def start_worker(
    context: BaseContext, spec: WorkerSpec, options: ProcessOptions
) -> Tuple[BaseProcess, WorkerConnection]:
    """Start a worker process; return it and the trainer's end of its duplex pipe."""
    parent_conn, child_conn = context.Pipe(duplex=True)
    # typeshed's BaseContext has no Process; every concrete context (spawn, fork, forkserver) has one
    process = context.Process(  # type: ignore[attr-defined]
        target=worker_main,
        args=(child_conn, spec, options),
        name=f"mlagents-plugin-env-worker-{spec.worker_id}",
    )
    try:
        with _main_module_hidden(), signals.children_ignore_interrupts():  # NOTE [ Trainer signals ]
            process.start()
    except BaseException:
        parent_conn.close()
        child_conn.close()
        raise
    child_conn.close()  # so that the worker's death is an EOF at the other end, too
    return process, parent_conn


# NOTE [ Worker start-up ]
# A worker should cost what its env costs, no more: upstream's workers are forks of the trainer
# and start in milliseconds. Three things keep ours there.
# 1. No main module. Under spawn and forkserver, multiprocessing makes every new process import
#    the parent's main module again (as __mp_main__), so that functions defined there can be
#    unpickled. The trainer's main module is ``mlagents-learn`` (or a user's script), which
#    imports ML-Agents' trainers and torch: seconds of CPU per worker. (In a Ray actor it is
#    Ray's worker script, which must not run twice at all.) A worker needs none of it: its entry
#    point lives here, and env factories are cloudpickled, which ships anything defined in
#    __main__ by value. So while a worker is being started, sys.modules["__main__"] is swapped
#    for an empty module, and multiprocessing finds no main module to re-import. (The swap lasts
#    for the ``start()`` call; the main module is untouched.)
# 2. No trainer settings (NOTE [ Workers get no trainer settings ] in worker_inputs.py).
# 3. Imports paid once. The fork server imports what every worker needs (``worker_preload``)
#    and the modules the env factory is unpickled from (factories.modules_to_load: for a Unity
#    build, mlagents-envs' UnityEnvironment with gRPC and protobuf), so each worker is a fork
#    with all of it loaded, sharing those pages with its siblings. Under mlagents-learn the
#    plugin starts the fork server as soon as it has read the YAML (plugin.py). The server
#    imports them on the trainer's sys.path, which Python does not give it by itself
#    (NOTE [ The fork server's sys.path ] in fork_server.py). For a Python env in a program of
#    its own, the server is a fork of the trainer, which has imported them already (NOTE [ A
#    fork server forked from the trainer ]).
@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


class _AnalyticsChannel(DefaultTrainingAnalyticsSideChannel):
    """ML-Agents' training analytics channel, sending messages the trainer made
    (NOTE [ Workers get no trainer settings ])."""

    def send_raw(self, message: bytes) -> None:
        self.message_queue.append(bytearray(message))


_ENV_INTERFACE = ("behavior_specs", "reset", "step", "get_steps", "set_actions", "close")


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Worker:
    def __init__(self, conn: WorkerConnection, spec: WorkerSpec, options: ProcessOptions):
        self.conn = conn
        self.spec = spec
        self.env: Optional[BaseEnv] = None
        self.command: Optional[EnvironmentCommand] = None  # being served, for error reports
        self.env_parameters = EnvironmentParametersChannel()
        self.stats_channel = StatsSideChannel()
        self.engine_channel = EngineConfigurationChannel()
        self.engine_channel.set_configuration(spec.engine_config)
        self.analytics: Optional[_AnalyticsChannel] = None
        self.players = hardening.layer(options.hardened).player_watch()
        self.players.hook_launches()
        rpc_server.install(spec.listen)  # NOTE [ One run per port ], NOTE [ Loopback only ]
        self.encoder = wire.Encoder(options.segment_prefix)
        self.sent_spec_count = 0
        self.last_timer_report = time.monotonic()
        self.sending = False
        self.stop_signal: Optional[int] = None  # set by SIGTERM: NOTE [ Worker signals ]
        self.stopping = False

    def send(self, cmd: EnvironmentCommand, payload: Any = None) -> None:
        data = pack(EnvironmentResponse(cmd, self.spec.worker_id, self.spec.incarnation, payload))
        self.sending = True  # NOTE [ Worker signals ]: no SIGTERM in the middle of a message
        try:
            self.conn.send_bytes(data)
            self.command = None  # answered: a stop from now on comes between requests
        finally:
            self.sending = False
        if self.stop_signal is not None and not self.stopping:
            self._stop()

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: NOTE [ Worker signals ]
        self.stop_signal = signum
        if not self.sending:
            self._stop()

    def _stop(self) -> None:
        assert self.stop_signal is not None
        self.stopping = True
        raise _Stop(self.stop_signal)

    def run(self) -> None:
        """Serve until CLOSE; report what ends it otherwise (NOTE [ Exceptions cross as
        themselves; the rest is a worker failure ] in protocol.py)."""
        signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            self._build_env()
            self._serve()
        except Exception as exc:  # the env raised it: the trainer raises the same
            logger.debug(f"Env worker {self.spec.worker_id}: {exc!r}")
            self._try_send(EnvironmentCommand.ENV_EXITED, wrap_exception(exc, self.command))
        except BaseException as exc:  # a signal, or the env's SystemExit/KeyboardInterrupt
            logger.debug(f"Env worker {self.spec.worker_id} stops: {exc!r}")
            signum = exc.signum if isinstance(exc, _Stop) else None
            report = describe_stop(exc, self.command, signum, env_built=self.env is not None)
            self._try_send(EnvironmentCommand.STOPPED, report)
        finally:
            self._shut_down()

    def _build_env(self) -> None:
        side_channels: List[SideChannel] = [
            self.env_parameters,
            self.engine_channel,
            self.stats_channel,
        ]
        if self.spec.analytics is not None:  # as upstream: worker 0 reports training analytics
            self.analytics = _AnalyticsChannel()
            side_channels.append(self.analytics)
        factory: Callable[[int, List[SideChannel]], BaseEnv] = cloudpickle.loads(
            self.spec.pickled_env_factory
        )
        try:
            with self.players.env_call():  # a player that dies in the handshake: NOTE [ Player death ]
                env = factory(self.spec.env_worker_id, side_channels)
        except UnityEnvironmentException as e:
            path = self.spec.env_path
            if path is not None and validate_environment_path(path) is None:
                raise BuildNotFoundError(
                    f"There is no Unity build at --env={path!r} (looked from {os.getcwd()!r}, "
                    "with and without .x86_64/.x86): check the path."
                ) from e
            raise
        missing = [name for name in _ENV_INTERFACE if not hasattr(env, name)]
        if missing:
            raise TypeError(
                f"The env factory returned {type(env).__name__} {_short_repr(env)}, not an ML-Agents "
                f"env (a BaseEnv): it has no {', '.join(missing)}."
            )
        self.env = env
        self.players.watch_other_players()  # NOTE [ Player death ]
        capabilities = getattr(self.env, "academy_capabilities", None)
        if self.analytics is not None and self.spec.analytics is not None:
            if capabilities is not None and capabilities.trainingAnalytics:
                self.analytics.send_raw(self.spec.analytics)
            else:
                self.analytics = None
        self.send(
            EnvironmentCommand.READY, WorkerHello(os.getpid(), self._new_behavior_specs())
        )

    def _serve(self) -> None:
        assert self.env is not None  # _build_env made it
        while True:
            data = self.conn.recv_bytes()
            started = time.perf_counter()
            request = unpack_request(data)
            self.command = request.cmd
            if request.cmd == EnvironmentCommand.STEP:
                with self.players.env_call():
                    for behavior_name, env_action in request.payload.items():
                        self.env.set_actions(behavior_name, env_action)
                    self.env.step()
                self.send(EnvironmentCommand.STEP, self._step_payload(started))
            elif request.cmd == EnvironmentCommand.RESET:
                with self.players.env_call():
                    self.env.reset()
                self.send(EnvironmentCommand.RESET, self._step_payload(started))
            elif request.cmd == EnvironmentCommand.ENVIRONMENT_PARAMETERS:
                for method, args in request.payload:
                    if method not in PARAMETER_METHODS:
                        raise ProtocolError(
                            f"env worker {self.spec.worker_id} refuses the parameter call {method!r}: "
                            f"only {', '.join(PARAMETER_METHODS)} may be called"
                        )
                    getattr(self.env_parameters, method)(*args)
            elif request.cmd == EnvironmentCommand.TRAINING_STARTED:
                if self.analytics is not None:
                    self.analytics.send_raw(request.payload)
            elif request.cmd == EnvironmentCommand.CLOSE:
                return
            else:  # a reply's command, or one this worker does not know: never dropped silently
                raise ProtocolError(
                    f"env worker {self.spec.worker_id} cannot serve {command_name(request.cmd)}: it is not "
                    "a request a worker serves"
                )
            self.command = None

    def _step_payload(self, started: float) -> StepPayload:
        """The env's step results; ``started``: when the request was read (``perf_counter``)."""
        env = self.env
        assert env is not None
        failed_before = self.encoder.shared_memory_failed
        encoded = self.encoder.encode({name: env.get_steps(name) for name in env.behavior_specs})
        if self.encoder.shared_memory_failed and not failed_before:
            logger.warning(
                f"Env worker {self.spec.worker_id}: {self.encoder.shared_memory_failed}. Its large "
                "observations go through the pipe instead, slower. In a Docker container, /dev/shm "
                "is 64 MB unless `docker run --shm-size=2g` (or docker-compose's shm_size) says more."
            )
        return StepPayload(
            encoded,
            self.stats_channel.get_and_reset_stats(),
            self._new_behavior_specs(),
            self._timers_if_due(),
            time.perf_counter() - started,
        )

    def _new_behavior_specs(self) -> Optional[Dict[str, Any]]:
        """All behaviour specs, but only when the env knows of behaviours not reported yet."""
        assert self.env is not None
        specs = self.env.behavior_specs
        if len(specs) == self.sent_spec_count:
            return None
        self.sent_spec_count = len(specs)
        return dict(specs)

    def _timers_if_due(self) -> Any:
        """This process's timer tree about once a second (then reset), so the trainer can merge it."""
        now = time.monotonic()
        if now - self.last_timer_report < TIMER_REPORT_INTERVAL_S:
            return None
        self.last_timer_report = now
        root = get_timer_root()
        reset_timers()
        return root

    def _shut_down(self) -> None:
        # Closing already: a SIGTERM now (a trainer hurrying its close) would only cut the env's
        # own close short; the trainer's SIGKILL, after its deadline, still ends it.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self.players.disarm()  # the player exits on purpose now
        self.encoder.close()
        if self.env is not None:
            try:
                self.env.close()
            except Exception:
                logger.debug("Env worker %s: env.close() raised", self.spec.worker_id, exc_info=True)
        _kill_descendants()  # a player is still our child here; orphans are the supervisor's
        root = get_timer_root()
        self._try_send(EnvironmentCommand.CLOSED, root)
        self.conn.close()

    def _try_send(self, cmd: EnvironmentCommand, payload: Any) -> None:
        try:
            self.send(cmd, payload)
        except (OSError, EOFError):
            pass  # the trainer is gone or stopped listening: nothing to report to
