"""What people do at a terminal, on a shared machine and in a container, through a real
`mlagents-learn` on player builds (docs/faults.md): Ctrl-Z and `fg`, Ctrl-C at any moment,
several runs on the default port, a small /dev/shm."""
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
from helpers import (
    HOLDERS_VISIBLE,
    finish,
    free_port_block,
    kill,
    learn_command,
    processes_naming,
    start_learn,
    wait_for_line,
    write_config,
)

from mlagents_plugin.local import rpc_server
from mlagents_plugin.player.build import make_build
from mlagents_plugin.testing import SimpleEnvironment, make_factory

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


@pytest.mark.skipif(sys.platform == "win32", reason="SIGSTOP and SIGCONT: Windows has neither")
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


@pytest.mark.skipif(sys.platform == "win32", reason="Ctrl-C as a terminal sends it, to the process "
                    "group (os.killpg): Windows' console events need a person with the machine "
                    "(docs/platforms.md)")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("delay_s", [0.0, 0.3, 1.5])
def test_ctrl_c_while_the_builds_start_is_an_ordinary_interrupt(tmp_path, builds, delay_s):
    """Ctrl-C that many seconds after the `Env manager:` line: somewhere while 4 workers launch,
    connect to their players and reset (the fast tier hits each launch exactly):
    ML-Agents' interrupt (exit 0), never an error from close()."""
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
    while processes_naming(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_naming(tmp_path) == []


@pytest.mark.skipif(sys.platform == "win32", reason="Ctrl-C as a terminal sends it, to the process "
                    "group (os.killpg): Windows' console events need a person with the machine "
                    "(docs/platforms.md)")
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
        deadline = time.monotonic() + 60
        while len(list(closed.glob("*.closing"))) < 2:  # both envs are in their close()
            assert time.monotonic() < deadline and trainer.poll() is None, "".join(output)[-3000:]
            time.sleep(0.05)
        os.killpg(trainer.pid, signal.SIGINT)
        finish(trainer, output, timeout_s=60)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
    text = "".join(output)
    assert "Interrupted while closing" in text and "Interrupted again" not in text, text[-3000:]
    assert sorted(p.name for p in closed.iterdir() if p.suffix != ".closing") == ["0", "1"], text[-3000:]
    assert trainer.returncode == 0 and "Traceback" not in text


# ------------------------------------------------------------------- a small /dev/shm

CAMERA_SCRIPT = """
import os
from mlagents.trainers.settings import RunOptions
from mlagents_plugin import EnvManagerSettings, SupervisedEnvManager
from mlagents_plugin.testing import SimpleEnvironment, make_factory

if __name__ == "__main__":
    factory = make_factory(SimpleEnvironment, num_agents=16, visual_shape=(3, 84, 84))  # 1.4 MB a step
    manager = SupervisedEnvManager(factory, RunOptions(), 8, EnvManagerSettings(restart_backoff_s=0.0))
    try:
        manager.reset()
        stepped = set()
        for _ in range(30):
            for step in manager.get_steps():
                vector, image = step.current_all_step_result["Simple"][0].obs
                assert image.shape == (16, 3, 84, 84)
                assert (image == ((vector[:, 0] + 1) / 2)[:, None, None, None]).all()  # intact
                stepped.add(step.worker_id)
        # one write: the workers share this stdout, and a print() may reach it in pieces
        os.write(1, f"RESULT {sorted(stepped)} {manager.restart_counts}\\n".encode())
    finally:
        manager.close()
"""


def run_with_dev_shm_of(size: str, script: str) -> subprocess.CompletedProcess:
    """``script`` in a mount namespace of its own, where /dev/shm is a tmpfs of ``size``, as in
    a container (`docker run` gives 64 MB)."""
    mount = f'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$0" -c "$1"'
    return subprocess.run(["unshare", "-m", "sh", "-c", mount, sys.executable, script],
                          capture_output=True, text=True, timeout=200)


@pytest.mark.skipif(sys.platform != "linux", reason="a small /dev/shm, mounted in a mount namespace of its "
                    "own (unshare, mount): Linux only")
@pytest.mark.timeout(240)
def test_a_full_dev_shm_falls_back_to_the_pipe_and_says_why():
    """8 workers of 16 cameras each need about 14 MB of /dev/shm; it has 8. Without reserving
    the pages, workers died of SIGBUS at their first reset, again after each restart, and the
    run failed; now the workers without room send through the pipe, and say so."""
    result = run_with_dev_shm_of("8m", CAMERA_SCRIPT)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "RESULT [0, 1, 2, 3, 4, 5, 6, 7] {}" in output, output[-3000:]  # every worker, no restart
    warnings = [line for line in output.splitlines() if "/dev/shm has no room for" in line]
    assert warnings, output[-3000:]
    assert all("/dev/shm is 8.0 MB" in w and "--shm-size" in w and "through the pipe" in w for w in warnings)


@pytest.mark.skipif(sys.platform != "linux", reason="the hint names /dev/shm, which macOS does not have, for a "
                    "SIGBUS, which Windows does not have")
@pytest.mark.timeout(120)
def test_a_bus_error_of_a_worker_using_shared_memory_names_dev_shm(env_manager_factory, caplog):
    factory = make_factory(SimpleEnvironment, num_agents=8, visual_shape=(3, 84, 84))  # 0.7 MB a step
    manager = env_manager_factory(factory, 1, restart_backoff_s=0.0)
    manager.reset()
    os.kill(manager.worker_pids[0], signal.SIGBUS)
    with caplog.at_level(logging.WARNING):
        for _ in range(100):
            manager.get_steps()
            if manager.restart_counts:
                break
    assert manager.restart_counts == {"died": 1}
    restart = [r.getMessage() for r in caplog.records if "Restarting env worker 0" in r.getMessage()]
    assert len(restart) == 1 and "was killed by SIGBUS" in restart[0], restart
    assert "a full /dev/shm is the usual cause (/dev/shm is " in restart[0] and "--shm-size" in restart[0]


# ------------------------------------------------------------- several runs on one port


@pytest.mark.timeout(300)
def test_two_runs_on_the_same_base_port_train_side_by_side(tmp_path, builds):
    """Two `mlagents-learn` runs started together on one --base-port, as two users who both keep
    the default: the second run's workers find the ports held and move at once, naming the
    other run; no player talks to the wrong trainer, so nothing times out or restarts."""
    base_port = str(free_port_block(24))
    runs = []
    for name in ("a", "b"):
        folder = tmp_path / name
        folder.mkdir()

        def edit(config):
            config["behaviors"]["Goal"]["max_steps"] = 3000

        command = learn_command(write_config(folder, "goal_player.yaml", edit), f"--env={builds / 'goal'}",
                                "--num-envs=4", f"--base-port={base_port}", "--env-args", "--num-agents", "4")
        runs.append(start_learn(folder, command))
    outputs = []
    try:
        for run in runs:
            output: list = []
            finish(run, output, timeout_s=200)
            outputs.append("".join(output))
    finally:
        for run in runs:
            if run.poll() is None:
                kill(run)
    text = "\n".join(outputs)
    assert [run.returncode for run in runs] == [0, 0], text[-4000:]
    assert text.count("restarts: none") == 8, text[-4000:]
    moves = [line for line in text.splitlines() if "moving to worker id" in line]
    if HOLDERS_VISIBLE:  # the other run, named
        assert moves and all("is held by pid" in m and "mlagents-learn" in m for m in moves), moves
    else:
        assert moves and all("is in use (by another run on the same --base-port" in m for m in moves), moves


@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS a bind to 127.0.0.1 can succeed beside another "
                    "process's [::] bind: there the bind is no claim (docs/platforms.md)")
