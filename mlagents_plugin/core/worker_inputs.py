"""What a worker is given, made in the trainer from ML-Agents' trainer-side settings.

# NOTE [ Workers get no trainer settings ]
# ML-Agents' RunOptions hold the behaviours' trainer settings, whose classes live beside the
# trainers (``PPOSettings`` is in ``mlagents.trainers.ppo.optimizer_torch``): unpickling them
# imports torch. A worker that received RunOptions paid about 1.6 s of CPU and 150 MB of
# memory for a library it never uses, at every start and restart. So the trainer turns what a
# worker needs into mlagents-envs' own terms before it crosses the pipe: the engine settings
# into an ``EngineConfig``; environment parameters into the calls to make on the worker's
# EnvironmentParametersChannel; ML-Agents' training analytics into the side-channel messages
# themselves. A worker imports mlagents-envs and this package's worker side, nothing more.
"""
from typing import Any, Dict, List, Optional

from mlagents.trainers.settings import (
    EngineSettings,
    ParameterRandomizationSettings,
    RunOptions,
    TrainerSettings,
)
from mlagents_envs.side_channel.engine_configuration_channel import EngineConfig

from mlagents_plugin.core.protocol import PARAMETER_METHODS, ParameterCall


def engine_config(engine: EngineSettings) -> EngineConfig:
    return EngineConfig(
        width=engine.width,
        height=engine.height,
        quality_level=engine.quality_level,
        time_scale=engine.time_scale,
        target_frame_rate=engine.target_frame_rate,
        capture_frame_rate=engine.capture_frame_rate,
    )


class _CallRecorder:
    """Stands in for an EnvironmentParametersChannel and records what is called on it."""

    def __init__(self) -> None:
        self.calls: List[ParameterCall] = []

    def __getattr__(self, name: str) -> Any:
        if name not in PARAMETER_METHODS:
            raise AttributeError(name)
        return lambda *args: self.calls.append((name, args))


def parameter_calls(config: Optional[Dict[str, Any]]) -> List[ParameterCall]:
    """The channel calls that apply ``config`` ({name: ParameterRandomizationSettings or a
    number}, as ML-Agents' env managers accept it) in a worker."""
    recorder = _CallRecorder()
    for key, value in (config or {}).items():
        if isinstance(value, ParameterRandomizationSettings):
            value.apply(key, recorder)
        elif isinstance(value, (int, float)):  # as SimpleEnvManager accepts
            recorder.set_float_parameter(key, float(value))
    return recorder.calls


class Analytics:
    """ML-Agents' training analytics, as the raw messages worker 0 queues on its channel.

    Built lazily: ML-Agents' channel imports torch, which a trainer has anyway.
    """

    def __init__(self, run_options: RunOptions):
        from mlagents.trainers.training_analytics_side_channel import TrainingAnalyticsSideChannel

        self._channel = TrainingAnalyticsSideChannel()
        self._channel.environment_initialized(run_options)
        self.environment_initialized = self._take()

    def training_started(self, behavior_name: str, trainer_settings: TrainerSettings) -> bytes:
        self._channel.training_started(behavior_name, trainer_settings)
        return self._take()

    def _take(self) -> bytes:
        """The one message queued since the last call (mlagents-envs' framing added later)."""
        (message,) = self._channel.message_queue
        self._channel.message_queue = []
        return bytes(message)
