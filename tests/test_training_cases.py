"""ML-Agents' trainers learn through the manager with batched inference (4 workers, one forward
pass per behaviour for the workers ready together): upstream's test_simple_rl kinds of case, on
the project's SimpleEnvironment. Batched and per-worker outputs are compared in test_batching.py."""
import attr
import pytest
from mlagents.trainers.poca.optimizer_torch import POCASettings
from mlagents.trainers.sac.optimizer_torch import SACSettings
from mlagents.trainers.settings import NetworkSettings, ScheduleType, SelfPlaySettings

from mlagents_plugin.testing import SimpleEnvironment, make_factory
from mlagents_plugin.testing.training import PPO_CONFIG, train

LSTM = NetworkSettings(num_layers=1, hidden_units=32, memory=NetworkSettings.MemorySettings(16, 4))
SAC_CONFIG = attr.evolve(
    PPO_CONFIG,
    trainer_type="sac",
    hyperparameters=SACSettings(
        learning_rate=5.0e-3, learning_rate_schedule=ScheduleType.CONSTANT, batch_size=16, buffer_size=5000,
        buffer_init_steps=0, steps_per_update=4,
    ),
)
POCA_CONFIG = attr.evolve(
    PPO_CONFIG,
    trainer_type="poca",
    hyperparameters=POCASettings(
        learning_rate=5.0e-3, learning_rate_schedule=ScheduleType.CONSTANT, batch_size=16, buffer_size=64
    ),
)
SELF_PLAY_CONFIG = attr.evolve(
    PPO_CONFIG, self_play=SelfPlaySettings(play_against_latest_model_ratio=1.0, save_steps=500, swap_steps=250)
)

# steps per run: SAC's reward was still rising at 3000 (0.69 then, on Python 3.10's torch)
MAX_STEPS = {"sac": 5000}
CASES = {
    "ppo": ({}, PPO_CONFIG),
    "ppo-lstm": ({}, attr.evolve(PPO_CONFIG, network_settings=LSTM)),
    "ppo-hybrid": ({"action": "hybrid"}, PPO_CONFIG),
    "ppo-visual": ({"visual_shape": (3, 20, 20)}, PPO_CONFIG),
    "ppo-two-behaviours": ({"behavior_names": ("Walker", "Runner")}, PPO_CONFIG),
    "sac": ({}, SAC_CONFIG),  # slower to learn here: MAX_STEPS
    "poca": ({"num_agents": 2}, POCA_CONFIG),
    "self-play": ({"behavior_names": ("Simple?team=0", "Simple?team=1")}, SELF_PLAY_CONFIG),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", CASES)
def test_trains_with_batched_inference(env_manager_factory, case):
    """PPO on these toy envs fails to learn in about one run of 30 whatever the env manager: it
    learns, then collapses onto one direction (measured on the visual case: 3 of 80 runs with a
    constant learning rate, batched and per-worker alike; with the linear schedule, 1 of 30 with
    seed 1337 on Python 3.11's torch, and on Python 3.10's torch 2.14 1 of 40 seeds and 1 of 24
    runs of seeds 1337 and 2024, the order in which workers answer being the rest of the
    randomness). Two seeds both collapsed once in CI, so up to three seeds are trained, until one
    learns. A manager that breaks training (actions to the wrong worker, trajectories mixed up)
    fails all three."""
    env_kwargs, config = CASES[case]
    history = {}
    for seed in (1337, 2024, 7):
        manager = env_manager_factory(make_factory(SimpleEnvironment, **env_kwargs), 4)
        assert manager.settings.batch_inference
        result = train(manager, config, max_steps=MAX_STEPS.get(case, 3000), seed=seed)
        if all(reward > 0.7 for reward in result.final_rewards.values()):
            return
        history[seed] = result.mean_rewards
    pytest.fail(f"No seed learned to a final mean reward above 0.7: {history}")
