"""Ctrl-C and SIGTERM to a real `mlagents-learn`: the model is saved, nothing is left behind,
and a second Ctrl-C stops at once (NOTE [ Trainer signals ])."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers import finish, learn_command, start_learn, wait_for_files, wait_for_line, write_config

from mlagents_plugin.local.processes import every_process

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(sys.platform == "win32", reason="stops mlagents-learn with POSIX signals to its process "
                       "group (os.killpg); Windows' Ctrl-C and Ctrl-Break need a person with the machine "
                       "(docs/platforms.md)"),
]


def start_training(tmp_path: Path, env_kwargs: dict, **env_manager) -> subprocess.Popen:
    def edit(config):
        config["behaviors"]["Simple"]["max_steps"] = 10**7  # runs until it is stopped
        config["env_manager"] = {
            "env": "mlagents_plugin.testing:testing_env",
            "env_kwargs": env_kwargs,
            **env_manager,
        }

    config = write_config(tmp_path, "simple_python_env.yaml", edit)
    return start_learn(tmp_path, learn_command(config, "--num-envs=2"))


def group_members(pgid: int, settle_s: float = 3.0):
    """Processes left in the trainer's process group, once those already exiting are gone
    (multiprocessing's fork server, for one, leaves when it sees the trainer has)."""
    deadline = time.monotonic() + settle_s
    while True:
        members = []
        for proc in every_process():
            try:
                if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                    members.append(proc.pid)
            except (ProcessLookupError, psutil.Error):
                pass
        if not members or time.monotonic() > deadline:
            return members
        time.sleep(0.05)


def assert_nothing_left(trainer: subprocess.Popen, player_dir: Path) -> None:
    players = [int(p.name) for p in player_dir.iterdir()]
    assert len(players) >= 2
    assert not [p for p in players if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert group_members(trainer.pid) == []


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_one_interrupt_saves_the_model_and_leaves_nothing(tmp_path, how):
    players = tmp_path / "players"
    players.mkdir()
    trainer = start_training(
        tmp_path,
        {"env_class": "PlayerLaunchingEnvironment", "player_pid_dir": str(players), "step_sleep_s": 0.005},
    )
    output: list = []
    try:
        wait_for_line(trainer, "Step: 500.", output)
        if how == "ctrl-c":
            os.killpg(trainer.pid, signal.SIGINT)  # what a terminal does
        else:
            os.kill(trainer.pid, signal.SIGTERM)
        finish(trainer, output, timeout_s=60)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
    text = "".join(output)
    assert "Learning was interrupted" in text, text[-3000:]
    assert (tmp_path / "results" / "run" / "Simple.onnx").exists()
    assert_nothing_left(trainer, players)


@pytest.mark.timeout(240)
def test_a_second_ctrl_c_stops_at_once(tmp_path):
    closing = tmp_path / "closing"
    closing.mkdir()
    trainer = start_training(
        tmp_path,
        {
            "env_class": "HangingEnvironment",
            "during": "close",
            "ignore_sigterm": True,
            "step_sleep_s": 0.005,
            "fired_dir": str(closing),
        },
        shutdown_timeout_s=120,
        kill_grace_s=120,
    )
    output: list = []
    try:
        wait_for_line(trainer, "Step: 500.", output)
        os.killpg(trainer.pid, signal.SIGINT)
        wait_for_line(trainer, "Learning was interrupted", output)
        wait_for_files(closing, [0, 1])  # the model is saved; close() waits for envs that never close
        os.killpg(trainer.pid, signal.SIGINT)
        took = finish(trainer, output, timeout_s=60)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
    assert took < 30  # far below the 240 s the ladder would have waited
    assert "was killed at once on a second interrupt" in "".join(output)
    assert group_members(trainer.pid) == []
    # close() returned instead of raising: ML-Agents wrote its run logs after it.
    run_logs = tmp_path / "results" / "run" / "run_logs"
    assert (run_logs / "timers.json").exists() and (run_logs / "training_status.json").exists()
