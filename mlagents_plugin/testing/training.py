"""Train a real ML-Agents trainer through any env manager, and check that it learned.

Our counterpart of upstream's test helper ``check_environment_trains``: it drives ML-Agents'
own TrainerController and TrainerFactory, so what is tested is what ``mlagents-learn`` runs.
It reads rewards from the StatsReporter (not from the env object), so it works for envs that
live in other processes.
"""
import collections
import tempfile
from typing import Dict, List, NamedTuple, Optional, Union

import attr
from mlagents.plugins.trainer_type import register_trainer_plugins
from mlagents.trainers.env_manager import EnvManager
from mlagents.trainers.environment_parameter_manager import EnvironmentParameterManager
from mlagents.trainers.ppo.optimizer_torch import PPOSettings
from mlagents.trainers.settings import NetworkSettings, ScheduleType, TrainerSettings
from mlagents.trainers.stats import StatsReporter, StatsSummary, StatsWriter
from mlagents.trainers.trainer import TrainerFactory
from mlagents.trainers.trainer_controller import TrainerController

REWARD_KEY = "Environment/Cumulative Reward"

# A PPO configuration that learns SimpleEnvironment in a few thousand steps: upstream's test
# configuration with a lower learning rate, twice the entropy bonus, and ML-Agents' default
# (linear) learning-rate schedule. With a constant rate, about one run in 30 learned and then
# collapsed onto one direction whatever the goal (mean reward about -0.1): once the policy is
# solved, PPO's normalised advantages are mostly noise, and full-size steps on noise undo it.
# With the linear schedule, 60 of 60 visual runs (4 workers, two at a time) converged.
PPO_CONFIG = TrainerSettings(
    trainer_type="ppo",
    hyperparameters=PPOSettings(
        learning_rate=3.0e-3,
        learning_rate_schedule=ScheduleType.LINEAR,
        batch_size=16,
        buffer_size=64,
        beta=1.0e-2,
    ),
    network_settings=NetworkSettings(num_layers=1, hidden_units=32),
    summary_freq=500,
    max_steps=3000,
    threaded=False,
)


class StatsRecorder(StatsWriter):
    """Keeps, per category (behaviour) and stat, the mean of every summary period."""

    def __init__(self) -> None:
        self.stats: Dict[str, Dict[str, List[float]]] = collections.defaultdict(
            lambda: collections.defaultdict(list)
        )

    def write_stats(self, category: str, values: Dict[str, StatsSummary], step: int) -> None:
        for key, summary in values.items():
            if summary.num > 0:
                self.stats[category][key].append(float(summary.aggregated_value))


class TrainingResult(NamedTuple):
    stats: Dict[str, Dict[str, List[float]]]  # behaviour -> stat -> value of each summary period

    @property
    def mean_rewards(self) -> Dict[str, List[float]]:
        return {name: stats[REWARD_KEY] for name, stats in self.stats.items() if REWARD_KEY in stats}

    @property
    def final_rewards(self) -> Dict[str, float]:
        return {name: rewards[-1] for name, rewards in self.mean_rewards.items()}


def train(
    env_manager: EnvManager,
    trainer_config: Union[TrainerSettings, Dict[str, TrainerSettings]] = PPO_CONFIG,
    max_steps: Optional[int] = None,
    seed: int = 1337,
    output_path: Optional[str] = None,
) -> TrainingResult:
    """Train every behaviour the env manager's envs have until ``max_steps``.

    ``trainer_config`` is one TrainerSettings for all behaviours or one per behaviour name.
    The env manager is not closed: its owner closes it.
    """
    if isinstance(trainer_config, TrainerSettings):
        settings = trainer_config if max_steps is None else attr.evolve(trainer_config, max_steps=max_steps)
        config: Dict[str, TrainerSettings] = collections.defaultdict(lambda: settings)
    else:
        config = dict(trainer_config)
    register_trainer_plugins()  # as mlagents-learn does: PPO, SAC, POCA and plugins' trainers
    recorder = StatsRecorder()
    saved_writers = list(StatsReporter.writers)
    StatsReporter.writers.clear()
    StatsReporter.add_writer(recorder)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = output_path or tmp
            param_manager = EnvironmentParameterManager()
            factory = TrainerFactory(
                trainer_config=config,
                output_path=path,
                train_model=True,
                load_model=False,
                seed=seed,
                param_manager=param_manager,
                multi_gpu=False,
            )
            controller = TrainerController(
                factory, path, "test", param_manager, train=True, training_seed=seed
            )
            controller.start_learning(env_manager)
    finally:
        StatsReporter.writers.clear()
        StatsReporter.writers.extend(saved_writers)
    return TrainingResult({name: dict(stats) for name, stats in recorder.stats.items()})


def check_environment_trains(
    env_manager: EnvManager,
    trainer_config: Union[TrainerSettings, Dict[str, TrainerSettings]] = PPO_CONFIG,
    success_threshold: float = 0.7,
    max_steps: Optional[int] = None,
) -> TrainingResult:
    """``train``, then fail unless every behaviour's last mean reward beats the threshold."""
    result = train(env_manager, trainer_config, max_steps)
    final = result.final_rewards
    assert final, f"No episode finished during training: {result.mean_rewards}"
    failing = {name: reward for name, reward in final.items() if not reward > success_threshold}
    assert not failing, (
        f"Final mean reward below {success_threshold}: {failing} "
        f"(history: {result.mean_rewards})"
    )
    return result
