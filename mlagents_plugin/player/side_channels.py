"""The build's side of ML-Agents' side channels, on mlagents-envs' own classes.

The framing is the same in both directions (16-byte channel id, int32 length, payload), so the
player reuses mlagents-envs' SideChannelManager, IncomingMessage and OutgoingMessage; only the
roles flip: the player *receives* engine configuration, environment parameters and training
analytics, and *sends* stats.
"""
import logging
import random
from typing import Callable, Dict

from mlagents_envs.side_channel import IncomingMessage, OutgoingMessage, SideChannel
from mlagents_envs.side_channel.default_training_analytics_side_channel import (
    DefaultTrainingAnalyticsSideChannel,
)
from mlagents_envs.side_channel.engine_configuration_channel import EngineConfigurationChannel
from mlagents_envs.side_channel.environment_parameters_channel import (
    EnvironmentParametersChannel,
)
from mlagents_envs.side_channel.stats_side_channel import (
    StatsAggregationMethod,
    StatsSideChannel,
)

logger = logging.getLogger(__name__)

ConfigurationType = EngineConfigurationChannel.ConfigurationType
DataType = EnvironmentParametersChannel.EnvironmentDataTypes
SamplerType = EnvironmentParametersChannel.SamplerTypes


class EngineConfigurationReceiver(SideChannel):
    """Keeps what the trainer sets (resolution, quality, time scale, frame rates) and logs it."""

    def __init__(self) -> None:
        super().__init__(EngineConfigurationChannel().channel_id)
        self.config: Dict[str, float] = {}

    def on_message_received(self, msg: IncomingMessage) -> None:
        kind = ConfigurationType(msg.read_int32())
        if kind == ConfigurationType.SCREEN_RESOLUTION:
            self.config["width"], self.config["height"] = msg.read_int32(), msg.read_int32()
        elif kind == ConfigurationType.TIME_SCALE:
            self.config["time_scale"] = min(max(msg.read_float32(), 1.0), 100.0)  # as Unity clamps
        else:
            self.config[kind.name.lower()] = msg.read_int32()
        logger.info(f"Engine configuration: {self.config}")


class EnvironmentParametersReceiver(SideChannel):
    """Like Unity's ``Academy.Instance.EnvironmentParameters``: ``get(key, default)`` returns the
    float the trainer set, or a new draw from the sampler it set."""

    def __init__(self) -> None:
        super().__init__(EnvironmentParametersChannel().channel_id)
        self._values: Dict[str, Callable[[], float]] = {}

    def on_message_received(self, msg: IncomingMessage) -> None:
        key = msg.read_string()
        kind = msg.read_int32()
        if kind == DataType.FLOAT:
            value = msg.read_float32()
            self._values[key] = lambda: value
            logger.info(f"Environment parameter {key} = {value}")
        elif kind == DataType.SAMPLER:
            self._values[key] = _sampler(msg)
            logger.info(f"Environment parameter {key} = a sampler")
        else:
            logger.warning(f"Unknown environment parameter type {kind} for {key}")

    def get(self, key: str, default: float) -> float:
        draw = self._values.get(key)
        return draw() if draw is not None else default


def _sampler(msg: IncomingMessage) -> Callable[[], float]:
    rng = random.Random(msg.read_int32())
    kind = msg.read_int32()
    if kind == SamplerType.UNIFORM:
        low, high = msg.read_float32(), msg.read_float32()
        return lambda: rng.uniform(low, high)
    if kind == SamplerType.GAUSSIAN:
        mean, std = msg.read_float32(), msg.read_float32()
        return lambda: rng.gauss(mean, std)
    bounds = msg.read_float32_list()  # MULTIRANGEUNIFORM: [min0, max0, min1, max1, ...]
    ranges = list(zip(bounds[0::2], bounds[1::2], strict=False))
    weights = [max(high - low, 0.0) for low, high in ranges]
    return lambda: rng.uniform(*rng.choices(ranges, weights=weights)[0])


class StatsSender(SideChannel):
    """Like Unity's ``Academy.Instance.StatsRecorder``: stats go to the trainer's TensorBoard."""

    def __init__(self) -> None:
        super().__init__(StatsSideChannel().channel_id)

    def on_message_received(self, msg: IncomingMessage) -> None:
        logger.warning("The stats channel got a message from the trainer; ignored.")

    def add(self, key: str, value: float, aggregation: StatsAggregationMethod) -> None:
        message = OutgoingMessage()
        message.write_string(key)
        message.write_float32(value)
        message.write_int32(aggregation.value)
        self.queue_message_to_send(message)


class AnalyticsReceiver(SideChannel):
    """ML-Agents' training analytics, which Unity only forwards to its own analytics: counted."""

    def __init__(self) -> None:
        super().__init__(DefaultTrainingAnalyticsSideChannel.CHANNEL_ID)
        self.received = 0

    def on_message_received(self, msg: IncomingMessage) -> None:
        self.received += 1
        logger.info(f"Training analytics message received ({self.received} so far).")
