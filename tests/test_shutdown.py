"""Closing under stress, create/close cycles, interpreter exit, and no orphaned players."""
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from helpers import step_until, wait_for_files

from mlagents_plugin.local import processes
from mlagents_plugin.testing import (
    HangingEnvironment,
    HardExitEnvironment,
    PlayerLaunchingEnvironment,
    SimpleEnvironment,
    make_factory,
)

SHUTDOWN, GRACE = 1.0, 1.0
# What close() may take at worst: the ladder's two waits, plus the moment SIGKILL and reaping take.
CLOSE_BOUND_S = SHUTDOWN + GRACE + 1.0


class CrashingPlayerEnvironment(PlayerLaunchingEnvironment, HardExitEnvironment):
    """Launches a player, then its worker dies without a word."""


def players(pid_dir: Path):
    return [int(p.name) for p in pid_dir.iterdir()]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids, within_s):
    """True if every pid is gone within ``within_s`` (checked often, never waited on longer)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(alive(pid) for pid in pids):
            return True
        time.sleep(0.02)
    return not any(alive(pid) for pid in pids)


def close_and_time(manager) -> float:
    started = time.monotonic()
    manager.close()
    return time.monotonic() - started


# --------------------------------------------------------------------- close under stress


@pytest.mark.timeout(30)
@pytest.mark.parametrize("num_envs", [1, 4])
@pytest.mark.parametrize(
    "situation",
    [
        "steps in flight",
        pytest.param("dead workers", marks=pytest.mark.skipif(
            sys.platform == "win32", reason="sends SIGKILL, which Windows does not have (TerminateProcess there)"
        )),
        "hung workers",
        "sigterm-ignoring workers",
    ],
)
def test_close_is_bounded_and_leaves_nothing(env_manager_factory, situation, num_envs, tmp_path):
    kwargs = {
        "steps in flight": dict(env_class=SimpleEnvironment, step_sleep_s=5.0),
        "dead workers": dict(env_class=SimpleEnvironment),
        "hung workers": dict(env_class=HangingEnvironment, after_steps=1, fired_dir=str(tmp_path)),
        "sigterm-ignoring workers": dict(
            env_class=HangingEnvironment, after_steps=1, ignore_sigterm=True, fired_dir=str(tmp_path)
        ),
    }[situation]
    manager = env_manager_factory(
        make_factory(**kwargs), num_envs, shutdown_timeout_s=SHUTDOWN, kill_grace_s=GRACE,
        step_timeout_s=600,
    )
    manager.reset()
    pids = list(manager.worker_pids.values())
    if situation == "dead workers":
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        wait_gone(pids, 5)
    else:
        manager.stepper.send_actions()  # steps are now in flight (and, for hung envs, never answered)
        if "fired_dir" in kwargs:  # (a step in flight is served before the CLOSE behind it)
            wait_for_files(tmp_path, range(num_envs))
    assert close_and_time(manager) < CLOSE_BOUND_S
    assert not any(alive(pid) for pid in pids)
    assert close_and_time(manager) < 0.1  # twice is harmless


@pytest.mark.timeout(60)
def test_interpreter_exit_never_waits_on_a_worker(tmp_path):
    script = tmp_path / "forgets_to_close.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from mlagents.trainers.settings import RunOptions
            from mlagents_plugin import SupervisedEnvManager, EnvManagerSettings
            from mlagents_plugin.testing import HangingEnvironment, make_factory

            if __name__ == "__main__":
                factory = make_factory(HangingEnvironment, after_steps=1, ignore_sigterm=True)
                settings = EnvManagerSettings(shutdown_timeout_s={SHUTDOWN}, kill_grace_s={GRACE})
                manager = SupervisedEnvManager(factory, RunOptions(), 2, settings)
                manager.reset()
                manager.stepper.send_actions()
                print("PIDS", *manager.worker_pids.values(), flush=True)
                # no close(): the interpreter exits with two hung, SIGTERM-ignoring workers
            """
        )
    )
    started = time.monotonic()
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=50)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-2000:]
    pids = [int(p) for line in result.stdout.splitlines() if line.startswith("PIDS") for p in line.split()[1:]]
    assert len(pids) == 2 and not any(alive(pid) for pid in pids)
    assert "Zombie worker report" in result.stdout
    assert elapsed < 30  # startup included; the exit itself is bounded by the ladder


