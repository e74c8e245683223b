"""``trainer_type: ppo_fast`` (trainers/ppo_fast.py) is ML-Agents' ``ppo`` but for the rounding
of one batched critic pass: with upstream's per-trajectory value estimates put back, a run with
the same seed learns exactly what ``ppo`` learns, reward for reward (NOTE [ The same minibatches
]), on upstream's test_simple_rl kinds of case, while the batched pass gives the same values to
float32 rounding (NOTE [ A round at once ]); its trajectories reach the buffer entry for entry
as upstream's; and ``mlagents-learn`` trains with it from the one word in the YAML. Whether it
learns as well from its own values is a result over seeds: benchmarks/learning.py."""
import json
import random
import re
import subprocess
import sys
import textwrap
from typing import Tuple

import attr
import numpy as np
import pytest
import yaml
from helpers import run_learn, write_config
from mlagents.plugins.trainer_type import register_trainer_plugins
from mlagents.trainers.buffer import AgentBuffer
from mlagents.trainers.settings import RunOptions, ScheduleType
from mlagents.trainers.torch_entities.action_log_probs import LogProbsTuple
from mlagents.trainers.trajectory import AgentExperience, AgentStatus, Trajectory
from mlagents_envs.base_env import ActionTuple

from mlagents_plugin.trainers.trajectories import round_buffer

# One training in a process of its own (ML-Agents keeps state between runs in one process), on
# ML-Agents' in-process SimpleEnvManager: nothing but the seed decides what is learned.
TRAIN_ONCE = textwrap.dedent("""
    import json, random, sys
    import attr, numpy as np, torch
    from mlagents.trainers.settings import CuriositySettings, NetworkSettings, RewardSignalType
    from mlagents.trainers.simple_env_manager import SimpleEnvManager
    from mlagents_envs.side_channel.environment_parameters_channel import EnvironmentParametersChannel
    from mlagents_plugin.testing import SimpleEnvironment
    from mlagents_plugin.testing.training import PPO_CONFIG, train

    trainer_type, case = sys.argv[1], json.loads(sys.argv[2])
    random.seed(case["seed"]); np.random.seed(case["seed"]); torch.manual_seed(case["seed"])
    config = attr.evolve(PPO_CONFIG, trainer_type=trainer_type, max_steps=case["steps"], summary_freq=250)
    if case.get("batch_size"):
        config = attr.evolve(config, hyperparameters=attr.evolve(config.hyperparameters, batch_size=case["batch_size"]))
    if case.get("memory"):
        memory = NetworkSettings.MemorySettings(memory_size=16, sequence_length=case["memory"])
        config = attr.evolve(config, network_settings=attr.evolve(config.network_settings, memory=memory))
    if case.get("curiosity"):
        signals = dict(config.reward_signals)
        signals[RewardSignalType.CURIOSITY] = CuriositySettings(strength=0.02, gamma=0.99)
        config = attr.evolve(config, reward_signals=signals)
    largest_round = 0
    if case.get("upstream_values"):  # the round's passes checked against upstream's, whose results are kept
        from mlagents_plugin.trainers.ppo_fast import FastPPOTrainer
        batched_values, batched_rewards = FastPPOTrainer._value_estimates, FastPPOTrainer._signal_rewards
        this_round = []

        def upstream_values(self, trajectories, buffer):
            global largest_round
            largest_round = max(largest_round, len(trajectories))
            this_round[:] = trajectories
            values, values_next = {}, []
            for trajectory in trajectories:
                done = trajectory.done_reached and not trajectory.interrupted
                estimates, value_next, _ = self.optimizer.get_trajectory_value_estimates(
                    trajectory.to_agentbuffer(), trajectory.next_obs, done
                )
                for name, estimate in estimates.items():
                    values[name] = np.concatenate([values.get(name, estimate[:0]), estimate])
                values_next.append(value_next)
            ours, ours_next = batched_values(self, trajectories, buffer)
            for name in values:
                np.testing.assert_allclose(ours[name], values[name], rtol=1e-5, atol=1e-6)
                for mine, theirs in zip(ours_next, values_next):
                    np.testing.assert_allclose(mine[name], theirs[name], rtol=1e-5, atol=1e-6)
            return values, values_next

        def upstream_rewards(self, buffer):  # the round's trajectories, as upstream_values saw them
            rewards = {
                name: np.concatenate([signal.evaluate(t.to_agentbuffer()) * signal.strength for t in this_round])
                for name, signal in self.optimizer.reward_signals.items()
            }
            for name, ours in batched_rewards(self, buffer).items():
                np.testing.assert_allclose(ours, rewards[name], rtol=1e-5, atol=1e-6)
            return rewards

        FastPPOTrainer._value_estimates, FastPPOTrainer._signal_rewards = upstream_values, upstream_rewards
    channel = EnvironmentParametersChannel()
    env = SimpleEnvironment(0, [channel], **case.get("env", {}))
    result = train(SimpleEnvManager(env, channel), config, seed=case["seed"])
    print("REWARDS " + json.dumps(result.stats), flush=True)
    print(f"LARGEST ROUND {largest_round}", flush=True)
""")

