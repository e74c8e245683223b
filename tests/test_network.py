"""Training opens no door to the network: every gRPC server a run starts for its Unity builds, or
for the Editor, listens on loopback unless ``env_manager.listen`` says otherwise (NOTE [ Loopback
only ] in integration/rpc_server.py). Nothing here connects anywhere: sockets are read with psutil."""
import ipaddress
import os
import signal
import time
from typing import List

import pytest
from helpers import (
    Listener,
    finish,
    free_port_block,
    learn_command,
    listeners,
    start_learn,
    wait_for_line,
    write_config,
)

from mlagents_plugin.integration import rpc_server
from mlagents_plugin.player.build import make_build

EDITOR_PORT = 5004  # where mlagents-learn waits for the Editor, whatever --base-port says


def listeners_on(root_pid: int, ports: List[int], trainer, within_s: float = 120.0) -> List[Listener]:
    """The run's listeners, once something listens on each of ``ports``."""
    deadline = time.monotonic() + within_s
    while True:
        found = listeners(root_pid)
        if set(ports) <= {listener.port for listener in found}:
            return found
        assert trainer.poll() is None, f"the run ended before listening on {ports}"
        assert time.monotonic() < deadline, f"nothing listened on {ports} within {within_s} s: {found}"
        time.sleep(0.2)


def loopback_families() -> set:
    """Where the default listens: IPv4 loopback, and IPv6's where this machine has it."""
    return {"127.0.0.1", "::1"} if rpc_server._has_ipv6_loopback() else {"127.0.0.1"}


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_run_on_player_builds_listens_on_loopback_only_and_trains(tmp_path):
    make_build(str(tmp_path), "goal")

    def edit(config):
        config["behaviors"]["Goal"].update(max_steps=1000, summary_freq=500)

    base_port = free_port_block(8)
    trainer = start_learn(tmp_path, learn_command(
        write_config(tmp_path, "goal_player.yaml", edit), f"--env={tmp_path / 'goal'}", "--num-envs=2",
        f"--base-port={base_port}", "--env-args", "--num-agents", "4",
    ))
    output: list = []
    try:
        wait_for_line(trainer, "Env manager:", output)
        found = listeners_on(trainer.pid, [base_port, base_port + 1], trainer)
        finish(trainer, output, timeout_s=240)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
    text = "".join(output)
    assert "listen='loopback'" in text, text[-3000:]  # the start line says what is in force
    assert all(ipaddress.ip_address(listener.ip).is_loopback for listener in found), found
    for port in (base_port, base_port + 1):  # a build resolving "localhost" either way connects
        assert {listener.ip for listener in found if listener.port == port} == loopback_families(), found
    assert trainer.returncode == 0, text[-3000:]
    assert (tmp_path / "results" / "run" / "Goal.onnx").exists(), text[-3000:]
    assert "listen: loopback" in (tmp_path / "results" / "run" / "env_manager.yaml").read_text()


@pytest.mark.timeout(120)
@pytest.mark.xdist_group("editor-port")  # the Editor's port, 5004, is fixed
@pytest.mark.parametrize("listen, expected", [
    (None, "loopback"),
    ("all", "every address"),  # the opt-out, as mlagents-envs binds
    ("127.0.0.2", "127.0.0.2"),  # one address of this machine (loopback: nothing is exposed)
], ids=["default", "all", "one-address"])
def test_waiting_for_the_editor_listens_where_the_setting_says(tmp_path, listen, expected):
    def edit(config):
        config["behaviors"]["Goal"]["max_steps"] = 1000
        if listen is not None:
            config["env_manager"] = {"listen": listen}

    trainer = start_learn(tmp_path, learn_command(write_config(tmp_path, "goal_player.yaml", edit)))
    output: list = []
    try:
        wait_for_line(trainer, f"Listening on port {EDITOR_PORT}", output)
        found = [s for s in listeners_on(trainer.pid, [EDITOR_PORT], trainer) if s.port == EDITOR_PORT]
        os.killpg(trainer.pid, signal.SIGINT)
        finish(trainer, output, timeout_s=60)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
    ips = {listener.ip for listener in found}
    if expected == "loopback":
        assert ips == loopback_families(), found
    elif expected == "every address":
        assert ips <= {"::", "0.0.0.0"} and ips, found
    else:
        assert ips == {expected}, found
    assert len({listener.pid for listener in found}) == 1, found  # the one worker, not the trainer
    assert found[0].pid != trainer.pid, found
