"""Stock `mlagents-learn` training on player builds, over real gRPC ports, through the plugin."""
import os
import signal
import subprocess
import time
from pathlib import Path

import onnx
import psutil
import pytest
from helpers import finish, free_port_block, learn_command, run_learn, scalars, start_learn, wait_for_line, write_config
from onnx import numpy_helper

from mlagents_plugin.local.processes import every_process
from mlagents_plugin.player.build import make_build

pytestmark = pytest.mark.e2e

THRESHOLD = 0.85  # the optimum of the default goal scene is 0.97; a random policy gets about 0
# PPO on the goal scene falls short of THRESHOLD in 5000 steps now and then (0.57 and 0.84 seen in
# CI), whatever the manager: a run that does is trained again with a second seed.
SEEDS = (0, 2024)


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    directory = tmp_path_factory.mktemp("builds")
    make_build(str(directory), "goal")
    make_build(str(directory), "visual")
    return directory


def goal_config(tmp_path, max_steps=5000, env_manager=None, parameters=None, summary_freq=1000, trainer_type="ppo"):
    def edit(config):
        config["behaviors"]["Goal"]["trainer_type"] = trainer_type
        config["behaviors"]["Goal"]["max_steps"] = max_steps
        config["behaviors"]["Goal"]["summary_freq"] = summary_freq
        if env_manager:
            config["env_manager"] = env_manager
        if parameters:
            config["environment_parameters"] = parameters

    return write_config(tmp_path, "goal_player.yaml", edit)