CASES = {
    "discrete": {},
    "continuous": {"env": {"action": "continuous"}},
    "hybrid": {"env": {"action": "hybrid"}},
    "recurrent": {"memory": 4},
    "recurrent, a batch of 20 in sequences of 8": {"memory": 8, "batch_size": 20},
    "curiosity": {"curiosity": True},
    "visual": {"env": {"visual_shape": [3, 20, 20]}},
    "4 agents, curiosity: rounds of several trajectories": {"env": {"num_agents": 4}, "curiosity": True},
}


def train_once(tmp_path, trainer_type: str, case: dict) -> Tuple[dict, int]:
    """The stats of every summary, and the most trajectories ppo_fast processed in one round."""
    script = tmp_path / "train_once.py"
    script.write_text(TRAIN_ONCE)
    run = subprocess.run(
        [sys.executable, str(script), trainer_type, json.dumps(case)], capture_output=True, text=True, timeout=200
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    stats = next(line for line in lines if line.startswith("REWARDS "))[len("REWARDS "):]
    largest_round = next(line for line in lines if line.startswith("LARGEST ROUND "))[len("LARGEST ROUND "):]
    return json.loads(stats), int(largest_round)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("case", CASES)
def test_ppo_fast_with_upstreams_values_learns_exactly_what_ppo_learns(tmp_path, case):
    """Every stat of every summary (rewards, losses, value estimates, entropy, learning rate) is
    the same, to the last bit: the same buffers, the same minibatches in the same order from the
    same draws; and every round, the batched passes' values and rewards equal upstream's to
    rounding. With several agents, rounds of several trajectories are among them."""
    settings = {"seed": 1337, "steps": 1000, **CASES[case], "upstream_values": True}
    (ppo, _), (fast, largest_round) = train_once(tmp_path, "ppo", settings), train_once(tmp_path, "ppo_fast", settings)
    losses = [name for name in ppo["Simple"] if name.startswith("Losses/")]
    assert losses and ppo["Simple"]["Environment/Cumulative Reward"], ppo  # it updated and it scored
    assert fast == ppo
    if "memory" not in CASES[case]:  # recurrent policies keep upstream's path, a trajectory at a time
        assert largest_round >= (2 if CASES[case].get("env", {}).get("num_agents", 1) > 1 else 1)


def _experience(rng: random.Random, obs_shapes, mates: int, masked: bool, memory: bool) -> AgentExperience:
    def obs():
        return [np.float32(rng.random()) * np.ones(shape, dtype=np.float32) for shape in obs_shapes]

    def action():
        return ActionTuple(np.full((2,), rng.random(), np.float32), np.full((2,), rng.randrange(3), np.int32))

    return AgentExperience(
        obs=obs(),
        reward=rng.random(),
        done=rng.random() < 0.2,
        action=action(),
        action_probs=LogProbsTuple(np.full((2,), -rng.random(), np.float32), np.full((2,), -rng.random(), np.float32)),
        action_mask=[np.array([rng.random() < 0.3] * 3), np.array([False] * 3)] if masked else None,
        prev_action=np.full((2,), rng.randrange(3), np.int32),
        interrupted=False,
        memory=np.full((8,), rng.random(), np.float32) if memory else None,
        group_status=[AgentStatus(obs(), rng.random(), action(), rng.random() < 0.5) for _ in range(mates)],
        group_reward=rng.random(),
    )


@pytest.mark.fast
@pytest.mark.parametrize("lengths", [[1], [5], [3, 1, 4]])
@pytest.mark.parametrize("mates", [0, 2])
@pytest.mark.parametrize("masked, memory", [(False, False), (True, True)])
def test_a_rounds_trajectories_reach_the_buffer_entry_for_entry_as_upstreams(lengths, mates, masked, memory):
    """round_buffer makes, field by field, upstream's to_agentbuffer of each trajectory, one
    after the other (what resequence_and_append gives the update buffer, sequences of one step)."""
    rng = random.Random(len(lengths) * 100 + mates * 10 + masked)
    shapes = [(3,), (2, 4, 4)]  # a vector and a camera observation
    trajectories = []
    for length in lengths:
        steps = [_experience(rng, shapes, mates, masked, memory) for _ in range(length)]
        after = _experience(rng, shapes, mates, masked, memory)
        trajectories.append(Trajectory(steps, after.obs, [m.obs for m in after.group_status], "agent-1", "B?team=0"))
    upstreams = AgentBuffer()
    for trajectory in trajectories:
        trajectory.to_agentbuffer().resequence_and_append(upstreams, training_length=1)
    ours = round_buffer(trajectories)
    assert list(ours) == list(upstreams)  # the same fields, in the same order
    for key, entries in upstreams.items():
        assert type(ours[key]) is type(entries), key
        assert ours[key].padding_value == trajectories[0].to_agentbuffer()[key].padding_value, key
        assert len(ours[key]) == sum(lengths), key
        assert _same(list(ours[key]), list(entries)), key


def _same(mine, theirs) -> bool:
    """Equal, entry for entry, with the same types and dtypes (lists of lists of arrays too)."""
    if type(mine) is not type(theirs):
        return False
    if isinstance(mine, list):
        return len(mine) == len(theirs) and all(_same(a, b) for a, b in zip(mine, theirs, strict=True))
    if isinstance(mine, np.ndarray):
        return mine.dtype == theirs.dtype and np.array_equal(mine, theirs)
    return bool(mine == theirs)


@pytest.mark.fast
def test_a_yaml_means_the_same_settings_for_ppo_fast_as_for_ppo(ml_agents_hooks):
    """ML-Agents gives beta and epsilon the learning rate's schedule only for the types it names
    (``ppo``, ``poca``): for ``ppo_fast`` they kept their linear default, another learner."""
    register_trainer_plugins()  # as mlagents-learn does: ours through the entry point
    behaviour = {"hyperparameters": {"learning_rate_schedule": "constant", "batch_size": 32}}
    settings = {
        trainer_type: RunOptions.from_dict({"behaviors": {"B": {**behaviour, "trainer_type": trainer_type}}})
        .behaviors["B"]
        for trainer_type in ("ppo", "ppo_fast")
    }
    assert settings["ppo_fast"].hyperparameters.beta_schedule is ScheduleType.CONSTANT
    assert attr.evolve(settings["ppo_fast"], trainer_type="ppo") == settings["ppo"]


@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_mlagents_learn_trains_with_ppo_fast_from_one_word_from_a_ppo_run_and_resumes(tmp_path):
    """One word in the YAML; ``--initialize-from`` a ``ppo`` run (the checkpoints are the same
    files: the same policy and optimizer); ``--resume`` from its own."""

    def edit(trainer_type: str, max_steps: int):
        def change(config):
            config["behaviors"]["Simple"].update(trainer_type=trainer_type, max_steps=max_steps)

        return change

    ppo = run_learn(tmp_path, write_config(tmp_path, "simple_python_env.yaml", edit("ppo", 300)), "--run-id=ppo")
    assert ppo.returncode == 0, ppo.stdout[-3000:] + ppo.stderr[-3000:]
    config = write_config(tmp_path, "simple_python_env.yaml", edit("ppo_fast", 600))
    run = run_learn(tmp_path, config, "--num-envs=2", "--initialize-from=ppo")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Initializing from results/ppo/Simple/checkpoint.pt" in run.stdout + run.stderr
    saved = yaml.safe_load((tmp_path / "results" / "run" / "configuration.yaml").read_text())
    assert saved["behaviors"]["Simple"]["trainer_type"] == "ppo_fast"
    assert list((tmp_path / "results" / "run").glob("Simple*.onnx")), "no model exported"

    config = write_config(tmp_path, "simple_python_env.yaml", edit("ppo_fast", 900))
    resumed = run_learn(tmp_path, config, "--num-envs=2", "--resume")
    output = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, output[-6000:]
    resumed_at = re.search(r"Resuming training from step (\d+)\.", output)
    exported = [int(step) for step in re.findall(r"Exported results/run/Simple/Simple-(\d+)\.onnx", output)]
    assert resumed_at and int(resumed_at.group(1)) >= 600, output[-3000:]  # where the last run stopped
    assert exported and max(exported) >= 900, output[-3000:]
