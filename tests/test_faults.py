"""The fault model (docs/faults.md) with real worker processes: what a death or a hang is called,
a hang while starting or resetting, exceptions that do not travel, start-up failures, port moves,
the restart quota, health. Restarts after a death, a hang or a SIGKILL, under every start method:
test_contract.py; the backoff: test_lifecycle.py."""
import functools
import logging
import os
import signal
import socket
import sys

import psutil
import pytest
from helpers import HOLDERS_VISIBLE, SPAWN_ONLY, free_port_block, step_until
from mlagents.trainers.learn import create_environment_factory
from mlagents_envs.exception import (
    UnityCommunicationException,
    UnityEnvironmentException,
    UnityTimeOutException,
)
from mlagents_envs.rpc_communicator import RpcCommunicator

from mlagents_plugin.core.errors import ProtocolError, RemoteWorkerError, WorkerDiedError, WorkerTimeoutError
from mlagents_plugin.core.protocol import EnvironmentCommand
from mlagents_plugin.testing import (
    HangingEnvironment,
    HardExitEnvironment,
    SimpleEnvironment,
    UnexpectedExceptionEnvironment,
    UnpicklableExceptionEnvironment,
    make_factory,
)
from mlagents_plugin.testing.training import train

START_METHODS = [pytest.param("forkserver", marks=SPAWN_ONLY), "spawn", pytest.param("fork", marks=SPAWN_ONLY)]
FAST = dict(restart_backoff_s=0.0)


class ListedError(Exception):
    pass


def step_n(manager, n):
    for _ in range(n):
        manager.get_steps()


def last_worker_faults(env_class, num_envs, tmp_path, **kwargs):
    """The last worker misbehaves once, after 3 steps; the restarted one behaves."""
    return make_factory(
        env_class,
        after_steps=3,
        only_worker=num_envs - 1,
        once_file=str(tmp_path / "fired"),
        step_sleep_s=0.005,
        **kwargs,
    )


# ------------------------------------------------------------------------- hard death


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "how, expected",
    [
        # (SIGKILL's explanation: test_contract.py's test_a_killed_worker_is_a_worker_death_naming_it)
        pytest.param("sigsegv", "was killed by SIGSEGV: a crash in native code", marks=pytest.mark.skipif(
            sys.platform == "win32", reason="a kill by SIGSEGV is TerminateProcess on Windows: an exit code there")),
        ("exit", "exited with code 3"),
        # what multiprocessing reports for a worker whose fork server died (NOTE [ A fork server
        # dies ]): the server lives, so it is the worker's own exit, and counted
        ("exit 255", "exited with code 255"),
    ],
)
def test_death_is_explained(run_options, env_manager_factory, how, expected):
    """Noticed by the sentinel (step_timeout_s is far beyond the test's timeout), named, and
    raised once the quota (here none) is spent."""
    run_options.env_settings.max_lifetime_restarts = 0
    kwargs = {
        "sigsegv": dict(signal_number=signal.SIGSEGV), "exit": dict(exit_code=3), "exit 255": dict(exit_code=255)
    }.get(how, {})
    factory = make_factory(HardExitEnvironment, after_steps=3, only_worker=1, **kwargs)
    manager = env_manager_factory(factory, 2, step_timeout_s=600)
    manager.reset()
    pid = manager.worker_pids[1]
    with pytest.raises(WorkerDiedError) as info:
        step_until(manager, lambda: False)
    assert f"env worker 1 (pid {pid}) {expected}" in str(info.value)
    codes = {"sigsegv": -signal.SIGSEGV, "exit": 3, "exit 255": 255}
    assert info.value.exitcode == codes[how]
    assert any("no restarts left" in note for note in info.value.__notes__)


# ------------------------------------------------------------------------------ hangs


@pytest.mark.timeout(60)
@pytest.mark.parametrize("during", ["init", "reset"])
def test_hang_while_starting_or_resetting_is_restarted(env_manager_factory, tmp_path, during):
    factory = make_factory(HangingEnvironment, during=during, once_file=str(tmp_path / "fired"))
    manager = env_manager_factory(
        factory, 2, startup_timeout_s=3.0 if during == "init" else 20.0, step_timeout_s=2.0,
        kill_grace_s=1.0, **FAST
    )
    manager.reset()
    step_until(manager, lambda: manager.restart_counts.get("hung") == 1)
    step_until(manager, lambda: len(manager.worker_pids) == 2)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "during, startup_timeout_s, doing",
    [("init", 2.0, "did not finish building its env within startup_timeout_s=2.0 s"),
     ("step", 20.0, "did not answer STEP within step_timeout_s=1.0 s")],
)
def test_hang_beyond_the_quota_says_what_it_was_doing(
    run_options, env_manager_factory, during, startup_timeout_s, doing
):
    run_options.env_settings.max_lifetime_restarts = 0
    factory = make_factory(HangingEnvironment, during=during, after_steps=2)
    manager = env_manager_factory(
        factory, 1, startup_timeout_s=startup_timeout_s, step_timeout_s=1.0, kill_grace_s=0.5
    )
    with pytest.raises(WorkerTimeoutError, match=doing):
        manager.reset()
        step_until(manager, lambda: False)


