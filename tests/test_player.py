"""The headless player through mlagents-envs' real UnityEnvironment: launch, gRPC handshake,
scenes, side channels, flags and faults. (End-to-end training: test_e2e_player.py.)"""
import subprocess
import sys
import textwrap

import numpy as np
import psutil
import pytest
from helpers import free_port_block
from mlagents.trainers.learn import create_environment_factory
from mlagents.trainers.settings import RunOptions
from mlagents_envs import env_utils
from mlagents_envs.environment import UnityEnvironment
from mlagents_envs.exception import UnityEnvironmentException, UnityTimeOutException
from mlagents_envs.side_channel.engine_configuration_channel import EngineConfigurationChannel
from mlagents_envs.side_channel.environment_parameters_channel import (
    EnvironmentParametersChannel,
)
from mlagents_envs.side_channel.stats_side_channel import StatsSideChannel

from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.local.supervisor import SupervisedEnvManager
from mlagents_plugin.player import cli
from mlagents_plugin.player.build import make_build


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    directory = tmp_path_factory.mktemp("builds")
    for scene in ("goal", "continuous", "visual", "two-behaviors"):
        make_build(str(directory), scene)
    return directory


@pytest.fixture
def open_env(builds, tmp_path):
    """``open_env(scene, *args, **kwargs)`` -> a UnityEnvironment on a player build, closed after."""
    envs = []

    def open_(scene, *args, side_channels=(), timeout_wait=30, **kwargs):
        env = UnityEnvironment(
            str(builds / scene),
            base_port=free_port_block(1),
            additional_args=list(args),
            side_channels=list(side_channels),
            log_folder=str(tmp_path),
            timeout_wait=timeout_wait,
            no_graphics=True,
            **kwargs,
        )
        envs.append(env)
        return env

    yield open_
    for env in envs:
        env.close()


def random_steps(env, n):
    """Step with random actions; return (decision steps seen, terminal steps, interrupted ones)."""
    decisions = terminals = interrupted = 0
    for _ in range(n):
        for name, spec in env.behavior_specs.items():
            decision_steps, terminal_steps = env.get_steps(name)
            decisions += len(decision_steps)
            terminals += len(terminal_steps)
            interrupted += int(terminal_steps.interrupted.sum())
            env.set_actions(name, spec.action_spec.random_action(len(decision_steps)))
        env.step()
    return decisions, terminals, interrupted


# ------------------------------------------------------------------------------ scenes


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "scene, behaviors, shapes, action",
    [
        ("goal", ["Goal?team=0"], [(3,)], "discrete"),
        ("continuous", ["GoalContinuous?team=0"], [(3,)], "continuous"),
        ("visual", ["GoalVisual?team=0"], [(3, 84, 84), (3,)], "discrete"),
        ("two-behaviors", ["Walker?team=0", "Glider?team=0"], [(3,)], None),
    ],
)
def test_scene_speaks_the_protocol(open_env, scene, behaviors, shapes, action):
    env = open_env(scene, "--num-agents", "3", "--max-step", "8")
    env.reset()
    assert sorted(env.behavior_specs) == sorted(behaviors)
    for name, spec in env.behavior_specs.items():
        assert [o.shape for o in spec.observation_specs] == shapes
        if action == "discrete":
            assert spec.action_spec.discrete_branches == (3,)
        elif action == "continuous":
            assert spec.action_spec.continuous_size == 1
        decision_steps, _ = env.get_steps(name)
        assert len(decision_steps) == 3
        assert [o.shape[1:] for o in decision_steps.obs] == shapes
    decisions, terminals, interrupted = random_steps(env, 40)
    assert decisions == 40 * 3 * len(behaviors)
    assert terminals > 0 and interrupted > 0  # episodes end, and some hit max_step


@pytest.mark.timeout(60)
def test_visual_observations_show_agent_and_goal(open_env):
    env = open_env("visual")
    env.reset()
    image = env.get_steps("GoalVisual?team=0")[0].obs[0][0]
    assert image.shape == (3, 84, 84) and image.dtype == np.float32
    assert image[0].max() == 1.0 and image[1].max() == 1.0  # a red agent and a green goal