@pytest.mark.timeout(60)
def test_a_workers_bind_is_its_claim_on_the_port(monkeypatch):
    """The race two runs on one port meet: both pass mlagents-envs' port check before either
    binds. Upstream's server then shares the port with the other run's (SO_REUSEPORT); ours
    refuses it, so the manager moves the worker (NOTE [ One run per port ])."""
    import grpc
    from mlagents_envs.exception import UnityWorkerInUseException
    from mlagents_envs.rpc_communicator import RpcCommunicator

    port = free_port_block(1)
    other_run = grpc.server(ThreadPoolExecutor(max_workers=1), options=(("grpc.so_reuseport", 1),))
    assert other_run.add_insecure_port(f"[::]:{port}") == port  # bound as mlagents-envs binds
    other_run.start()
    monkeypatch.setattr(RpcCommunicator, "check_port", lambda self, port: None)  # the check passed
    try:
        upstream = RpcCommunicator(worker_id=0, base_port=port)
        assert upstream.is_open  # two servers on one port: players reach either
        upstream.close()
        monkeypatch.setattr(RpcCommunicator, "create_server", RpcCommunicator.create_server)  # undone after
        rpc_server.install("loopback")
        with pytest.raises(UnityWorkerInUseException):
            RpcCommunicator(worker_id=0, base_port=port)
        other_run.stop(None).wait()
        ours = RpcCommunicator(worker_id=0, base_port=port)  # on loopback (NOTE [ Loopback only ])
        try:  # a second run of ours, on loopback too, is refused as well
            with pytest.raises(UnityWorkerInUseException):
                RpcCommunicator(worker_id=0, base_port=port)
        finally:
            ours.close()
    finally:
        other_run.stop(None)


