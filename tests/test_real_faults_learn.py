"""The ordinary accidents, through a real `mlagents-learn` (docs/faults.md): a stray SIGTERM to a
worker, an env that raises KeyboardInterrupt, the whole process group killed or hung up, Ctrl-C
while waiting for the Editor, settings and env specs that cannot work."""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from helpers import (
    finish,
    free_port_block,
    learn_command,
    processes_naming,
    run_learn,
    start_learn,
    wait_for_line,
    write_config,
)

from mlagents_plugin.local import processes
from mlagents_plugin.player.build import make_build

pytestmark = pytest.mark.e2e
if sys.platform == "win32":  # before the module names SIGKILL and SIGHUP, which Windows does not have
    pytest.skip("stops mlagents-learn with POSIX signals to its process group (os.killpg, SIGHUP, SIGKILL); "
                "Windows' console events need a person with the machine (docs/platforms.md)",
                allow_module_level=True)


def python_env_config(tmp_path: Path, env_kwargs: dict, max_steps: int = 10**7, **env_manager) -> Path:
    def edit(config):
        config["behaviors"]["Simple"]["max_steps"] = max_steps
        config["env_manager"] = {
            "env": "mlagents_plugin.testing:testing_env",
            "env_kwargs": env_kwargs,
            **env_manager,
        }

    return write_config(tmp_path, "simple_python_env.yaml", edit)


def env_workers(trainer_pid: int):
    """The trainer's env worker processes: its fork server's children, or its spawned ones."""
    found = []
    for child in psutil.Process(trainer_pid).children():
        command = " ".join(child.cmdline())
        if "multiprocessing.forkserver" in command:
            found += child.children()
        elif "spawn_main" in command and "resource_tracker" not in command:
            found.append(child)
    return found


def stop(trainer, output, timeout_s=60):
    os.killpg(trainer.pid, signal.SIGINT)
    return finish(trainer, output, timeout_s)


def leftovers(trainer_pid: int, tmp_path: Path, temp: Path):
    """What a trainer left: processes tagged by it or naming this test's folder; its segments, and
    multiprocessing's temp dirs in ``temp``, the trainer's TMPDIR."""
    found = {p.pid for p in processes.find_tagged(processes.owner_prefix(trainer_pid))}
    found.update(processes_naming(tmp_path))
    files = [n for n in os.listdir("/dev/shm") if n.startswith(f"mlap_{trainer_pid}_")]
    files += [str(d) for d in temp.glob("pymp-*")]
    return found, files


def nothing_left_within(trainer_pid: int, tmp_path: Path, temp: Path, seconds: float):
    deadline = time.monotonic() + seconds
    while True:
        found, files = leftovers(trainer_pid, tmp_path, temp)
        if not (found or files) or time.monotonic() > deadline:
            return found, files
        time.sleep(0.1)


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    directory = tmp_path_factory.mktemp("builds")
    make_build(str(directory), "goal")
    make_build(str(directory), "visual")
    return directory


# ------------------------------------------------------------------ one worker's accidents


@pytest.mark.timeout(240)
def test_a_sigterm_to_one_worker_is_restarted_and_training_goes_on(tmp_path):
    trainer = start_learn(tmp_path, learn_command(
        python_env_config(tmp_path, {"step_sleep_s": 0.002}), "--num-envs=2"
    ))
    output: list = []
    try:
        wait_for_line(trainer, "Step: 500.", output)
        victim = env_workers(trainer.pid)[1]
        victim.terminate()  # kill PID, earlyoom, a container runtime
        wait_for_line(trainer, "Restarting env worker", output)
        wait_for_line(trainer, "Step: ", output)  # training goes on
        stop(trainer, output)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
    text = "".join(output)
    assert f"(pid {victim.pid}) was stopped by SIGTERM" in text
    assert trainer.returncode == 0
    assert (tmp_path / "results" / "run" / "Simple.onnx").exists()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("raised", ["KeyboardInterrupt", "SystemExit"])
