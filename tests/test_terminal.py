"""What people do at a terminal, on a shared machine and in a container, through a real
`mlagents-learn` on player builds (docs/faults.md): Ctrl-Z and `fg`, Ctrl-C at any moment,
several runs on the default port, a small /dev/shm."""
import os
import signal
import time

import psutil
import pytest
from helpers import finish, free_port_block, learn_command, start_learn, wait_for_line, write_config

from mlagents_plugin.player.build import make_build

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    directory = tmp_path_factory.mktemp("builds")
    make_build(str(directory), "goal")
    return directory


def goal_config(tmp_path, **env_manager):
    def edit(config):
        config["behaviors"]["Goal"]["max_steps"] = 10**7
        config["behaviors"]["Goal"]["summary_freq"] = 500
        config["env_manager"] = env_manager

    return write_config(tmp_path, "goal_player.yaml", edit)


def stop_with_ctrl_c(trainer, output):
    os.killpg(trainer.pid, signal.SIGINT)
    finish(trainer, output, timeout_s=60)


@pytest.mark.timeout(300)
def test_ctrl_z_then_fg_restarts_nothing(tmp_path, builds):
    """The trainer's process group stopped for three times step_timeout_s, then continued.

    A terminal's Ctrl-Z sends SIGTSTP; the kernel discards it for this test's group (an
    orphaned process group: its parent, pytest, is in another session), so the group gets
    SIGSTOP, which is what SIGTSTP then does, and what freezing a VM or a container does."""
    config = goal_config(tmp_path, step_timeout_s=4)
    trainer = start_learn(tmp_path, learn_command(
        config, f"--env={builds / 'goal'}", "--num-envs=2", f"--base-port={free_port_block(10)}",
        "--env-args", "--num-agents", "4",
    ))
    output: list = []
    try:
        wait_for_line(trainer, "Step: 1000.", output)
        group = [trainer.pid] + [p.pid for p in psutil.Process(trainer.pid).children(recursive=True)]
        os.killpg(trainer.pid, signal.SIGSTOP)
        time.sleep(12)
        os.killpg(trainer.pid, signal.SIGCONT)
        wait_for_line(trainer, "Step: 2000.", output)
        stop_with_ctrl_c(trainer, output)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
    text = "".join(output)
    assert len(group) >= 5, text[-2000:]  # trainer, fork server, 2 workers, their players
    assert "did not answer" not in text and "Restarting env worker" not in text, text[-3000:]
    assert text.count("restarts: none") == 2, text[-3000:]
    assert trainer.returncode == 0


def players_of(tmp_path):
    """Players (and anything else) still running that were started for this test's folder."""
    found = []
    for proc in psutil.process_iter():
        try:
            if str(tmp_path) in " ".join(proc.cmdline()) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except psutil.Error:
            pass
    return found


@pytest.mark.timeout(300)
@pytest.mark.parametrize("delay_s", [0.0, 0.3, 1.5], ids=["launch", "handshake", "reset"])
def test_ctrl_c_while_the_builds_start_is_an_ordinary_interrupt(tmp_path, builds, delay_s):
    """Ctrl-C that many seconds after the `Env manager:` line, while 4 workers launch, connect
    to their players and reset: ML-Agents' interrupt (exit 0), never an error from close()."""
    trainer = start_learn(tmp_path, learn_command(
        goal_config(tmp_path), f"--env={builds / 'goal'}", "--num-envs=4", f"--base-port={free_port_block(16)}",
        "--env-args", "--num-agents", "4",
    ))
    output: list = []
    try:
        wait_for_line(trainer, "Env manager: ", output)
        time.sleep(delay_s)
        stop_with_ctrl_c(trainer, output)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
    text = "".join(output)
    assert trainer.returncode == 0, text[-3000:]
    assert "Learning was interrupted" in text and "Traceback" not in text, text[-3000:]
    deadline = time.monotonic() + 5
    while players_of(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert players_of(tmp_path) == []


@pytest.mark.timeout(240)
def test_one_ctrl_c_while_closing_lets_the_envs_close(tmp_path):
    """Training ended by itself; the envs take 6 s to close; one Ctrl-C meanwhile hurries the
    close along but does not cut the envs' own close short (a second one would)."""
    closed = tmp_path / "closed"
    closed.mkdir()

    def edit(config):
        config["behaviors"]["Simple"]["max_steps"] = 600
        config["env_manager"]["env_kwargs"] = {"env_class": "SlowClosingEnvironment", "close_s": 6.0,
                                               "closed_dir": str(closed)}
        config["env_manager"]["env"] = "mlagents_plugin.testing:testing_env"

    trainer = start_learn(tmp_path, learn_command(write_config(tmp_path, "simple_python_env.yaml", edit),
                                                  "--num-envs=2"))
    output: list = []
    try:
        wait_for_line(trainer, "Copied ", output)  # the model is exported; close() comes next
        time.sleep(1.5)
        os.killpg(trainer.pid, signal.SIGINT)
        finish(trainer, output, timeout_s=60)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
    text = "".join(output)
    assert "Interrupted while closing" in text and "Interrupted again" not in text, text[-3000:]
    assert sorted(p.name for p in closed.iterdir()) == ["0", "1"], text[-3000:]
    assert trainer.returncode == 0 and "Traceback" not in text
