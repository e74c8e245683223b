"""The ordinary accidents of real machines and people (docs/faults.md): a stray SIGTERM, an env
that raises KeyboardInterrupt or calls sys.exit, an env stuck in C code, absurd settings, an env
that builds nothing. Real worker processes; the mlagents-learn side is in test_real_faults_learn.py."""
import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from mlagents.trainers.exception import TrainerConfigError

from mlagents_plugin.core.errors import RemoteTraceback, WorkerDiedError
from mlagents_plugin.core.settings import parse_section
from mlagents_plugin.testing import (
    HangingEnvironment,
    SimpleEnvironment,
    UnexpectedExceptionEnvironment,
    make_factory,
)


def step_until(manager, condition, limit=5000):
    for _ in range(limit):
        if condition():
            return
        manager.get_steps()
    pytest.fail(f"condition not reached in {limit} calls of get_steps")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone_within(pids, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# --------------------------------------------------------------- signals and exits


@pytest.mark.timeout(60)
def test_a_sigterm_to_one_worker_is_a_death_and_the_worker_is_restarted(env_manager_factory):
    manager = env_manager_factory(make_factory(SimpleEnvironment, step_sleep_s=0.002), 2)
    manager.reset()
    victim = manager.worker_pids[1]
    os.kill(victim, signal.SIGTERM)  # kill PID, earlyoom, a container runtime
    step_until(manager, lambda: manager.restart_counts == {"died": 1} and 1 in manager.worker_pids)
    assert manager.worker_pids[1] != victim
    stepped = set()
    for _ in range(50):
        stepped |= {step.worker_id for step in manager.get_steps()}
    assert stepped == {0, 1}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("raised, words", [
    ("KeyboardInterrupt", "its env raised KeyboardInterrupt: injected fault"),
    ("SystemExit", "its env raised SystemExit: injected fault (sys.exit)"),
])
def test_a_base_exception_from_the_env_is_a_worker_failure_not_the_trainers(
    run_options, env_manager_factory, raised, words
):
    run_options.env_settings.max_lifetime_restarts = 0
    factory = make_factory(UnexpectedExceptionEnvironment, exception_type=raised, after_steps=3, only_worker=1)
    manager = env_manager_factory(factory, 2)
    manager.reset()
    with pytest.raises(WorkerDiedError) as info:  # never KeyboardInterrupt or SystemExit here
        step_until(manager, lambda: False)
    assert words in str(info.value) and "during STEP" in str(info.value)
    assert isinstance(info.value.__cause__, RemoteTraceback) and "in fire" in str(info.value.__cause__)


@pytest.mark.timeout(60)
def test_a_base_exception_from_the_env_is_restarted_like_a_death(env_manager_factory, tmp_path):
    factory = make_factory(
        UnexpectedExceptionEnvironment, exception_type=KeyboardInterrupt, after_steps=3,
        only_worker=1, once_file=str(tmp_path / "fired"),
    )
    manager = env_manager_factory(factory, 2)
    manager.reset()
    step_until(manager, lambda: manager.restart_counts == {"died": 1} and 1 in manager.worker_pids)


@pytest.mark.timeout(120)
def test_sigterms_at_random_moments_never_corrupt_a_pipe(run_options, env_manager_factory):
    """The worker's SIGTERM handler never raises in the middle of a message (NOTE [ Worker
    signals ]): replies of 60 KB, just under the shared memory threshold, cross the pipe in
    several writes, and twenty SIGTERMs land wherever they land."""
    run_options.env_settings.restarts_rate_limit_n = -1
    run_options.env_settings.max_lifetime_restarts = -1
    factory = make_factory(SimpleEnvironment, vector_size=15000)
    manager = env_manager_factory(factory, 2, restart_backoff_s=0.0)
    manager.reset()
    rng = random.Random(7)
    for n in range(1, 21):
        step_until(manager, lambda: 1 in manager.worker_pids)
        for _ in range(rng.randrange(1, 20)):
            manager.get_steps()
        os.kill(manager.worker_pids[1], signal.SIGTERM)
        step_until(manager, lambda n=n: manager.restart_counts.get("died", 0) == n)
    assert manager.restart_counts == {"died": 20}


# --------------------------------------------------------------- stuck in native code


TRAINER_SCRIPT = textwrap.dedent("""
    import sys, time
    from mlagents.trainers.settings import RunOptions
    from mlagents_plugin import SupervisedEnvManager, EnvManagerSettings
    from mlagents_plugin.testing import HangingEnvironment, make_factory
    if __name__ == "__main__":
        factory = make_factory(HangingEnvironment, in_c=True, after_steps=3, only_worker=1, once_file=sys.argv[1])
        manager = SupervisedEnvManager(factory, RunOptions(), 2, EnvManagerSettings(step_timeout_s=600))
        manager.reset()
        print(" ".join(map(str, manager.worker_pids.values())), flush=True)
        while True:
            manager.get_steps()
""")


@pytest.mark.timeout(60)
def test_a_worker_spinning_in_c_dies_with_its_sigkilled_trainer(tmp_path):
    """A watchdog thread in the worker would never get the GIL back: the reaper, a process of
    its own, kills the worker (NOTE [ No orphans ])."""
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER_SCRIPT)
    spinning = tmp_path / "spinning"  # created as the env enters the regex
    trainer = subprocess.Popen([sys.executable, str(script), str(spinning)], stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(pid) for pid in trainer.stdout.readline().split()]
        deadline = time.monotonic() + 30
        while not spinning.exists():
            assert time.monotonic() < deadline, "the worker never started spinning"
            time.sleep(0.05)
        time.sleep(0.5)
        assert psutil.Process(workers[1]).status() == psutil.STATUS_RUNNING  # in C, not asleep
        trainer.kill()  # the trainer alone, as the OOM killer would
        trainer.wait()
        assert gone_within(workers, 5.0), "a worker outlived its trainer"
    finally:
        if trainer.poll() is None:
            trainer.kill()
        for pid in workers if "workers" in locals() else []:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------ what close says