def test_an_env_raising_keyboard_interrupt_or_exit_never_ends_a_run_as_a_success(tmp_path, raised):
    """Without restarts left, the run fails (exit 1), naming what the env raised; it is not
    ML-Agents' Ctrl-C (exit 0, "CI passed")."""
    config = python_env_config(
        tmp_path,
        {"env_class": "UnexpectedExceptionEnvironment", "exception_type": raised, "after_steps": 50, "only_worker": 1},
    )
    result = run_learn(tmp_path, config, "--num-envs=2", "--max-lifetime-restarts=0")
    assert result.returncode == 1, result.stdout[-3000:]
    assert f"stopped during STEP: its env raised {raised}: injected fault" in result.stdout + result.stderr


GOAL_ENVS = """
from mlagents_plugin.testing import SimpleEnvironment


class GoalEnvError(Exception):
    pass


class GoalEnv(SimpleEnvironment):
    def step(self):
        super().step()
        if self.step_count == 30:
            raise GoalEnvError("the goal fell off the table")


def make_env(worker_id, side_channels):
    return GoalEnv(worker_id, side_channels)
"""


@pytest.mark.timeout(240)
def test_an_envs_own_exception_reaches_the_user_with_its_type_worker_and_traceback(tmp_path):
    """What a user reads when their env raises its own exception, on Python 3.10 as on 3.11: its
    type and message, which worker and what it was doing (a note: NOTE [ Exception notes on
    Python 3.10 ]), and the worker's traceback, down to the env's line."""
    (tmp_path / "goal_envs.py").write_text(GOAL_ENVS)

    def edit(config):
        config["env_manager"] = {"env": "goal_envs:make_env"}

    config = write_config(tmp_path, "simple_python_env.yaml", edit)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    result = subprocess.run(
        learn_command(config, "--num-envs=2"), cwd=tmp_path, capture_output=True, text=True, timeout=200, env=env
    )
    assert result.returncode == 1, result.stdout[-3000:]
    printed = result.stderr  # the interpreter's last words
    assert "goal_envs.GoalEnvError: the goal fell off the table" in printed, printed[-3000:]
    assert re.search(r"Raised in env worker \d \(pid \d+\) during STEP", printed), printed[-3000:]
    assert re.search(r'goal_envs\.py", line \d+, in step\n +raise GoalEnvError', printed), printed[-3000:]


# ----------------------------------------------------------------- the whole group killed


@pytest.mark.skipif(sys.platform == "darwin", reason="looks for leftover segments in /dev/shm, which macOS "
                    "does not have")
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "how", [pytest.param(signal.SIGKILL, marks=pytest.mark.hardening), signal.SIGHUP], ids=["sigkill", "sighup"]
)
def test_killing_the_whole_process_group_leaves_no_player_and_no_segment(tmp_path, builds, how):
    """`timeout -s KILL`, `kill -9 -PGID`, a cancelled CI job; or the terminal's hangup. Players
    run in sessions of their own; the trainer's reaper does not (NOTE [ No orphans ])."""
    def edit(config):
        config["behaviors"]["GoalVisual"] = config["behaviors"].pop("Goal")
        config["behaviors"]["GoalVisual"]["max_steps"] = 10**7

    config = write_config(tmp_path, "goal_player.yaml", edit)
    # multiprocessing puts the fork server's socket here: a short path (a socket's is < 108 bytes)
    temp = Path(tempfile.mkdtemp(prefix="mlap-t-"))
    trainer = start_learn(tmp_path, learn_command(
        config, f"--env={builds / 'visual'}", "--num-envs=2", f"--base-port={free_port_block(10)}",
        "--env-args", "--num-agents", "4",
        # SIGKILL: nothing but a signal ends the players. Not for the orderly close of a hangup:
        # there the player must quit when its worker closes the link, and a link that mlagents-envs
        # cancels before its goodbye arrives would keep a surviving player waiting for a signal
        *(["--survive-trainer"] if how == signal.SIGKILL else []),
    ), env={"TMPDIR": str(temp)})
    output: list = []
    try:
        deadline = time.monotonic() + 120
        while True:  # players up, images flowing through shared memory
            found, files = leftovers(trainer.pid, tmp_path, temp)
            players = [p for p in found if "mlagents_plugin.player" in " ".join(psutil.Process(p).cmdline())]
            if len(players) == 2 and len([s for s in files if s.startswith("mlap_")]) == 2:
                break
            assert time.monotonic() < deadline and trainer.poll() is None, "the run never got going"
            time.sleep(0.2)
        if how == signal.SIGHUP:
            wait_for_line(trainer, "Step: ", output)  # a model to save
        os.killpg(trainer.pid, how)
        finish(trainer, output, timeout_s=60)
        found, files = nothing_left_within(trainer.pid, tmp_path, temp, 10.0)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)
    assert not found, f"left running: {found}"
    assert not files, f"left in /dev/shm or {temp}: {files}"
    if how == signal.SIGHUP:  # a hangup is an interrupt: the model is saved, workers close in order
        text = "".join(output)
        assert (tmp_path / "results" / "run" / "GoalVisual.onnx").exists(), text[-3000:]
        # each worker's last process exited (after CLOSE; "on SIGTERM" if closing its env took
        # longer than shutdown_timeout_s, as under a loaded CI machine), none was SIGKILLed
        assert text.count("its last process exited") == 2, text[-3000:]
        assert "resource_tracker" not in text