@pytest.mark.skipif(sys.platform == "darwin", reason="binds 127.0.0.2, which macOS does not give its loopback "
                    "interface unless told to")
@pytest.mark.timeout(60)
def test_a_port_held_on_one_of_its_addresses_is_refused_and_nothing_stays_bound(monkeypatch):
    """A worker binds its addresses one after another (NOTE [ Loopback only ]): 127.0.0.1, ::1
    where the machine has it, then the one ``listen`` names. Held on the last alone, the port is
    refused as in use, and the binds already made are let go."""
    from mlagents_envs.exception import UnityWorkerInUseException
    from mlagents_envs.rpc_communicator import RpcCommunicator

    port = free_port_block(1)
    holder = socket.socket()
    holder.bind(("127.0.0.2", port))
    holder.listen()
    monkeypatch.setattr(RpcCommunicator, "create_server", RpcCommunicator.create_server)  # undone after
    rpc_server.install("127.0.0.2")
    try:
        with pytest.raises(UnityWorkerInUseException):
            RpcCommunicator(worker_id=0, base_port=port)
    finally:
        holder.close()
    assert free_port_block(1, start=port) == port  # 127.0.0.1 and ::1 are free again


# ------------------------------------------------------------------- a long TMPDIR


@pytest.mark.timeout(240)
def test_a_long_tmpdir_still_trains(tmp_path):
    """The fork server's socket lives in multiprocessing's temp dir, under TMPDIR, and an AF_UNIX
    path is at most 107 bytes: with a TMPDIR of 100 characters every run stopped with "OSError:
    AF_UNIX path too long" (upstream forks, and trained)."""
    long_tmpdir = tmp_path / ("t" * (100 - len(str(tmp_path))))
    long_tmpdir.mkdir()

    def edit(config):
        config["behaviors"]["Simple"]["max_steps"] = 500

    trainer = start_learn(tmp_path, learn_command(write_config(tmp_path, "simple_python_env.yaml", edit),
                                                  "--num-envs=2"), env={"TMPDIR": str(long_tmpdir)})
    output: list = []
    finish(trainer, output, timeout_s=200)
    text = "".join(output)
    assert trainer.returncode == 0, text[-3000:]
    assert (tmp_path / "results" / "run" / "Simple.onnx").exists(), text[-3000:]
