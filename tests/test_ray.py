"""RayEnvManager on the session's loopback Ray cluster: actors, players, node loss, close (what
every backend does: test_contract.py).

Every test here shares one Ray (the ``ray_cluster`` fixture, conftest.py) and one xdist worker.
"""
import glob
import ipaddress
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers import KillOnceBusy, alive_after, free_port_block, listeners, loopback_families, run_learn, write_config
from mlagents.trainers.learn import create_environment_factory
from mlagents.trainers.settings import RunOptions

from mlagents_plugin.core.errors import WorkerDiedError
from mlagents_plugin.core.protocol import EnvironmentCommand
from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.local.processes import every_process
from mlagents_plugin.player.build import make_build
from mlagents_plugin.ray.backend import CALL_WAIT_S, CLOSE_SLACK_S
from mlagents_plugin.ray.manager import RayEnvManager
from mlagents_plugin.testing import (
    HangingEnvironment,
    PlayerLaunchingEnvironment,
    SimpleEnvironment,
    make_factory,
)
from mlagents_plugin.testing.training import check_environment_trains

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]


@pytest.fixture
def ray_manager(ray_cluster):
    """``make(env_factory, n_env, run_options=None, **settings)`` -> a RayEnvManager, closed after;
    then no actor and no env worker of it may be left, nor an outside connect logged."""
    managers = []

    def make(env_factory, n_env=1, run_options=None, **settings):
        settings.setdefault("ray", {"num_cpus_per_worker": 1})
        manager = RayEnvManager(
            env_factory, run_options or RunOptions(), n_env, EnvManagerSettings(backend="ray", **settings)
        )
        managers.append(manager)
        return manager

    yield make
    pids = []
    for manager in managers:
        placements = manager.placements.values()
        pids += [p.actor_pid for p in placements] + [p.pid for p in placements]
        manager.close()
    assert not alive_after(pids, 5.0), "actors or env workers outlived close()"
    ray_cluster.assert_no_outside_connects()


@pytest.mark.timeout(120)
def test_a_ray_driver_is_not_forked_into_a_fork_server(ray_manager):
    """It runs Ray's threads (NOTE [ A fork server forked from the trainer ]): a Python env's
    manager that it builds later gets a fresh fork server."""
    from mlagents_plugin.local import fork_server

    ray_manager(make_factory(SimpleEnvironment)).reset()
    assert fork_server._why_not_fork() == "this process is a Ray driver"


