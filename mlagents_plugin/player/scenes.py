"""Scenes: agents and their behaviours, with the parts of Unity's Agent API the protocol sees.

An ``Agent`` has Unity's hooks (``on_episode_begin``, ``collect_observations``,
``on_action_received``, ``action_mask``) and helpers (``add_reward``, ``end_episode``,
``episode_interrupted``); the Academy (academy.py) drives them in Unity's order. The built-in
scenes are variations of one task: walk along a line to a goal placed ``goal_distance`` away
(an environment parameter, so a curriculum can move it), +1 on arrival, ``step_penalty``
(another parameter) every step, interrupted at ``max_step``.
"""
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
from mlagents_envs.base_env import DimensionProperty, ObservationType
from mlagents_envs.side_channel.stats_side_channel import StatsAggregationMethod


class Sensor(NamedTuple):
    """One observation per agent. Unity sorts sensors by name; so must a scene."""

    name: str
    shape: Tuple[int, ...]  # images are channel-first (C, H, W), as mlagents-envs delivers them
    dimension_properties: Tuple[DimensionProperty, ...]
    png: bool = False  # images travel PNG-compressed, as Unity sends camera sensors by default
    observation_type: ObservationType = ObservationType.DEFAULT


class Behavior(NamedTuple):
    name: str  # fully qualified, "Name?team=0", as Unity's BehaviorParameters reports it
    sensors: Tuple[Sensor, ...]
    continuous_actions: int
    discrete_branches: Tuple[int, ...]


class SceneOptions(NamedTuple):
    num_agents: int = 1  # per training area; the handshake's num_areas multiplies it
    max_step: int = 100  # Agent.MaxStep; 0 = unlimited
    track_length: int = 11
    goal_distance: float = 3.0  # default of the "goal_distance" environment parameter
    step_penalty: float = 0.01  # default of the "step_penalty" environment parameter
    image_size: int = 84
    behavior_name: str = ""  # renames a one-behaviour scene's behaviour (to match your YAML)
    frame_time_s: float = 0.0  # slept per step: a Unity frame's physics and rendering, without the CPU


class Agent:
    """Subclasses override the hooks; the Academy keeps the bookkeeping fields."""

    def __init__(self, agent_id: int, max_step: int):
        self.id = agent_id
        self.max_step = max_step
        self.step_count = 0
        self.reward = 0.0  # since the last decision
        self.cumulative_reward = 0.0
        self.group_id = 0
        self.group_reward = 0.0
        self.end_reason: Optional[str] = None  # "done" or "interrupted" while ending

    def on_episode_begin(self) -> None:
        pass

    def collect_observations(self) -> List[np.ndarray]:
        raise NotImplementedError

    def on_action_received(self, continuous: Sequence[float], discrete: Sequence[int]) -> None:
        pass

    def action_mask(self) -> Optional[List[bool]]:
        """Over all discrete branches, True = not allowed; None sends no mask."""
        return None

    def on_episode_end(self) -> None:
        """Called once the terminal step is recorded, before the next episode begins."""

    def add_reward(self, reward: float) -> None:
        self.reward += reward
        self.cumulative_reward += reward

    def end_episode(self) -> None:
        self.end_reason = self.end_reason or "done"

    def episode_interrupted(self) -> None:
        self.end_reason = self.end_reason or "interrupted"


class World:
    """What agents may use: the trainer's environment parameters, the stats recorder, a seeded RNG."""

    def __init__(
        self,
        options: SceneOptions,
        parameters: Callable[[str, float], float],
        record_stat: Callable[[str, float, StatsAggregationMethod], None],
        seed: int,
    ):
        self.options = options
        self.parameter = parameters
        self.record_stat = record_stat
        self.rng = np.random.default_rng(seed)