@pytest.mark.timeout(60)
def test_handshake_num_areas_multiplies_agents(open_env):
    env = open_env("goal", "--num-agents", "2", num_areas=3)
    env.reset()
    assert len(env.get_steps("Goal?team=0")[0]) == 6


# ------------------------------------------------------------------------ side channels


@pytest.mark.timeout(60)
def test_side_channels_both_ways(open_env, tmp_path):
    parameters, stats, engine = EnvironmentParametersChannel(), StatsSideChannel(), EngineConfigurationChannel()
    env = open_env("goal", "--num-agents", "4", side_channels=[parameters, stats, engine])
    engine.set_configuration_parameters(width=64, height=48, time_scale=7.0)
    parameters.set_float_parameter("goal_distance", 1.0)  # arrives with the RESET
    env.reset()
    observation = env.get_steps("Goal?team=0")[0].obs[0]
    assert np.allclose(np.abs(observation[:, 2]), 1.0 / 11)  # the goal is 1 cell away
    random_steps(env, 30)
    received = stats.get_and_reset_stats()
    assert {"Goal/Success", "Goal/Episode Length", "Goal/Goal Distance"} <= set(received)
    assert all(value == 1.0 for value, _ in received["Goal/Goal Distance"])
    log = (tmp_path / "Player-0.log").read_text()
    assert "Environment parameter goal_distance = 1.0" in log
    assert "'width': 64, 'height': 48" in log and "'time_scale': 7.0" in log


# ------------------------------------------------------------------------------ flags


@pytest.mark.fast
def test_flags_like_a_unity_player():
    args, ignored = cli.parse(
        ["-LOGFILE", "p.log", "-BatchMode", "-nographics", "--mlagents-port", "5011",
         "-screen-fullscreen", "0", "--num-agents", "4", "--no-such-flag"]
    )
    assert (args.log_file, args.batchmode, args.nographics, args.mlagents_port) == ("p.log", True, True, 5011)
    assert args.num_agents == 4
    assert ignored == ["-screen-fullscreen", "0", "--no-such-flag"]
    assert cli.parse([])[0].mlagents_port == 5004  # the Editor's port, for runs by hand