# ---------------------------------------------------------- exceptions that do not travel


@pytest.mark.timeout(30)
@pytest.mark.parametrize("num_envs", [1, 4])
@pytest.mark.parametrize("start_method", START_METHODS)
@pytest.mark.parametrize(
    "kind, type_name, message",
    [
        ("lock", "mlagents_plugin.testing.faulty_envs.LockHoldingError", "cannot travel"),
        ("two_args", "mlagents_plugin.testing.faulty_envs.TwoArgumentError", "cannot travel (code 7)"),
    ],
)
def test_exception_that_cannot_be_rebuilt_arrives_by_name(
    env_manager_factory, start_method, num_envs, kind, type_name, message
):
    factory = make_factory(UnpicklableExceptionEnvironment, kind=kind, message="cannot travel", after_steps=2)
    manager = env_manager_factory(factory, num_envs, start_method=start_method)
    manager.reset()
    with pytest.raises(RemoteWorkerError) as info:
        step_until(manager, lambda: False)
    error = info.value
    assert error.type_name == type_name
    assert f"raised {type_name} during STEP: {message}" in str(error)
    assert "in fire" in error.remote_traceback and message in error.remote_traceback
    assert "env worker" in str(error.__cause__)


@pytest.mark.timeout(30)
def test_restart_on_matches_exceptions_by_name(env_manager_factory, tmp_path):
    factory = make_factory(
        UnpicklableExceptionEnvironment, kind="lock", after_steps=2, once_file=str(tmp_path / "fired")
    )
    manager = env_manager_factory(factory, 2, restart_on=["LockHoldingError"], **FAST)
    manager.reset()
    step_until(manager, lambda: manager.restart_counts.get("restart_on") == 1)


@pytest.mark.timeout(30)
def test_listed_exception_types_are_restarted_and_others_are_not(env_manager_factory, tmp_path):
    listed = make_factory(
        UnexpectedExceptionEnvironment,
        exception_type=ListedError,
        after_steps=2,
        once_file=str(tmp_path / "fired"),
    )
    manager = env_manager_factory(listed, 2, restart_on=[f"{__name__}.ListedError"], **FAST)
    manager.reset()
    step_until(manager, lambda: manager.restart_counts.get("restart_on") == 1)
    unlisted = make_factory(UnexpectedExceptionEnvironment, exception_type=ValueError, after_steps=2)
    manager = env_manager_factory(unlisted, 2, restart_on=[f"{__name__}.ListedError"], **FAST)
    manager.reset()
    with pytest.raises(ValueError):
        step_until(manager, lambda: False)


# ------------------------------------------------------------------ start-up failures


@pytest.mark.timeout(60)
def test_bad_env_path_surfaces_with_the_workers_traceback(run_options, env_manager_factory, tmp_path):
    run_options.env_settings.max_lifetime_restarts = 1
    factory = create_environment_factory(
        str(tmp_path / "NoSuchBuild"), True, True, 0, 1, 60, 5005, [], str(tmp_path)
    )
    manager = env_manager_factory(factory, 1, **FAST)
    with pytest.raises(UnityEnvironmentException, match="Couldn't launch") as info:
        manager.reset()
        step_until(manager, lambda: False)
    assert "env_utils.py" in str(info.value.__cause__)
    # It never once built its env: one retry, then the error (core/restart.py).
    assert any("never once finished building its env" in note for note in info.value.__notes__)


@pytest.mark.timeout(60)
def test_unity_exception_at_start_is_restarted(env_manager_factory, tmp_path):
    factory = make_factory(
        UnexpectedExceptionEnvironment,
        exception_type=UnityTimeOutException,
        during="init",
        only_worker=0,
        once_file=str(tmp_path / "fired"),
    )
    manager = env_manager_factory(factory, 2, **FAST)
    manager.reset()
    step_until(manager, lambda: manager.restart_counts.get("unity") == 1 and len(manager.worker_pids) == 2)