class GoalAgent(Agent):
    """Walks a line of ``track_length`` cells from the middle to a goal left or right of it.

    Observation ``VectorSensor_size3``: [position, goal, goal - position] / track length.
    Discrete: one branch, 0 stay, 1 left, 2 right (0 is a no-op, as in Unity's Basic example,
    so the trainer's empty actions do nothing). Continuous: one value in [-1, 1], cells to move.
    """

    def __init__(self, agent_id: int, world: World, continuous: bool, camera: bool):
        super().__init__(agent_id, world.options.max_step)
        self.world = world
        self.continuous = continuous
        self.camera = camera
        self.position = 0.0
        self.goal = 0.0
        self.distance = 0.0

    def on_episode_begin(self) -> None:
        half = self.world.options.track_length // 2
        wanted = self.world.parameter("goal_distance", self.world.options.goal_distance)
        self.distance = _clamp(round(wanted), 1, half)
        self.position = float(half)
        self.goal = self.position + self.distance * self.world.rng.choice([-1.0, 1.0])

    def collect_observations(self) -> List[np.ndarray]:
        length = float(self.world.options.track_length)
        vector = np.array(
            [self.position, self.goal, self.goal - self.position], dtype=np.float32
        ) / length
        return [self._render(), vector] if self.camera else [vector]

    def _render(self) -> np.ndarray:
        size = self.world.options.image_size
        image = np.zeros((3, size, size), dtype=np.float32)
        scale = size / self.world.options.track_length
        image[1, :, min(size - 1, int(self.goal * scale))] = 1.0  # the goal, green
        image[0, :, min(size - 1, int(self.position * scale))] = 1.0  # the agent, red
        return image

    def on_action_received(self, continuous: Sequence[float], discrete: Sequence[int]) -> None:
        if self.continuous:
            move = _clamp(continuous[0], -1.0, 1.0) if len(continuous) else 0.0
        else:
            move = {0: 0.0, 1: -1.0, 2: 1.0}[int(discrete[0]) if len(discrete) else 0]
        last_cell = self.world.options.track_length - 1
        self.position = _clamp(self.position + move, 0.0, last_cell)
        self.add_reward(-self.world.parameter("step_penalty", self.world.options.step_penalty))
        if abs(self.position - self.goal) < 0.5:
            self.add_reward(1.0)
            self.end_episode()

    def on_episode_end(self) -> None:
        self.world.record_stat(
            "Goal/Success", 1.0 if self.end_reason == "done" else 0.0, StatsAggregationMethod.AVERAGE
        )
        self.world.record_stat("Goal/Episode Length", float(self.step_count), StatsAggregationMethod.AVERAGE)
        self.world.record_stat("Goal/Goal Distance", self.distance, StatsAggregationMethod.MOST_RECENT)


def _goal_behavior(name: str, continuous: bool, camera: bool, options: SceneOptions) -> Behavior:
    sensors = [Sensor("VectorSensor_size3", (3,), (DimensionProperty.NONE,))]
    if camera:
        size = options.image_size
        sensors.insert(  # "CameraSensor" sorts before "VectorSensor_size3"
            0,
            Sensor(
                "CameraSensor",
                (3, size, size),
                (
                    DimensionProperty.NONE,
                    DimensionProperty.TRANSLATIONAL_EQUIVARIANCE,
                    DimensionProperty.TRANSLATIONAL_EQUIVARIANCE,
                ),
                png=True,
            ),
        )
    return Behavior(
        f"{name}?team=0", tuple(sensors), 1 if continuous else 0, () if continuous else (3,)
    )


class Scene:
    """Behaviours and the agents that act for them, built once the handshake gives
    ``num_areas`` and the seed."""

    def __init__(self, options: SceneOptions, kinds: Dict[str, Tuple[bool, bool]]):
        """``kinds`` maps a behaviour name to (continuous actions, camera)."""
        self.options = options
        self.kinds = kinds
        self.behaviors = [
            _goal_behavior(name, continuous, camera, options)
            for name, (continuous, camera) in kinds.items()
        ]
        self.agents: Dict[str, List[GoalAgent]] = {}

    def build(self, world: World, num_areas: int) -> None:
        count = self.options.num_agents * max(1, num_areas)
        next_id = 0
        for behavior, (continuous, camera) in zip(self.behaviors, self.kinds.values(), strict=True):
            self.agents[behavior.name] = [
                GoalAgent(next_id + i, world, continuous, camera) for i in range(count)
            ]
            next_id += count  # agent ids are unique across behaviours, as in Unity


SCENES: Dict[str, Dict[str, Tuple[bool, bool]]] = {
    "goal": {"Goal": (False, False)},
    "continuous": {"GoalContinuous": (True, False)},
    "visual": {"GoalVisual": (False, True)},
    "two-behaviors": {"Walker": (False, False), "Glider": (True, False)},
}


def make_scene(name: str, options: SceneOptions) -> Scene:
    kinds = SCENES[name]
    if options.behavior_name:
        if len(kinds) != 1:
            raise ValueError(f"--behavior-name renames one behaviour; scene {name!r} has {len(kinds)}")
        kinds = {options.behavior_name: next(iter(kinds.values()))}
    return Scene(options, kinds)


def _clamp(value: float, low: float, high: float) -> float:
    """np.clip for one number, without its per-call cost (32 agents call it every step)."""
    return float(min(max(value, low), high))