@pytest.mark.timeout(60)
def test_close_says_how_each_workers_last_process_ended(run_options, env_manager_factory, caplog):
    run_options.env_settings.max_lifetime_restarts = 0
    manager = env_manager_factory(make_factory(SimpleEnvironment, step_sleep_s=0.002), 2, step_timeout_s=600)
    manager.reset()
    os.kill(manager.worker_pids[1], signal.SIGKILL)
    with pytest.raises(WorkerDiedError):
        step_until(manager, lambda: False)
    with caplog.at_level(logging.INFO):
        manager.close()
    summaries = {
        r.getMessage()[: len("Env worker 0")]: r.getMessage()
        for r in caplog.records
        if r.getMessage().startswith("Env worker ")
    }
    assert "its last process was killed by SIGKILL" in summaries["Env worker 1"]
    assert "its last process exited" in summaries["Env worker 0"]


@pytest.mark.timeout(60)
def test_a_worker_still_building_its_env_is_stopped_at_once_on_close(env_manager_factory, caplog):
    """A worker in its factory (a handshake, the wait for the Editor) reads nothing: close sends
    it SIGTERM at once, without waiting shutdown_timeout_s and without a zombie report."""
    manager = env_manager_factory(make_factory(HangingEnvironment, during="init"), 2, shutdown_timeout_s=30)
    time.sleep(1.0)  # both are in their factories
    started = time.monotonic()
    with caplog.at_level(logging.INFO):
        manager.close()
    assert time.monotonic() - started < 5
    assert "Zombie worker report" not in caplog.text
    assert "is still building its env; stopping it with SIGTERM" in caplog.text


@pytest.mark.timeout(60)
def test_a_factory_that_returns_no_env_is_explained(env_manager_factory):
    manager = env_manager_factory(lambda worker_id, side_channels: "not an env", 1)
    with pytest.raises(
        TypeError,
        match=r"The env factory returned str 'not an env', not an ML-Agents env \(a BaseEnv\): "
        r"it has no behavior_specs",
    ):
        manager.reset()


# ------------------------------------------------------------------- absurd settings


@pytest.mark.parametrize(
    "setting", ["shutdown_timeout_s", "kill_grace_s", "step_timeout_s", "startup_timeout_s", "restart_backoff_s"]
)
@pytest.mark.parametrize("value", [float("inf"), 1e7, float("nan")])
def test_every_duration_is_finite_and_at_most_a_day(setting, value):
    with pytest.raises(TrainerConfigError, match=f"'{setting}' must be a finite number of seconds, at most 86400"):
        parse_section({setting: value})


@pytest.mark.parametrize("section, words", [
    ({"enabled": False, "env": "mlagents_plugin.testing:simple_env"}, "'env' needs the plugin, but 'enabled' is false"),
    ({"enabled": False, "backend": "ray"}, "'backend: ray' needs the plugin"),
    ({"env_kwargs": {"num_agents": 2}}, "'env_kwargs' is set but 'env' is not"),
])
def test_combinations_that_cannot_work_are_refused(section, words):
    with pytest.raises(TrainerConfigError, match=words):
        parse_section(section)


def test_a_timeout_wait_too_long_for_the_derived_deadlines_is_refused(run_options):
    run_options.env_settings.timeout_wait = 10**9
    with pytest.raises(TrainerConfigError, match="--timeout-wait=1000000000 is too long"):
        parse_section(None).resolved(run_options)
