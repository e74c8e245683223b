"""The ordinary accidents of real machines and people (docs/faults.md): a stray SIGTERM, an env
that raises KeyboardInterrupt or calls sys.exit, an env stuck in C code, absurd settings, an env
that builds nothing. Real worker processes; the mlagents-learn side is in test_real_faults_learn.py."""
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
from helpers import SPAWN_ONLY, alive_after, free_port_block, reaper_of, step_until, wait_for_files
from mlagents.trainers.exception import TrainerConfigError

from mlagents_plugin.core import wire
from mlagents_plugin.core.errors import RemoteTraceback, WorkerDiedError
from mlagents_plugin.core.settings import parse_section
from mlagents_plugin.local import processes
from mlagents_plugin.player.build import make_build
from mlagents_plugin.testing import (
    HangingEnvironment,
    SimpleEnvironment,
    UnexpectedExceptionEnvironment,
    make_factory,
)


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

# What a kill becomes on Windows is a death by exit code: test_contract's killed-worker tests.
NO_SIGTERM_FROM_OUTSIDE = pytest.mark.skipif(
    sys.platform == "win32", reason="Windows has no SIGTERM from outside: os.kill there is TerminateProcess, a "
    "death by exit code, whose restart the contract suite's killed-worker tests check (docs/platforms.md)"
)


@NO_SIGTERM_FROM_OUTSIDE
@pytest.mark.timeout(60)
def test_a_sigterm_to_one_worker_is_a_death_and_the_worker_is_restarted(env_manager_factory, caplog):
    manager = env_manager_factory(make_factory(SimpleEnvironment, step_sleep_s=0.002), 2)
    manager.reset()
    victim = manager.worker_pids[1]
    os.kill(victim, signal.SIGTERM)  # kill PID, earlyoom, a container runtime, while it waits for a request
    step_until(manager, lambda: manager.restart_counts == {"died": 1} and 1 in manager.worker_pids)
    assert manager.worker_pids[1] != victim
    assert f"(pid {victim}) was stopped by SIGTERM between requests" in caplog.text
    stepped = set()
    deadline = time.monotonic() + 30  # a spawned worker imports everything afresh: about a second
    while stepped != {0, 1} and time.monotonic() < deadline:
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


@NO_SIGTERM_FROM_OUTSIDE
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


@pytest.mark.hardening
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
        # in C, not asleep: running (or runnable) from now on, however often it is looked at
        assert all(psutil.Process(workers[1]).status() == psutil.STATUS_RUNNING for _ in range(20))
        trainer.kill()  # the trainer alone, as the OOM killer would
        trainer.wait()
        assert gone_within(workers, 5.0), "a worker outlived its trainer"
    finally:
        if trainer.poll() is None:
            trainer.kill()
        for pid in workers if "workers" in locals() else []:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


# ------------------------------------------------ what a killed worker or trainer leaves


PLAYER_TRAINER_SCRIPT = textwrap.dedent("""
    import sys
    from mlagents.trainers.settings import RunOptions
    from mlagents_envs.environment import UnityEnvironment
    from mlagents_plugin import SupervisedEnvManager

    def factory(worker_id, side_channels):
        return UnityEnvironment(
            sys.argv[1], worker_id=worker_id, base_port=int(sys.argv[2]), no_graphics=True,
            side_channels=side_channels, log_folder=sys.argv[3], timeout_wait=60,
            additional_args=["--survive-trainer"],  # it does not quit by itself when its link breaks
        )

    if __name__ == "__main__":
        manager = SupervisedEnvManager(factory, RunOptions(), 1)
        manager.reset()
        print(*manager.worker_pids.values(), flush=True)
        sys.stdin.read()  # idle: the manager notices nothing until it is told to close
        manager.close()
""")


TELLS_AND_DIES = textwrap.dedent("""
    import os, subprocess, sys
    from mlagents_plugin.local.linux.reaper_client import Reaper
    reaper = Reaper()
    reaper.remove_with_me(sys.argv[1])  # starts the reaper
    print(os.getpid(), flush=True)
    sys.stdin.readline()  # the test has stopped the reaper
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    reaper.watch_worker(victim.pid)
    print(victim.pid, flush=True)
    os._exit(0)
""")