@pytest.mark.timeout(60)
def test_player_exits_when_its_trainer_is_gone(builds, tmp_path):
    script = tmp_path / "trainer.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import time
            from mlagents_envs.environment import UnityEnvironment
            env = UnityEnvironment({str(builds / "goal")!r}, base_port={free_port_block(1)}, no_graphics=True)
            env.reset()
            print(env._process.pid, flush=True)
            time.sleep(600)
            """
        )
    )
    trainer = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        player = psutil.Process(int(trainer.stdout.readline()))
        trainer.kill()
        trainer.wait()
        player.wait(timeout=5)  # raises psutil.TimeoutExpired if it stays
    finally:
        trainer.kill()


# ------------------------------------------------------------------------------ faults


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--crash-after-steps", "5"], "return code 3"),
        (["--crash-after-steps", "5", "--crash-signal", "SIGSEGV"], "return code -11"),
    ],
)
def test_crash_flags(open_env, flags, message):
    env = open_env("goal", *flags)
    env.reset()
    with pytest.raises(UnityEnvironmentException, match=message):
        random_steps(env, 20)


@pytest.mark.timeout(60)
def test_hang_flag(open_env):
    env = open_env("goal", "--hang-after-steps", "3", timeout_wait=10)
    env.reset()
    with pytest.raises(UnityTimeOutException):
        random_steps(env, 10)


@pytest.mark.timeout(60)
def test_slow_start_flag(builds):
    port = free_port_block(1)
    with pytest.raises(UnityTimeOutException):
        UnityEnvironment(
            str(builds / "goal"),
            base_port=port,
            additional_args=["--slow-start-s", "30"],
            timeout_wait=3,
            no_graphics=True,
        )


@pytest.mark.timeout(60)
def test_faults_can_target_one_port_and_the_first_time(open_env, tmp_path):
    once = str(tmp_path / "once")
    env = open_env("goal", "--crash-after-steps", "3", "--fault-port", "1", "--fault-once", once)
    env.reset()
    random_steps(env, 10)  # not its port: it behaves
    with pytest.raises(UnityEnvironmentException):
        env2 = open_env("goal", "--crash-after-steps", "3", "--fault-once", once + "2")
        env2.reset()
        random_steps(env2, 10)
    env3 = open_env("goal", "--crash-after-steps", "3", "--fault-once", once + "2")
    env3.reset()
    random_steps(env3, 10)  # the fault fired once already: it behaves


@pytest.mark.timeout(120)
def test_death_during_handshake_is_recovered_by_the_manager(builds, tmp_path):
    """mlagents-envs waits forever for a build that dies between the two handshake calls; the
    worker sees the player exit (NOTE [ Player death ]) and the manager restarts it at once,
    within the default (long) start-up deadline."""
    run_options = RunOptions()
    factory = create_environment_factory(
        str(builds / "goal"), True, True, 0, 1, 60, free_port_block(4),
        ["--die-during-handshake", "--fault-once", str(tmp_path / "once")], str(tmp_path),
    )
    manager = SupervisedEnvManager(factory, run_options, 2, EnvManagerSettings())
    try:
        manager.reset()  # waits for the restarted worker: one step per worker
        assert manager.restart_counts == {"unity": 1}
        assert len(manager.worker_pids) == 2
        for _ in range(20):
            manager.get_steps()
    finally:
        manager.close()


@pytest.mark.timeout(60)
def test_behavior_name_can_match_your_yaml(open_env):
    env = open_env("continuous", "--behavior-name", "Crawler")
    env.reset()
    assert list(env.behavior_specs) == ["Crawler?team=0"]


@pytest.mark.timeout(60)
def test_the_player_without_a_trainer_fails_and_says_what_to_start(tmp_path):
    port = free_port_block(1)
    result = subprocess.run(
        [sys.executable, "-m", "mlagents_plugin.player", "--mlagents-port", str(port), "--connect-timeout-s", "1"],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 1
    assert f"No trainer answered on port {port} within --connect-timeout-s=1 s" in result.stderr
    assert "Start mlagents-learn first" in result.stderr


@pytest.mark.parametrize("platform", ["linux", "darwin", "win32"])
def test_make_build_writes_where_mlagents_envs_looks_for_a_build(tmp_path, monkeypatch, platform):
    """On macOS a build is a .app bundle, on Windows a .exe: mlagents-envs' own lookup, told it
    runs there, finds the launcher (which is also what `--env=DIR/NAME` launches on Linux)."""
    launcher = make_build(str(tmp_path), "goal", platform=platform)
    monkeypatch.setattr(env_utils, "get_platform", lambda: platform)
    monkeypatch.chdir(tmp_path)
    assert env_utils.validate_environment_path(str(tmp_path / "goal")) == str(launcher)


@pytest.mark.timeout(60)
def test_make_build_on_windows_writes_pips_launcher_of_the_player(tmp_path):
    """The .exe is pip's console-script launcher, the shebang of this interpreter and a zip whose
    __main__.py plays the scene: here Python runs the zip as the launcher would on Windows."""
    import importlib.resources
    import zipfile

    exe = make_build(str(tmp_path), "continuous", platform="win32")
    launcher = importlib.resources.files("pip._vendor.distlib").joinpath("t64.exe").read_bytes()
    python = f'"{sys.executable}"' if " " in sys.executable else sys.executable
    shebang = f"#!{python}\n".encode()
    content = exe.read_bytes()
    assert content.startswith(launcher + shebang + b"PK\x03\x04")  # the zip follows the shebang
    with zipfile.ZipFile(exe) as archive:
        assert archive.namelist() == ["__main__.py"]
    port = free_port_block(1)
    result = subprocess.run(
        [sys.executable, str(exe), "--mlagents-port", str(port), "--connect-timeout-s", "1"],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 1, result.stderr
    assert "Player for scene 'continuous'" in result.stderr
    assert f"No trainer answered on port {port}" in result.stderr