def train(tmp_path, builds, config, *player_flags, scene="goal", num_envs=4, learn_args=(), timeout=300):
    result = run_learn(
        tmp_path,
        config,
        f"--env={builds / scene}",
        f"--num-envs={num_envs}",
        f"--base-port={free_port_block(num_envs + 8)}",
        *learn_args,
        "--env-args", "--num-agents", "4", *player_flags,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result


def run_dir(tmp_path):
    return tmp_path / "results" / "run"


def final_reward(tmp_path, behavior="Goal"):
    return scalars(run_dir(tmp_path), behavior)["Environment/Cumulative Reward"][-1]


def restarts(tmp_path, cause, behavior="Goal"):
    return sum(scalars(run_dir(tmp_path), behavior).get(f"Environment/Env Workers/Restarts/{cause}", []))


def players_of(tmp_path):
    """Players logging into this test's results folder (their -logFile)."""
    found = []
    for proc in every_process():
        try:
            cmdline = " ".join(proc.cmdline())
            if (
                "mlagents_plugin.player" in cmdline
                and str(tmp_path) in cmdline
                and proc.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(proc.pid)
        except psutil.Error:
            pass
    return found


def reaches_the_threshold(tmp_path, run) -> Path:
    """``run(folder, seed)`` trains in ``folder`` and checks what it must; returns the folder of
    the seed that reached THRESHOLD."""
    rewards = {}
    for seed in SEEDS:
        folder = tmp_path / f"seed-{seed}"
        folder.mkdir()
        run(folder, seed)
        rewards[seed] = final_reward(folder)
        if rewards[seed] > THRESHOLD:
            return folder
    pytest.fail(f"no seed reached a final reward above {THRESHOLD}: {rewards}")


@pytest.mark.timeout(700)
def test_ppo_on_four_builds_reaches_the_threshold(tmp_path, builds):
    tmp_path = reaches_the_threshold(
        tmp_path, lambda folder, seed: train(folder, builds, goal_config(folder), learn_args=(f"--seed={seed}",))
    )
    onnx.checker.check_model(onnx.load(str(run_dir(tmp_path) / "Goal.onnx")))
    assert len(list((run_dir(tmp_path) / "run_logs").glob("Player-*.log"))) == 4  # -logFile


def train_through_a_crash(folder, builds, seed, trainer_type="ppo"):
    """5000 steps on four builds, of which the first to reach its 50th step crashes (once: --fault-once)."""
    result = train(
        folder, builds, goal_config(folder, env_manager={"restart_backoff_s": 0.5}, trainer_type=trainer_type),
        "--crash-after-steps", "50", "--fault-once", str(folder / "crashed"), learn_args=(f"--seed={seed}",),
    )
    assert (folder / "crashed").exists()
    # Noticed by the worker's player watch (NOTE [ Player death ]), not 6 s later by mlagents-envs.
    assert "Restarting env worker" in result.stdout
    assert "The Unity player (pid " in result.stdout and "exited with code 3" in result.stdout
    assert restarts(folder, "unity") == 1
    return result


@pytest.mark.timeout(700)
def test_a_crashed_build_is_restarted_and_training_finishes(tmp_path, builds):
    reaches_the_threshold(tmp_path, lambda folder, seed: train_through_a_crash(folder, builds, seed))


def onnx_signature(path: Path) -> dict:
    """What Unity's inference reads of an exported model, once onnx.checker accepts it: the graph's
    inputs and outputs (name, element type, shape), the constant outputs' values (version_number,
    memory_size, the action output shapes), and the opsets."""
    model = onnx.load(str(path))
    onnx.checker.check_model(model)

    def tensors(values):
        return [
            (v.name, v.type.tensor_type.elem_type, [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim])
            for v in values
        ]

    values = {i.name: numpy_helper.to_array(i).tolist() for i in model.graph.initializer}
    values.update(
        (n.output[0], numpy_helper.to_array(a.t).tolist())
        for n in model.graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"
    )
    identities = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Identity"}
    constants = {}
    for output in model.graph.output:
        name = output.name
        while name not in values and name in identities:  # torch exports them as Identity(initializer)
            name = identities[name]
        if name in values:
            constants[output.name] = values[name]
    return {
        "inputs": tensors(model.graph.input),
        "outputs": tensors(model.graph.output),
        "constants": constants,
        "opsets": sorted((o.domain, o.version) for o in model.opset_import),
    }


@pytest.mark.timeout(900)
def test_ppo_fast_trains_through_a_crash_and_exports_what_ppo_exports(tmp_path, builds):
    """Issue 33: mlagents-learn with ``trainer_type: ppo_fast`` (one word changed in the crash test's
    configuration) survives the crashed build, reaches the threshold, and writes ``.onnx`` models,
    final and checkpoint, with the signature of the one a ``ppo`` run writes for the same behaviour
    on the same build: for that, a short real ``ppo`` run (one build, 200 steps), a few seconds."""

    def run(folder, seed):
        result = train_through_a_crash(folder, builds, seed, trainer_type="ppo_fast")
        assert "trainer_type:\tppo_fast" in result.stdout  # the hyperparameters ML-Agents logs: not ppo
        assert "Goal. Step: 5000." in result.stdout  # the final summary

    (tmp_path / "ppo_fast").mkdir()
    fast_dir = run_dir(reaches_the_threshold(tmp_path / "ppo_fast", run))
    ppo = tmp_path / "ppo"
    ppo.mkdir()
    train(ppo, builds, goal_config(ppo, max_steps=200, summary_freq=100), num_envs=1, timeout=120)
    expected = onnx_signature(run_dir(ppo) / "Goal.onnx")

    assert [name for name, _, _ in expected["inputs"]] == ["obs_0", "action_masks"], expected
    assert {"version_number", "memory_size", "discrete_action_output_shape"} <= set(expected["constants"]), expected
    checkpoints = sorted((fast_dir / "Goal").glob("Goal-*.onnx"))
    assert checkpoints, f"no checkpoint model in {sorted(p.name for p in (fast_dir / 'Goal').iterdir())}"
    for model in [fast_dir / "Goal.onnx", *checkpoints]:
        assert onnx_signature(model) == expected, model


@pytest.mark.timeout(400)
def test_a_hung_build_is_restarted(tmp_path, builds):
    """The hang is noticed after --timeout-wait while the other builds train on; the run goes on
    until the restarted build has stepped and a summary has recorded the restart."""
    config = goal_config(tmp_path, max_steps=10**7, env_manager={"shutdown_timeout_s": 2, "restart_backoff_s": 0})
    trainer = start_learn(tmp_path, learn_command(
        config, f"--env={builds / 'goal'}", "--num-envs=4", f"--base-port={free_port_block(12)}",
        "--timeout-wait=10", "--env-args", "--num-agents", "4",
        "--hang-after-steps", "20", "--fault-once", str(tmp_path / "hung"),
    ))
    output: list = []
    try:
        wait_for_line(trainer, "Restarting env worker", output, timeout_s=240)
        wait_for_line(trainer, "Step: ", output)  # a summary after the restart: it is recorded
        os.killpg(trainer.pid, signal.SIGINT)
        finish(trainer, output, timeout_s=60)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
            trainer.wait()
    assert (tmp_path / "hung").exists()
    assert "UnityTimeOutException" in "".join(output)
    assert restarts(tmp_path, "unity") == 1


@pytest.mark.timeout(400)
def test_a_build_dying_in_the_handshake_is_reported_at_once_and_restarted(tmp_path, builds):
    """mlagents-envs alone would wait forever: the build is gone between two handshake calls.
    The worker watches the player from its launch (NOTE [ Player death ])."""
    result = train(
        tmp_path, builds, goal_config(tmp_path, max_steps=1000, env_manager={"restart_backoff_s": 0}),
        "--die-during-handshake", "--fault-once", str(tmp_path / "died"),
    )
    assert "The Unity player (pid " in result.stdout and "exited with code 3" in result.stdout
    assert "Fault: dying between the two handshake calls." in result.stdout  # its log's end
    assert "did not finish building its env" not in result.stdout  # no timeout was needed
    assert restarts(tmp_path, "unity") == 1


@pytest.mark.timeout(300)
def test_a_build_that_never_completes_a_handshake_fails_in_its_own_words(tmp_path, builds):
    started = time.monotonic()
    result = run_learn(
        tmp_path, goal_config(tmp_path), f"--env={builds / 'goal'}", "--num-envs=2",
        f"--base-port={free_port_block(10)}", "--env-args", "--die-during-handshake",
    )
    assert result.returncode != 0
    assert time.monotonic() - started < 120  # not 11 attempts of startup_timeout_s (1,000 s)
    assert "Restarting env worker" in result.stdout  # one retry
    assert "never once finished building its env" in result.stdout + result.stderr
    assert "Fault: dying between the two handshake calls." in result.stdout + result.stderr


@pytest.mark.timeout(300)
def test_ctrl_c_saves_the_model_and_leaves_no_player(tmp_path, builds):
    config = goal_config(tmp_path, max_steps=10**7)
    trainer = subprocess.Popen(
        learn_command(config, f"--env={builds / 'goal'}", "--num-envs=2", f"--base-port={free_port_block(10)}"),
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    output = []
    try:
        for line in trainer.stdout:
            output.append(line)
            if "Step: 1000." in line:
                break
        assert len(players_of(tmp_path)) == 2, "".join(output[-30:])
        os.killpg(trainer.pid, signal.SIGINT)  # what a terminal does
        output.append(trainer.communicate(timeout=60)[0])
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
            trainer.wait()
    assert "Learning was interrupted" in "".join(output)
    assert (run_dir(tmp_path) / "Goal.onnx").exists()
    deadline = time.monotonic() + 3
    while players_of(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert players_of(tmp_path) == []


@pytest.mark.timeout(400)
def test_curriculum_lessons_reach_the_build(tmp_path, builds):
    parameters = {
        "goal_distance": {
            "curriculum": [
                {"name": "near", "completion_criteria": {"measure": "reward", "behavior": "Goal",
                 "threshold": 0.6, "min_lesson_length": 150, "signal_smoothing": False}, "value": 1.0},
                {"name": "far", "value": 4.0},
            ]
        }
    }
    train(tmp_path, builds, goal_config(tmp_path, max_steps=4000, parameters=parameters, summary_freq=200))
    stats = scalars(run_dir(tmp_path), "Goal")
    distances = stats["Goal/Goal Distance"]  # a custom stat, sent by the build through the stats channel
    assert 1.0 in distances and distances[-1] == 4.0
    assert stats["Environment/Lesson Number/goal_distance"][-1] == 1.0


@pytest.mark.timeout(600)
def test_visual_scene_trains(tmp_path, builds):
    def edit(config):
        config["behaviors"]["GoalVisual"] = config["behaviors"].pop("Goal")
        config["behaviors"]["GoalVisual"]["max_steps"] = 2000

    config = write_config(tmp_path, "goal_player.yaml", edit)
    train(tmp_path, builds, config, scene="visual", num_envs=2, timeout=540)
    model = onnx.load(str(run_dir(tmp_path) / "GoalVisual.onnx"))
    onnx.checker.check_model(model)
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim][1:] == [3, 84, 84]


@pytest.mark.timeout(300)
@pytest.mark.xdist_group("editor-port")  # the Editor's port, 5004, is fixed
def test_editor_mode_with_a_player_started_by_hand(tmp_path, editor_port):
    """Without --env, mlagents-learn waits on port 5004 for the Editor; the player stands in."""
    config = goal_config(tmp_path, max_steps=1000)
    trainer = subprocess.Popen(
        learn_command(config), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    player = None
    output = []
    try:
        for line in trainer.stdout:
            output.append(line)
            if "Listening on port 5004" in line:
                player = subprocess.Popen(
                    [str(os.path.join(os.path.dirname(os.sys.executable), "mlagents-plugin-player")),
                     "--scene", "goal", "--num-agents", "4"],
                    stderr=subprocess.DEVNULL,
                )
                break
        output.append(trainer.communicate(timeout=240)[0])
        assert trainer.returncode == 0, "".join(output)[-4000:]
        assert player is not None and player.wait(timeout=10) == 0
    finally:
        for process in (trainer, player):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    assert (run_dir(tmp_path) / "Goal.onnx").exists()