@pytest.mark.hardening
@pytest.mark.timeout(60)
def test_the_reaper_reads_what_its_supervisor_said_before_dying(tmp_path):
    """CI18: a worker outlived its SIGKILLed trainer on a loaded machine. A reaper slow to run
    (its sweep, a loaded machine) found the trainer's pidfd and its unread "worker" lines ready
    together, and left without reading them. Here the reaper is stopped while its supervisor
    tells it of a worker and dies."""
    supervisor = subprocess.Popen(  # not run from the checkout: -c would import the package from there
        [sys.executable, "-c", TELLS_AND_DIES, str(tmp_path / "dir")], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, cwd=tmp_path,
    )
    victim = reaper = None
    try:
        reaper = reaper_of(int(supervisor.stdout.readline()))
        reaper.suspend()
        supervisor.stdin.write("go\n")
        supervisor.stdin.flush()
        victim = int(supervisor.stdout.readline())
        supervisor.wait(10)
        reaper.resume()  # the pidfd and the line are ready together
        assert alive_after([victim], 10.0) == [], "the reaper left a worker it was told of running"
        reaper.wait(10)
    finally:
        if reaper is not None and reaper.is_running():
            reaper.resume()
        if victim is not None and alive(victim):
            os.kill(victim, signal.SIGKILL)
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()


def kill_what_is_left(trainer: subprocess.Popen, pids=()) -> None:
    """After a test that killed a trainer's reaper: what nobody else will clean up."""
    if trainer.poll() is None:
        os.killpg(trainer.pid, signal.SIGKILL)
        trainer.wait()
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    from mlagents_plugin.local.linux.hardening import remove_segments  # the hardening tests' alone: Linux

    processes.kill_processes(processes.find_tagged(processes.owner_prefix(trainer.pid)), 0.5)
    remove_segments(f"{wire.SEGMENT_PREFIX}{trainer.pid}_", ours=False)


@pytest.mark.hardening
@pytest.mark.timeout(90)
def test_the_player_of_a_sigkilled_worker_is_killed_by_the_kernel(tmp_path):
    """NOTE [ Players die with their worker ]: the player mlagents-envs launched dies in the
    instant its worker does, with nothing of ours left to act. The trainer is idle (it reads
    nothing from the worker, so its ladder never runs), its reaper is SIGKILLed first (else it
    would kill the player when the trainer dies, and the trainer is still alive here anyway),
    and the player runs with --survive-trainer (no launcher watch; a broken link does not end
    it): only the kernel's parent-death signal can end the player."""
    make_build(str(tmp_path / "builds"), "goal")
    script = tmp_path / "trainer.py"
    script.write_text(PLAYER_TRAINER_SCRIPT)
    trainer = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "builds" / "goal"), str(free_port_block(1)), str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )
    player = None
    try:
        worker = int(trainer.stdout.readline())
        [player] = [c for c in psutil.Process(worker).children() if "mlagents_plugin.player" in " ".join(c.cmdline())]
        reaper = reaper_of(trainer.pid)
        reaper.kill()
        reaper.wait(5)
        os.kill(worker, signal.SIGKILL)
        assert not alive_after([player.pid], 2.0), "the player outlived its SIGKILLed worker"
        assert alive(trainer.pid)  # the trainer did not do it: it is still there, idle
        trainer.stdin.close()  # now close, with the worker and its player gone
        assert trainer.wait(timeout=30) == 0
    finally:
        kill_what_is_left(trainer, [player.pid] if player is not None else [])


@pytest.mark.hardening
def test_only_a_player_launched_from_the_main_thread_gets_a_parent_death_signal(tmp_path):
    """The signal fires when the thread that started the player ends (NOTE [ Players die with
    their worker ]): from another thread, which may end any time, the player starts as before.
    So does what mlagents-envs' own Popen must look up or refuse."""
    from mlagents_plugin.local.linux import die_with_parent
    from mlagents_plugin.local.linux.players import with_parent_death_signal

    build = str(make_build(str(tmp_path), "goal"))
    assert with_parent_death_signal([build, "--mlagents-port", "5005"]) == [
        sys.executable, "-I", "-S", die_with_parent.__file__, str(os.getpid()), build, "--mlagents-port", "5005",
    ]
    from_a_thread = []
    thread = threading.Thread(target=lambda: from_a_thread.append(with_parent_death_signal([build])))
    thread.start()
    thread.join()
    assert from_a_thread == [[build]]
    assert with_parent_death_signal(["goal.x86_64"]) == ["goal.x86_64"]  # for Popen to find in PATH
    missing = str(tmp_path / "missing.x86_64")
    assert with_parent_death_signal([missing]) == [missing]  # for Popen to refuse in its own words


