"""``trainer_type: ppo_fast`` (trainers/ppo_fast.py) learns what ML-Agents' ``ppo`` learns: with
the same seed, reward for reward (NOTE [ The same minibatches ]), on upstream's test_simple_rl
kinds of case; and ``mlagents-learn`` trains with it from the one word in the YAML."""
import json
import subprocess
import sys
import textwrap

import attr
import pytest
import yaml
from helpers import run_learn, write_config
from mlagents.plugins.trainer_type import register_trainer_plugins
from mlagents.trainers.settings import RunOptions, ScheduleType

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
    channel = EnvironmentParametersChannel()
    env = SimpleEnvironment(0, [channel], **case.get("env", {}))
    result = train(SimpleEnvManager(env, channel), config, seed=case["seed"])
    print("REWARDS " + json.dumps(result.stats), flush=True)
""")

CASES = {
    "discrete": {},
    "continuous": {"env": {"action": "continuous"}},
    "hybrid": {"env": {"action": "hybrid"}},
    "recurrent": {"memory": 4},
    "recurrent, a batch of 20 in sequences of 8": {"memory": 8, "batch_size": 20},
    "curiosity": {"curiosity": True},
    "visual": {"env": {"visual_shape": [3, 20, 20]}},
}


def train_once(tmp_path, trainer_type: str, case: dict) -> dict:
    script = tmp_path / "train_once.py"
    script.write_text(TRAIN_ONCE)
    run = subprocess.run(
        [sys.executable, str(script), trainer_type, json.dumps(case)], capture_output=True, text=True, timeout=200
    )
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("REWARDS "))
    return json.loads(line[len("REWARDS "):])


@pytest.mark.timeout(420)
@pytest.mark.parametrize("case", CASES)
def test_ppo_fast_learns_exactly_what_ppo_learns(tmp_path, case):
    """Every stat of every summary (rewards, losses, value estimates, entropy, learning rate) is
    the same, to the last bit: the same minibatches in the same order from the same draws."""
    settings = {"seed": 1337, "steps": 1000, **CASES[case]}
    ppo, fast = train_once(tmp_path, "ppo", settings), train_once(tmp_path, "ppo_fast", settings)
    losses = [name for name in ppo["Simple"] if name.startswith("Losses/")]
    assert losses and ppo["Simple"]["Environment/Cumulative Reward"], ppo  # it updated and it scored
    assert fast == ppo


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
@pytest.mark.timeout(300)
def test_mlagents_learn_trains_with_ppo_fast_from_one_word(tmp_path):
    def edit(config):
        behavior = config["behaviors"]["Simple"]
        behavior["trainer_type"] = "ppo_fast"
        behavior["max_steps"] = 600

    run = run_learn(tmp_path, write_config(tmp_path, "simple_python_env.yaml", edit), "--num-envs=2")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    saved = yaml.safe_load((tmp_path / "results" / "run" / "configuration.yaml").read_text())
    assert saved["behaviors"]["Simple"]["trainer_type"] == "ppo_fast"
    assert list((tmp_path / "results" / "run").glob("Simple*.onnx")), "no model exported"