@pytest.mark.skipif(sys.platform == "win32", reason="counts file descriptors (psutil's num_fds): POSIX only")
@pytest.mark.timeout(600)
def test_create_step_close_cycles_leak_nothing(env_manager_factory):
    me = psutil.Process()

    def cycle():
        manager = env_manager_factory(make_factory(SimpleEnvironment), 8)
        manager.reset()
        for _ in range(5):
            manager.get_steps()
        manager.close()

    cycle()  # starts multiprocessing's fork server (or resource tracker), which stays for the session
    gc.collect()  # what earlier tests left for the garbage collector is not this test's
    fds, children = me.num_fds(), len(me.children(recursive=True))
    for _ in range(20):  # a leak per cycle shows as 20 of it (spawned workers make a cycle slow)
        cycle()
    gc.collect()
    assert me.num_fds() == fds
    assert len(me.children(recursive=True)) == children


# ------------------------------------------------------------------------------ orphans


@pytest.mark.timeout(60)
def test_close_takes_the_players_down(env_manager_factory, tmp_path):
    manager = env_manager_factory(make_factory(PlayerLaunchingEnvironment, player_pid_dir=str(tmp_path)), 4)
    manager.reset()
    assert len(players(tmp_path)) == 4
    manager.close()
    assert not any(alive(pid) for pid in players(tmp_path))


@pytest.mark.timeout(60)
def test_a_crashed_workers_player_is_killed(env_manager_factory, tmp_path):
    pid_dir = tmp_path / "players"
    pid_dir.mkdir()
    factory = make_factory(
        CrashingPlayerEnvironment,
        player_pid_dir=str(pid_dir),
        after_steps=3,
        only_worker=1,
        once_file=str(tmp_path / "fired"),
    )
    manager = env_manager_factory(factory, 2, restart_backoff_s=0.0)
    manager.reset()
    first = set(players(pid_dir))
    # until the restarted worker has launched its own player: a time bound, not a step count
    # (a spawned worker restarts in about a second, in which fast envs step thousands of times)
    step_until(manager, lambda: len(players(pid_dir)) == 3, within_s=30)
    assert manager.restart_counts == {"died": 1}
    orphaned = first - {pid for pid in first if alive(pid)}
    assert len(orphaned) == 1, "the crashed worker's player must be gone, the other one alive"
    assert len([pid for pid in players(pid_dir) if alive(pid)]) == 2  # the new one runs


def _start_with_pid(pid: int, command, env) -> subprocess.Popen | None:
    """Start ``command`` as process ``pid`` (Linux: the next pid is set through ns_last_pid), or
    None once another process holds ``pid`` (parallel tests fork all the time)."""
    for _ in range(100):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        proc = subprocess.Popen(command, env=env, start_new_session=True)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
        if psutil.pid_exists(pid):
            return None
    return None


def _a_pid_that_came_back(command, env) -> tuple[psutil.Process, subprocess.Popen]:
    """A psutil Process kept for a pid whose process ended, and a new process of that pid."""
    for _ in range(20):  # each try has its own pid: another process may hold the last one
        earlier = subprocess.Popen(["sleep", "60"])
        (stale,) = [p for p in psutil.process_iter() if p.pid == earlier.pid]  # psutil keeps it
        earlier.kill()
        earlier.wait()
        time.sleep(0.05)  # psutil tells two processes of one pid apart by start time, in 1/100 s
        again = _start_with_pid(earlier.pid, command, env)
        if again is not None:
            return stale, again
    pytest.fail("no pid could be had again in 20 tries: other processes took each one first")


@pytest.mark.timeout(60)
@pytest.mark.skipif(  # CI runs as root on Linux: it runs there, in every leg
    not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK),
    reason="a pid that comes back can only be made on purpose by choosing the next pid, which takes "
    "writing /proc/sys/kernel/ns_last_pid (Linux only, as root); without it, waiting for pids to "
    "wrap takes tens of thousands of processes",
)
def test_a_player_whose_pid_came_back_is_found_and_killed():
    """NOTE [ Pids come back ]: psutil's process_iter keeps a Process object per pid; once the
    pid is a new process's and psutil has noticed, its next pass skips that pid. CI's pid_max is
    32768: a player was left running that way after its worker died."""
    tag = f"{processes.owner_prefix(os.getpid())}pidtest/1.0/"
    stale, player = _a_pid_that_came_back(["sleep", "60"], {**os.environ, processes.OWNER_ENV: tag})
    try:
        assert not stale.is_running()  # psutil notices the pid came back
        assert [p.pid for p in processes.kill_leftovers(tag)] == [player.pid]
        assert player.wait(timeout=5) is not None
    finally:
        player.kill()
        player.wait()