@pytest.mark.hardening
@pytest.mark.timeout(30)
def test_the_wrapper_starts_nothing_if_its_launcher_died_before_the_signal_was_set():
    """die_with_parent.py finds another parent than the launcher it was told of (as after the
    launcher's death, when it is re-parented): no signal would come, so it starts nothing."""
    from mlagents_plugin.local.linux import die_with_parent

    wrapper = [sys.executable, "-I", "-S", die_with_parent.__file__]
    ran = subprocess.run([*wrapper, str(os.getpid()), "/bin/echo", "started"], capture_output=True, text=True)
    assert (ran.returncode, ran.stdout) == (0, "started\n")
    orphan = subprocess.run([*wrapper, "1", "/bin/echo", "started"], capture_output=True, text=True)
    assert (orphan.returncode, orphan.stdout) == (1, "")


SWEEP_TRAINER_SCRIPT = textwrap.dedent("""
    import sys
    from mlagents.trainers.settings import RunOptions
    from mlagents_plugin import SupervisedEnvManager
    from mlagents_plugin.testing import PlayerLaunchingEnvironment, SimpleEnvironment, make_factory

    if __name__ == "__main__":
        if sys.argv[1] == "leave":  # players the env starts itself, and 80 KB observations
            factory = make_factory(PlayerLaunchingEnvironment, player_pid_dir=sys.argv[2], vector_size=20000)
            manager = SupervisedEnvManager(factory, RunOptions(), 2)
            manager.reset()  # each worker's reply went through its shared memory segment
            print("READY", flush=True)
            sys.stdin.read()  # until it is killed
        else:  # the next run: a new manager
            manager = SupervisedEnvManager(make_factory(SimpleEnvironment), RunOptions(), 1)
            manager.reset()
            manager.close()
""")