def port_checking_env(worker_id, side_channels, base_port):
    """Claims its port as mlagents-envs does for a Unity build (UnityWorkerInUseException if
    taken), then releases it and plays SimpleEnvironment."""
    RpcCommunicator(worker_id, base_port).close()
    return SimpleEnvironment(worker_id, side_channels)


@pytest.mark.timeout(60)
def test_port_in_use_moves_the_worker_to_a_free_port(run_options, env_manager_factory, caplog):
    base = free_port_block(4)
    run_options.env_settings.base_port = base
    with socket.socket() as holder:  # a player left from an earlier run, say
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("localhost", base + 1))
        holder.listen()
        factory = functools.partial(port_checking_env, base_port=base)
        manager = env_manager_factory(factory, 2, **FAST)
        with caplog.at_level(logging.WARNING):
            manager.reset()
            step_until(manager, lambda: len(manager.worker_pids) == 2)
    if HOLDERS_VISIBLE:
        assert f"port {base + 1} (worker id 1) is held by pid {os.getpid()} (" in caplog.text  # this test's process
    else:
        assert f"port {base + 1} (worker id 1) is in use (by another run on the same --base-port" in caplog.text
    assert f"moving to worker id 2 (port {base + 2})" in caplog.text
    assert manager.restart_counts == {}


# --------------------------------------------------------------------- restart policy


@pytest.mark.timeout(60)
def test_quota_exceeded_reports_the_restart_history(run_options, env_manager_factory):
    run_options.env_settings.max_lifetime_restarts = 2
    run_options.env_settings.restarts_rate_limit_n = -1
    factory = make_factory(UnexpectedExceptionEnvironment, exception_type=UnityCommunicationException, after_steps=2)
    manager = env_manager_factory(factory, 1, **FAST)
    manager.reset()
    with pytest.raises(UnityCommunicationException) as info:
        step_until(manager, lambda: False)
    note = " ".join(info.value.__notes__)
    assert "max_lifetime_restarts=2" in note and "its 2 restart(s)" in note
    assert note.count("after UnityCommunicationException: injected fault") == 2


# --------------------------------------------------------------------------- signals


@pytest.mark.skipif(sys.platform == "win32", reason="os.kill(pid, SIGINT) is TerminateProcess on Windows, not a "
                    "Ctrl-C (a console's Ctrl-C needs a person with the machine: docs/platforms.md)")
@pytest.mark.timeout(30)
def test_workers_ignore_sigint(env_manager_factory):
    manager = env_manager_factory(make_factory(SimpleEnvironment), 2)
    manager.reset()
    for pid in manager.worker_pids.values():
        os.kill(pid, signal.SIGINT)
    step_n(manager, 50)
    assert manager.restart_counts == {}
    assert all(psutil.Process(pid).is_running() for pid in manager.worker_pids.values())


# ---------------------------------------------------------------------------- health


@pytest.mark.timeout(240)
def test_health_reaches_the_stats_reporter_and_close_summarises(env_manager_factory, tmp_path, caplog):
    factory = last_worker_faults(HardExitEnvironment, 2, tmp_path, exit_code=4)
    manager = env_manager_factory(factory, 2, **FAST)
    result = train(manager, max_steps=1500)
    stats = result.stats["Simple"]
    assert sum(stats["Environment/Env Workers/Restarts/died"]) == 1
    assert sum(stats["Environment/Env Workers/Deaths"]) == 1
    assert all(v > 0 for v in stats["Environment/Env Workers/Step Latency (ms)/worker 0"])
    with caplog.at_level(logging.INFO):
        manager.close()
    summaries = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Env worker ")]
    assert any(
        s.startswith("Env worker 1:") and "restarts: died 1" in s and "its last process exited" in s for s in summaries
    )
    assert any(s.startswith("Env worker 0:") and "restarts: none" in s for s in summaries)


# ------------------------------------------------------------- requests a worker cannot serve


@pytest.mark.timeout(60)  # far below step_timeout_s: the answer comes at once
@pytest.mark.parametrize("command, payload, words", [
    (EnvironmentCommand.ENVIRONMENT_PARAMETERS, [("__class__", ())], "refuses the parameter call '__class__'"),
    (EnvironmentCommand.READY, None, "cannot serve READY: it is not a request a worker serves"),
], ids=["parameter-call", "command"])
def test_a_request_the_worker_cannot_serve_is_answered_at_once(env_manager_factory, command, payload, words):
    manager = env_manager_factory(make_factory(SimpleEnvironment), 1, step_timeout_s=600.0)
    manager.reset()
    manager.supervisor.send(0, command, payload)
    manager.supervisor.flush()
    with pytest.raises(ProtocolError, match=words):
        step_until(manager, lambda: False)
