"""Training opens no door to the network: every gRPC server a run starts for its Unity builds, or
for the Editor, listens on loopback unless ``env_manager.listen`` says otherwise (NOTE [ Loopback
only ] in local/rpc_server.py). Nothing here connects anywhere: sockets are read with psutil."""
import ipaddress
import os
import signal
import socket
import sys

import pytest
from helpers import (
    HOLDERS_VISIBLE,
    finish,
    free_port_block,
    kill,
    learn_command,
    listeners_on,
    loopback_families,
    start_learn,
    wait_for_line,
    write_config,
)
from mlagents_envs.environment import UnityEnvironment

from mlagents_plugin.core.errors import ListenAddressError
from mlagents_plugin.player.build import make_build

EDITOR_PORT = 5004  # where mlagents-learn waits for the Editor, whatever --base-port says
EVERY_ADDRESS = {"::"} if "::1" in loopback_families() else {"0.0.0.0"}  # gRPC's "[::]" without IPv6


def bindable(ip: str) -> bool:
    """Does this machine have the address (a bind to it succeeds)?"""
    try:
        with socket.socket() as probe:
            probe.bind((ip, 0))
        return True
    except OSError:
        return False


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_run_on_player_builds_listens_on_loopback_only_and_trains(tmp_path):
    make_build(str(tmp_path), "goal")

    def edit(config):
        config["behaviors"]["Goal"].update(max_steps=1000, summary_freq=500)

    base_port = free_port_block(8)
    ports = {base_port: loopback_families(), base_port + 1: loopback_families()}
    trainer = start_learn(tmp_path, learn_command(
        write_config(tmp_path, "goal_player.yaml", edit), f"--env={tmp_path / 'goal'}", "--num-envs=2",
        f"--base-port={base_port}", "--env-args", "--num-agents", "4",
    ))
    output: list = []
    try:
        wait_for_line(trainer, "Env manager:", output)
        found = listeners_on(trainer.pid, ports, trainer)
        finish(trainer, output, timeout_s=240)
    finally:
        if trainer.poll() is None:
            kill(trainer)
    text = "".join(output)
    assert "listen='loopback'" in text, text[-3000:]  # the start line says what is in force
    assert all(ipaddress.ip_address(listener.ip).is_loopback for listener in found), found
    for port, ips in ports.items():  # a build resolving "localhost" either way connects
        assert {listener.ip for listener in found if listener.port == port} == ips, found
    assert trainer.returncode == 0, text[-3000:]
    assert (tmp_path / "results" / "run" / "Goal.onnx").exists(), text[-3000:]
    assert "listen: loopback" in (tmp_path / "results" / "run" / "env_manager.yaml").read_text()


@pytest.mark.timeout(120)
@pytest.mark.xdist_group("editor-port")  # the Editor's port, 5004, is fixed
@pytest.mark.parametrize("listen, expected", [
    (None, loopback_families()),
    ("all", EVERY_ADDRESS),  # the opt-out: every address, IPv4 and IPv6, as mlagents-envs binds
    pytest.param(  # one more address (a loopback one: nothing exposed)
        "127.0.0.2", loopback_families() | {"127.0.0.2"},
        marks=pytest.mark.skipif(not bindable("127.0.0.2"), reason="this machine's loopback interface has no "
                                 "127.0.0.2 (macOS gives lo0 127.0.0.1 alone; `sudo ifconfig lo0 alias 127.0.0.2` "
                                 "adds it)"),
    ),
], ids=["default", "all", "one-address"])
def test_waiting_for_the_editor_listens_where_the_setting_says(tmp_path, listen, expected, editor_port):
    def edit(config):
        config["behaviors"]["Goal"]["max_steps"] = 1000
        if listen is not None:
            config["env_manager"] = {"listen": listen}

    trainer = start_learn(tmp_path, learn_command(write_config(tmp_path, "goal_player.yaml", edit)))
    output: list = []
    try:
        wait_for_line(trainer, f"Listening on port {EDITOR_PORT}", output)
        found = [s for s in listeners_on(trainer.pid, {EDITOR_PORT: expected}, trainer) if s.port == EDITOR_PORT]
        if sys.platform == "win32":  # no process group to send a Ctrl-C to: what listened is seen
            kill(trainer)
        else:
            os.killpg(trainer.pid, signal.SIGINT)
        finish(trainer, output, timeout_s=60)
    finally:
        if trainer.poll() is None:
            kill(trainer)
    assert {listener.ip for listener in found} == expected, found
    assert {listener.pid for listener in found} != {trainer.pid}, found  # the worker's, not the trainer's
    assert len({listener.pid for listener in found}) == 1, found


@pytest.mark.timeout(120)
@pytest.mark.xdist_group("editor-port")  # the Editor's port, 5004, is fixed
def test_a_second_run_waiting_for_the_editor_says_who_holds_its_port(tmp_path, editor_port):
    """The Editor has one port: the worker is not moved to another (the Editor would never come),
    and the run stops naming the process that holds it."""
    def edit(config):
        config["behaviors"]["Goal"]["max_steps"] = 1000

    with socket.socket() as holder:  # the first run, as far as the port is concerned
        # as a server binds (gRPC too): an earlier test's closed connections to 5004 may linger
        # in TIME_WAIT, which a plain bind takes for "in use"
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", EDITOR_PORT))
        holder.listen()
        trainer = start_learn(tmp_path, learn_command(write_config(tmp_path, "goal_player.yaml", edit)))
        output: list = []
        try:
            finish(trainer, output, timeout_s=90)
        finally:
            if trainer.poll() is None:
                kill(trainer)
    text = "".join(output)
    assert trainer.returncode != 0
    holder = f"pid {os.getpid()}" if HOLDERS_VISIBLE else "another process"
    said = f"mlagents-learn waits for the Unity Editor on port {EDITOR_PORT}, which {holder}"
    assert said in text, text[-3000:]
    assert "worker-id must be 0" not in text


@pytest.mark.timeout(60)
def test_an_address_the_workers_machine_lacks_fails_the_worker_for_good(env_manager_factory):
    """On a Ray cluster the trainer cannot check ``listen`` for every node: a worker whose
    machine lacks the address raises ListenAddressError, and restarting cannot help."""
    port = free_port_block(2)

    def editor(worker_id, side_channels):  # binds its server at construction, then would wait
        return UnityEnvironment(None, worker_id, base_port=port, side_channels=side_channels, timeout_wait=5)

    manager = env_manager_factory(editor, 1, listen="192.0.2.1")  # TEST-NET-1: nobody's address
    with pytest.raises(ListenAddressError, match="this machine cannot listen on 192.0.2.1"):
        manager.reset()
    assert manager.restart_counts == {}