@pytest.mark.skipif(
    sys.platform == "win32", reason="sends SIGKILL, which Windows does not have (a kill there is TerminateProcess)"
)
@pytest.mark.timeout(60)
def test_a_sigkilled_workers_player_is_killed(env_manager_factory, tmp_path):
    manager = env_manager_factory(
        make_factory(PlayerLaunchingEnvironment, player_pid_dir=str(tmp_path)), 2, restart_backoff_s=0.0
    )
    manager.reset()
    (victim_player,) = [pid for pid in players(tmp_path)][:1]
    victim_worker = psutil.Process(victim_player).ppid()
    os.kill(victim_worker, signal.SIGKILL)
    step_until(manager, lambda: manager.restart_counts.get("died") == 1 and len(manager.worker_pids) == 2, 30)
    # killed once the dead worker is reaped, in the pump that notices the death or, if the kernel
    # had not yet made it a zombie then (its pipe closes first), the next one; never only at close
    step_until(manager, lambda: not alive(victim_player), within_s=10)


TRAINER_SCRIPT = """
import sys, time
from mlagents.trainers.settings import RunOptions
from mlagents_plugin import SupervisedEnvManager
from mlagents_plugin.testing import PlayerLaunchingEnvironment, make_factory

if __name__ == "__main__":
    manager = SupervisedEnvManager(
        make_factory(PlayerLaunchingEnvironment, player_pid_dir=sys.argv[1], step_sleep_s=0.01),
        RunOptions(), 2)
    manager.reset()
    print("WORKERS", *manager.worker_pids.values(), flush=True)
    while True:
        manager.get_steps()
"""


@pytest.mark.timeout(60)
def test_sigkill_of_the_trainer_takes_workers_and_players_down(tmp_path):
    """Nobody is left to close anything: the trainer's reaper SIGKILLs the workers it was told of
    and the players, which carry the workers' tag (NOTE [ No orphans ]); the fork server exits by
    itself when the trainer's end of its pipe closes."""
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER_SCRIPT)
    pid_dir = tmp_path / "players"
    pid_dir.mkdir()
    trainer = subprocess.Popen(
        [sys.executable, str(script), str(pid_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        line = trainer.stdout.readline()
        workers = [int(p) for p in line.split()[1:]]
        assert len(workers) == 2, line
        forkserver = [p.pid for p in psutil.Process(trainer.pid).children()]
        time.sleep(0.5)
        trainer.kill()
        trainer.wait()
        everything = workers + players(pid_dir) + forkserver
        assert len(everything) >= 4
        assert wait_gone(everything, within_s=2.0), [p for p in everything if alive(p)]
    finally:
        trainer.kill()
        trainer.wait()


class HangingPlayerEnvironment(PlayerLaunchingEnvironment, HangingEnvironment):
    """Launches a player, then hangs ignoring SIGTERM: only SIGKILL takes its worker down."""


@pytest.mark.timeout(60)
def test_a_force_killed_workers_player_is_killed(env_manager_factory, tmp_path):
    pid_dir, hung = tmp_path / "players", tmp_path / "hung"
    pid_dir.mkdir()
    hung.mkdir()
    factory = make_factory(
        HangingPlayerEnvironment, player_pid_dir=str(pid_dir), after_steps=1, ignore_sigterm=True,
        fired_dir=str(hung),
    )
    manager = env_manager_factory(factory, 2, shutdown_timeout_s=SHUTDOWN, kill_grace_s=GRACE)
    manager.reset()
    manager.stepper.send_actions()
    wait_for_files(hung, [0, 1])
    manager.close()
    assert len(players(pid_dir)) == 2
    assert not any(alive(pid) for pid in players(pid_dir))


@pytest.mark.hardening
@pytest.mark.timeout(60)
def test_a_dead_player_is_noticed_at_once(env_manager_factory, tmp_path):
    """mlagents-envs would notice only at its next poll, --timeout-wait / 10 s later."""
    manager = env_manager_factory(
        make_factory(PlayerLaunchingEnvironment, player_pid_dir=str(tmp_path), step_sleep_s=0.05),
        2, restart_backoff_s=0.0,
    )
    manager.reset()
    player = players(tmp_path)[0]
    os.kill(player, signal.SIGKILL)
    started = time.monotonic()
    while not manager.restart_counts:
        manager.get_steps()
    assert time.monotonic() - started < 2.0
    assert manager.restart_counts == {"unity": 1}