@pytest.mark.hardening
@pytest.mark.timeout(240)
def test_killing_the_group_also_ends_processes_an_env_started_in_their_own_session(tmp_path):
    players = tmp_path / "players"
    players.mkdir()
    trainer = start_learn(tmp_path, learn_command(python_env_config(
        tmp_path, {"env_class": "PlayerLaunchingEnvironment", "player_pid_dir": str(players), "step_sleep_s": 0.005},
    ), "--num-envs=2"))
    output: list = []
    try:
        wait_for_line(trainer, "Step: 500.", output)
        os.killpg(trainer.pid, signal.SIGKILL)
        trainer.wait(timeout=30)
        pids = [int(p.name) for p in players.iterdir()]
        deadline = time.monotonic() + 10
        while [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]:
            assert time.monotonic() < deadline, "a player started by the env outlived the group"
            time.sleep(0.1)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
    assert len(pids) >= 2


# ------------------------------------------------------------------ waiting for the Editor


@pytest.mark.timeout(120)
@pytest.mark.xdist_group("editor-port")  # the Editor's port, 5004, is fixed
def test_ctrl_c_while_waiting_for_the_editor_stops_at_once(tmp_path, editor_port):
    def edit(config):
        config["behaviors"]["Goal"]["max_steps"] = 1000

    trainer = start_learn(tmp_path, learn_command(write_config(tmp_path, "goal_player.yaml", edit)))
    output: list = []
    try:
        wait_for_line(trainer, "Listening on port 5004", output)
        time.sleep(0.5)
        took = stop(trainer, output)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
    text = "".join(output)
    assert took < 5, text[-2000:]  # not shutdown_timeout_s (10 s)
    assert "Zombie worker report" not in text


# ------------------------------------------------- settings and envs that cannot be used


@pytest.mark.timeout(120)
@pytest.mark.parametrize("env_manager, words", [
    ({"shutdown_timeout_s": float("inf")}, "env_manager.shutdown_timeout_s: expected a number of seconds above 0"),
    ({"enabled": False, "env": "mlagents_plugin.testing:simple_env"}, "'env' needs the plugin, but 'enabled' is false"),
    ({"env": ":"}, "env_manager.env: expected 'package.module:factory', got ':'"),
    ({"env": "no_such_env_module:make"}, "there is no module 'no_such_env_module'"),
    ({"listen": "everywhere"}, "env_manager.listen: expected loopback (or localhost), all (every address), or one IP"),
    ({"listen": "192.0.2.1"}, "env_manager.listen: this machine cannot listen on 192.0.2.1"),  # TEST-NET-1
    ({"listen": "0.0.0.0"}, "env_manager.listen: expected loopback (or localhost), all (every address), or one IP"),
], ids=["inf", "disabled-with-env", "colon", "missing-module", "listen-word", "listen-not-here", "listen-wildcard"])
def test_what_cannot_work_stops_mlagents_learn_before_anything_starts(tmp_path, env_manager, words):
    def edit(config):
        config["env_manager"] = env_manager

    config = write_config(tmp_path, "simple_python_env.yaml", edit)
    result = run_learn(tmp_path, config, "--num-envs=2", timeout=120)
    assert result.returncode != 0
    assert "mlagents-learn: configuration error: " in result.stderr and words in result.stderr, result.stderr[-3000:]
    assert not (tmp_path / "results" / "run").exists()  # the fixed YAML runs again without --force