@pytest.mark.timeout(120)
def test_actor_death_is_a_worker_death_naming_the_actor(ray_manager):
    run_options = RunOptions()
    run_options.env_settings.max_lifetime_restarts = 0  # no restart: the death surfaces
    manager = ray_manager(make_factory(SimpleEnvironment, step_sleep_s=0.01), 2, run_options, step_timeout_s=600)
    manager.reset()
    actor_pid = _actor_pid(manager, 0)
    os.kill(actor_pid, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(WorkerDiedError) as info:
        for _ in range(10_000):
            manager.get_steps()
    assert time.monotonic() - started < 5
    assert f"in Ray actor pid {actor_pid} on node 127.0.0.1" in str(info.value)
    assert "its Ray actor died" in str(info.value)
    assert "no restarts left" in info.value.__notes__[-1]


@pytest.mark.timeout(180)
def test_actor_kill_takes_its_player_down(ray_manager, tmp_path):
    """A Unity-like player runs in its own session, outside the actor's process tree."""
    pid_dir = tmp_path / "players"
    pid_dir.mkdir()
    manager = ray_manager(
        make_factory(PlayerLaunchingEnvironment, player_pid_dir=str(pid_dir)), 1, restart_backoff_s=0.0
    )
    manager.reset()
    (first_player,) = [int(p.name) for p in pid_dir.iterdir()]
    os.kill(_actor_pid(manager, 0), signal.SIGKILL)
    while len(list(pid_dir.iterdir())) < 2:
        manager.get_steps()
    assert not alive_after([first_player], 3.0), "the killed actor's player survived"
    manager.close()
    assert not alive_after([int(p.name) for p in pid_dir.iterdir()], 3.0)


@pytest.mark.timeout(240)
def test_removed_node_has_its_actors_recreated_on_the_survivor(ray_cluster, ray_manager):
    node = ray_cluster.add_node(num_cpus=8)
    try:
        manager = ray_manager(make_factory(SimpleEnvironment), 2, restart_backoff_s=0.0)  # SPREAD
        manager.reset()
        for _ in range(20):
            manager.get_steps()
        nodes = {worker_id: p.node_id for worker_id, p in manager.placements.items()}
        assert node.node_id in nodes.values() and len(set(nodes.values())) == 2
        lost = [w for w, n in nodes.items() if n == node.node_id]
    finally:
        ray_cluster.cluster.remove_node(node)
    deadline = time.monotonic() + 60
    stepped = set()
    while time.monotonic() < deadline and not (
        manager.restart_counts.get("died", 0) == len(lost) and stepped >= set(lost)
    ):
        steps = manager.get_steps()
        if manager.restart_counts.get("died", 0) == len(lost):
            stepped |= {step.worker_id for step in steps}
    assert manager.restart_counts == {"died": len(lost)}
    assert stepped >= set(lost), "the re-created actors never stepped"
    assert all(p.node_id != node.node_id for p in manager.placements.values())


@pytest.mark.timeout(180)
def test_a_trainer_busy_past_the_call_bound_reads_what_its_far_actor_answered(ray_cluster, ray_manager):
    """The trainer is in a long update while an actor on another node answers with a report too
    big to travel inline (Ray keeps it in that node's object store). Its next wait is bounded at 0
    s, as the exchange is overdue: the finished call is read (fetched then), not taken for a
    wedged actor and killed with its envs (NOTE [ Answered is not fetched ])."""
    node = ray_cluster.add_node(num_cpus=2, resources={"far": 1})
    try:
        manager = ray_manager(
            make_factory(SimpleEnvironment, vector_size=60000), 1, shutdown_timeout_s=0.5, kill_grace_s=0.5,
            restart_backoff_s=0.0, ray={"num_cpus_per_worker": 1, "resources": {"far": 1}},
        )
        manager.reset()
        manager.get_steps()  # (early actions: the next STEP went as this one landed)
        manager.stepper.send_actions()  # (else now)
        assert manager.placements[0].node_id == node.node_id
        assert manager.workers[0].awaiting is EnvironmentCommand.STEP  # its exchange is out ...
        time.sleep(CALL_WAIT_S + 0.5 + 0.5 + CLOSE_SLACK_S + 1.0)  # ... the update: past its bound
        for _ in range(5):
            manager.get_steps()
        assert manager.restart_counts == {}
        manager.close()
    finally:
        ray_cluster.cluster.remove_node(node)


@pytest.mark.timeout(180)
def test_player_build_runs_on_the_actors_node(ray_manager, tmp_path):
    """Stock mlagents-learn's env factory on a player build, two workers on distinct ports."""
    make_build(str(tmp_path), "goal")
    run_options = RunOptions()
    env_settings = run_options.env_settings
    env_settings.base_port = free_port_block(4)
    factory = create_environment_factory(
        str(tmp_path / "goal"), True, True, 0, 1, 60, env_settings.base_port, [], str(tmp_path)
    )
    manager = ray_manager(factory, 2, run_options)
    manager.reset()
    assert "Goal?team=0" in manager.training_behaviors
    for _ in range(30):
        manager.get_steps()
    servers = [s for pid in manager.worker_pids.values() for s in listeners(pid)]
    for port in (env_settings.base_port, env_settings.base_port + 1):  # NOTE [ Loopback only ]: on Ray too
        assert {s.ip for s in servers if s.port == port} == loopback_families(), servers
    assert all(ipaddress.ip_address(s.ip).is_loopback for s in servers), servers
    players = [c for pid in manager.worker_pids.values() for c in psutil.Process(pid).children()]
    manager.close()
    assert not alive_after([p.pid for p in players], 3.0)


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_mlagents_learn_trains_with_the_ray_backend(ray_cluster, tmp_path):
    config = write_config(
        tmp_path,
        "simple_python_env.yaml",
        lambda c: c["env_manager"].update(backend="ray", ray={"address": ray_cluster.address}),
    )
    result = run_learn(tmp_path, config, "--num-envs=2")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "Env manager: RayEnvManager" in result.stdout
    assert list(Path(tmp_path).rglob("*.onnx"))
    ray_cluster.assert_no_outside_connects()


def _actor_pid(manager: RayEnvManager, worker_id: int) -> int:
    placement = manager.placements.get(worker_id)
    assert placement is not None, f"worker {worker_id} has not started"
    return placement.actor_pid


def _players_on(port: int):
    found = []
    for proc in every_process():
        try:
            if f"--mlagents-port {port}" in " ".join(proc.cmdline()) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except psutil.Error:
            pass
    return found


@pytest.mark.timeout(240)
def test_a_hung_build_is_taken_down_by_its_actors_ladder(ray_manager, tmp_path):
    """The hung player cannot exit by itself: after step_timeout_s the actor's shutdown ladder
    kills its worker, and the player goes with it (NOTE [ Players die with their worker ])."""
    make_build(str(tmp_path), "goal")
    run_options = RunOptions()
    base = run_options.env_settings.base_port = free_port_block(6)
    hang = ["--hang-after-steps", "20", "--fault-port", str(base + 1), "--fault-once", str(tmp_path / "hung"),
            "--survive-trainer"]
    factory = create_environment_factory(  # --timeout-wait 600: our step_timeout_s comes first
        str(tmp_path / "goal"), True, True, 0, 1, 600, base, hang, str(tmp_path)
    )
    manager = ray_manager(factory, 2, run_options, step_timeout_s=3.0, restart_backoff_s=0.0)
    manager.reset()
    (hung_player,) = _players_on(base + 1)
    deadline = time.monotonic() + 120
    while manager.restart_counts.get("hung") != 1:
        assert time.monotonic() < deadline, "the hang was never noticed"
        manager.get_steps()
    assert not alive_after([hung_player], 10.0), "the hung player outlived its worker"
    for _ in range(20):  # the restarted worker's new player steps
        manager.get_steps()


@pytest.mark.timeout(300)
def test_a_killed_actor_of_several_envs_restarts_them_all_and_training_goes_on(ray_manager):
    """envs_per_worker 2: killing the actor of envs 2 and 3 restarts both (on a new actor), and
    only them; trajectories stay per env, so the trainer still learns."""
    manager = ray_manager(make_factory(SimpleEnvironment), 4, envs_per_worker=2, restart_backoff_s=0.0)
    manager.reset()
    before = manager.placements
    assert before[0].actor_pid == before[1].actor_pid != before[2].actor_pid == before[3].actor_pid
    killer = KillOnceBusy(before[2].actor_pid)
    try:
        check_environment_trains(manager, success_threshold=0.7, max_steps=3000)
    finally:
        killer.cancel()
    assert manager.restart_counts == {"died": 2}
    after = manager.placements
    assert [after[w].pid for w in (0, 1)] == [before[w].pid for w in (0, 1)]
    assert after[2].actor_pid == after[3].actor_pid not in (before[0].actor_pid, before[2].actor_pid)


@pytest.mark.timeout(180)
def test_a_hung_env_is_killed_by_its_actor_and_its_neighbours_go_on(ray_manager):
    """envs_per_worker 4, env 1 hangs: its actor's ladder kills its worker, the actor stays, and
    envs 0, 2 and 3 keep stepping while env 1 is hung and while it restarts."""
    factory = make_factory(HangingEnvironment, after_steps=20, only_worker=1, step_sleep_s=0.01)
    manager = ray_manager(factory, 4, envs_per_worker=4, step_timeout_s=3.0, restart_backoff_s=0.0)
    manager.reset()
    before = manager.placements
    assert len({p.actor_pid for p in before.values()}) == 1
    steps_while_hung = {0: 0, 2: 0, 3: 0}  # since env 1's last step
    deadline = time.monotonic() + 60
    while manager.restart_counts.get("hung") != 1:
        assert time.monotonic() < deadline, "the hang was never noticed"
        for step in manager.get_steps():
            if step.worker_id == 1:
                steps_while_hung = dict.fromkeys(steps_while_hung, 0)
            else:
                steps_while_hung[step.worker_id] += 1
    # step_timeout_s is 3 s, a step 10 ms (and one actor call tens of ms on a loaded machine):
    # each neighbour went on stepping all the while env 1 was hung.
    assert min(steps_while_hung.values()) >= 10, steps_while_hung
    assert not alive_after([before[1].pid], 10.0), "the hung worker outlived its actor's ladder"
    deadline = time.monotonic() + 60
    while 1 not in {step.worker_id for step in manager.get_steps()}:
        assert time.monotonic() < deadline, "env 1 never stepped again"
    after = manager.placements
    assert after[1].actor_pid == before[1].actor_pid and after[1].pid != before[1].pid
    assert [after[w].pid for w in (0, 2, 3)] == [before[w].pid for w in (0, 2, 3)]
    assert manager.restart_counts == {"hung": 1}


TRAINER_ON_LOCAL_RAY = """
import os, sys
from mlagents.trainers.learn import create_environment_factory
from mlagents.trainers.settings import RunOptions
from mlagents_plugin.ray.manager import RayEnvManager
from mlagents_plugin.core.settings import EnvManagerSettings
if __name__ == "__main__":
    build, port = sys.argv[1], int(sys.argv[2])
    factory = create_environment_factory(
        build, True, True, 0, 1, 60, port, ["--survive-trainer"], os.path.dirname(build)
    )
    manager = RayEnvManager(factory, RunOptions(), 2, EnvManagerSettings(backend="ray"))  # its own Ray
    manager.reset()
    print("STEPPING", flush=True)
    while True:
        manager.get_steps()
"""


@pytest.mark.timeout(240)
def test_a_sigkilled_trainer_on_its_own_ray_leaves_no_player_and_no_temp_dir(ray_cluster, tmp_path):
    """The trainer starts a loopback Ray of its own (no address), under the netguard the session
    fixture put on PYTHONPATH; then it is SIGKILLed."""
    make_build(str(tmp_path), "goal")
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER_ON_LOCAL_RAY)
    port = free_port_block(4)
    trainer = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "goal"), str(port)],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        assert trainer.stdout.readline().strip() == "STEPPING"
        players = _players_on(port) + _players_on(port + 1)
        assert len(players) == 2
        temp_dirs = glob.glob(f"/tmp/mlap-ray-{trainer.pid}-*")
        assert len(temp_dirs) == 1
        trainer.kill()
        trainer.wait()
        assert not alive_after(players, 15.0), "players outlived their trainer"
        deadline = time.monotonic() + 15
        while os.path.exists(temp_dirs[0]):
            assert time.monotonic() < deadline, f"{temp_dirs[0]} was left behind"
            time.sleep(0.1)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
    ray_cluster.assert_no_outside_connects()


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_an_unreachable_ray_address_fails_within_seconds_in_words(ray_cluster, tmp_path):
    config = write_config(
        tmp_path, "simple_python_env.yaml",
        lambda c: c["env_manager"].update(backend="ray", ray={"address": "127.0.0.1:1"}),
    )
    started = time.monotonic()
    result = run_learn(tmp_path, config, "--num-envs=2", timeout=100)
    assert result.returncode != 0
    assert time.monotonic() - started < 60
    assert "env_manager.ray.address '127.0.0.1:1': nothing answers at 127.0.0.1:1" in result.stderr, result.stderr[
        -2000:
    ]
    ray_cluster.assert_no_outside_connects()