@pytest.mark.hardening
@pytest.mark.timeout(120)
def test_the_next_run_sweeps_what_a_killed_trainer_and_its_killed_reaper_left(tmp_path):
    """NOTE [ No orphans ], 4.: the sweep. A trainer's reaper is a process of its own session,
    waiting on a pidfd of the trainer: killing the trainer's process group does not reach it,
    and it cleans up in the instant the trainer dies. So the only way to leave something behind
    is to SIGKILL the reaper first (as `kill -9` of everything, or the OOM killer, could), then
    the trainer's whole group (trainer, fork server, workers, resource tracker). Players that
    mlagents-envs launched would still die with their workers (NOTE [ Players die with their
    worker ]); what is left is what the sweep is for: players the env started itself, in
    sessions of their own and tagged with the dead trainer's pid, and the workers' shared
    memory segments. The next run's first manager starts a reaper, which sweeps them. Not
    multiprocessing's temp dir of the fork server's socket, which multiprocessing names at
    random (docs/faults.md): the trainer makes it in a TMPDIR of its own, removed here."""
    script = tmp_path / "trainer.py"
    script.write_text(SWEEP_TRAINER_SCRIPT)
    pid_dir = tmp_path / "players"
    pid_dir.mkdir()
    temp = tempfile.mkdtemp(prefix="mlap-t-")  # short: it holds the fork server's socket
    trainer = subprocess.Popen(
        [sys.executable, str(script), "leave", str(pid_dir)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "TMPDIR": temp},
    )
    owner, segment_prefix = processes.owner_prefix(trainer.pid), f"{wire.SEGMENT_PREFIX}{trainer.pid}_"

    def segments():
        return [n for n in os.listdir("/dev/shm") if n.startswith(segment_prefix)]

    players = []
    try:
        assert trainer.stdout.readline().strip() == "READY"
        players = sorted(int(p.name) for p in pid_dir.iterdir())
        assert len(players) == 2 and sorted(p.pid for p in processes.find_tagged(owner)) == players
        assert len(segments()) == 2, segments()
        reaper = reaper_of(trainer.pid)
        reaper.kill()
        reaper.wait(5)
        os.killpg(trainer.pid, signal.SIGKILL)
        trainer.wait()
        # Left behind. Checked at once: on a machine running other tests, any reaper that starts
        # sweeps them too (as this test's own next run is about to).
        assert [pid for pid in players if alive(pid)] == players and len(segments()) == 2

        subprocess.run([sys.executable, str(script), "start"], check=True, timeout=60, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 10  # the new reaper sweeps as it starts, on its own
        while processes.find_tagged(owner) or segments():
            assert time.monotonic() < deadline, (processes.find_tagged(owner), segments())
            time.sleep(0.1)
        assert not alive_after(players, 0.0)
    finally:
        kill_what_is_left(trainer, players)
        shutil.rmtree(temp, ignore_errors=True)


# ------------------------------------------------------------------ what close says


@pytest.mark.skipif(
    sys.platform == "win32", reason="sends SIGKILL, which Windows does not have (a kill there is TerminateProcess)"
)
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
def test_a_worker_still_building_its_env_is_stopped_at_once_on_close(env_manager_factory, caplog, tmp_path):
    """A worker in its factory (a handshake, the wait for the Editor) reads nothing: close sends
    it SIGTERM at once, without waiting shutdown_timeout_s and without a zombie report."""
    factory = make_factory(HangingEnvironment, during="init", fired_dir=str(tmp_path))
    manager = env_manager_factory(factory, 2, shutdown_timeout_s=30)
    wait_for_files(tmp_path, [0, 1])  # both are in their factories
    started = time.monotonic()
    with caplog.at_level(logging.INFO):
        manager.close()
    assert time.monotonic() - started < 5
    assert "Zombie worker report" not in caplog.text
    assert "is still building its env; stopping it with SIGTERM" in caplog.text
    # neither stepped: no mean latency ("nan ms", as once printed) in their close summaries
    summaries = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Env worker ")]
    assert sorted(line[: len("Env worker 0: 0 steps, restarts")] for line in summaries) == [
        "Env worker 0: 0 steps, restarts", "Env worker 1: 0 steps, restarts",
    ], summaries
    assert not any("nan" in line or "latency" in line for line in summaries), summaries


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
    words = rf"env_manager.{setting}: expected a number of seconds.*at most 86400 \(one day\), got"
    with pytest.raises(TrainerConfigError, match=words):
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


CLEANED_TMP_SCRIPT = textwrap.dedent("""
    import multiprocessing.util, os, shutil, signal
    from mlagents.trainers.settings import RunOptions
    from mlagents_plugin import SupervisedEnvManager, EnvManagerSettings
    from mlagents_plugin.testing import SimpleEnvironment, make_factory
    if __name__ == "__main__":
        settings = EnvManagerSettings(start_method="forkserver", restart_backoff_s=0.0)
        manager = SupervisedEnvManager(make_factory(SimpleEnvironment), RunOptions(), 2, settings)
        manager.reset()
        shutil.rmtree(multiprocessing.util.get_temp_dir())  # what a /tmp cleaner does mid-run
        killed = manager.worker_pids[1]
        os.kill(killed, signal.SIGKILL)
        while manager.worker_pids.get(1) in (None, killed) or manager.restart_counts.get("died") != 1:
            manager.get_steps()
        stepped = set()
        while stepped != {0, 1}:
            stepped |= {step.worker_id for step in manager.get_steps()}
        print("RESTARTED", manager.worker_pids[1], flush=True)
        manager.close()
""")


@SPAWN_ONLY  # a fork server's socket
@pytest.mark.timeout(120)
def test_a_worker_restarts_after_tmp_was_cleaned_under_the_fork_server(tmp_path):
    """systemd-tmpfiles, tmpreaper or an rm -rf /tmp/pymp-* removes the fork server's socket: the
    next worker is spawned instead of failing with FileNotFoundError (NOTE [ A fork server gone ])."""
    script = tmp_path / "trainer.py"
    script.write_text(CLEANED_TMP_SCRIPT)
    temp = Path(tempfile.mkdtemp(prefix="mlap-t-"))  # this run's pymp dir, apart from everyone's
    try:
        run = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=100,
            env={**os.environ, "TMPDIR": str(temp)},
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert "RESTARTED" in run.stdout
        assert "fork server cannot be reached (FileNotFoundError" in run.stderr + run.stdout
        assert "Traceback" not in run.stderr, run.stderr
        assert list(temp.iterdir()) == []  # multiprocessing removed the dir made again at exit
    finally:
        shutil.rmtree(temp, ignore_errors=True)
