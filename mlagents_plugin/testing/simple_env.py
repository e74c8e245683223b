"""SimpleEnvironment: a small ``BaseEnv`` that PPO learns in a few thousand steps.

Each agent stands on a line at 0 and must walk to the end its observation points at (+1 or
-1). Reaching that end pays +1, the other end -1, and every step costs 0.01; an episode that
runs past ``episode_length`` steps is interrupted. A good policy earns about 0.95 per episode,
a random one about 0. Observations are a vector (the goal, repeated ``vector_size`` times)
and optionally an image of the goal (channel-first, as mlagents-envs delivers images).
"""
import os
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from mlagents_envs.base_env import (
    ActionSpec,
    ActionTuple,
    AgentId,
    BaseEnv,
    BehaviorName,
    BehaviorSpec,
    DecisionSteps,
    DimensionProperty,
    ObservationSpec,
    ObservationType,
    TerminalSteps,
)
from mlagents_envs.side_channel.environment_parameters_channel import (
    EnvironmentParametersChannel,
)
from mlagents_envs.side_channel.incoming_message import IncomingMessage
from mlagents_envs.side_channel.outgoing_message import OutgoingMessage
from mlagents_envs.side_channel.side_channel import SideChannel
from mlagents_envs.side_channel.stats_side_channel import (
    StatsAggregationMethod,
    StatsSideChannel,
)

STEP_PENALTY = 0.01
ACTIONS = ("discrete", "continuous", "hybrid")


class SimpleEnvironment(BaseEnv):
    """A 1-D goal environment with one or more behaviours.

    :param worker_id: the worker slot it runs in (it seeds the env).
    :param side_channels: environment parameters sent by the trainer are honoured
        (``step_size``, and any float is echoed back as the stat ``Environment/Param/<key>``
        through the stats channel, so tests can see both directions of side-channel traffic).
    :param action: "discrete" (one branch: left, right), "continuous" (one value in [-1, 1]), or
        "hybrid" (the discrete branch gives the direction, the continuous value the stride).
    :param visual_shape: (C, H, W) of an image observation, or None for vector only.
    :param step_sleep_s, step_cpu_s: what one ``step()`` costs, asleep and busy.
    :param report_pid: send this process's pid as the stat ``Environment/Env Worker Pid`` with
        every step, so a test can tell which process produced a step.
    """

    def __init__(
        self,
        worker_id: int = 0,
        side_channels: Optional[Sequence[SideChannel]] = None,
        behavior_names: Sequence[str] = ("Simple",),
        num_agents: int = 1,
        action: str = "discrete",
        vector_size: int = 1,
        visual_shape: Optional[Tuple[int, int, int]] = None,
        step_size: float = 0.2,
        episode_length: int = 20,
        step_sleep_s: float = 0.0,
        step_cpu_s: float = 0.0,
        seed: int = 0,
        report_pid: bool = False,
    ):
        if action not in ACTIONS:
            raise ValueError(f"action must be one of {', '.join(ACTIONS)}, not {action!r}")
        self.worker_id = worker_id
        self.num_agents = num_agents
        self.vector_size = vector_size
        self.visual_shape = visual_shape
        self.step_size = step_size
        self.episode_length = episode_length
        self.step_sleep_s = step_sleep_s
        self.step_cpu_s = step_cpu_s
        self.report_pid = report_pid
        self.step_count = 0
        # What a Unity build reports in its handshake; upstream's worker reads it.
        self.academy_capabilities = None
        self.rng = np.random.default_rng(seed + worker_id)
        self._param_channels = [
            c for c in side_channels or [] if isinstance(c, EnvironmentParametersChannel)
        ]
        self._stats_channels = [
            c for c in side_channels or [] if isinstance(c, StatsSideChannel)
        ]
        self.env_parameters: Dict[str, float] = {}
        obs_specs = [
            ObservationSpec((vector_size,), (DimensionProperty.NONE,), ObservationType.DEFAULT, "vector")
        ]
        if visual_shape is not None:
            obs_specs.append(
                ObservationSpec(
                    tuple(visual_shape),
                    (
                        DimensionProperty.NONE,
                        DimensionProperty.TRANSLATIONAL_EQUIVARIANCE,
                        DimensionProperty.TRANSLATIONAL_EQUIVARIANCE,
                    ),
                    ObservationType.DEFAULT,
                    "camera",
                )
            )
        action_spec = {
            "discrete": ActionSpec.create_discrete((2,)),
            "continuous": ActionSpec.create_continuous(1),
            "hybrid": ActionSpec(continuous_size=1, discrete_branches=(2,)),
        }[action]
        self._specs = {name: BehaviorSpec(obs_specs, action_spec) for name in behavior_names}
        self._agent_ids = np.arange(num_agents, dtype=np.int32)
        self._goal: Dict[str, np.ndarray] = {}
        self._position: Dict[str, np.ndarray] = {}
        self._episode_steps: Dict[str, np.ndarray] = {}
        self._actions: Dict[str, np.ndarray] = {}
        self._steps: Dict[str, Tuple[DecisionSteps, TerminalSteps]] = {}
        self.reset()

    # ------------------------------------------------------------------ BaseEnv

    @property
    def behavior_specs(self) -> Mapping[BehaviorName, BehaviorSpec]:
        return self._specs

    def reset(self) -> None:
        self._read_env_parameters()
        self._report_stats()
        for name in self._specs:
            everyone = np.ones(self.num_agents, dtype=bool)
            self._new_episodes(name, everyone)
            self._steps[name] = (
                self._decision_steps(name, np.zeros(self.num_agents, dtype=np.float32)),
                TerminalSteps.empty(self._specs[name]),
            )

    def step(self) -> None:
        self._read_env_parameters()
        self._spend_step_cost()
        self.step_count += 1
        for name in self._specs:
            self._steps[name] = self._advance(name)
        self._report_stats()

    def set_actions(self, behavior_name: BehaviorName, action: ActionTuple) -> None:
        spec = self._specs[behavior_name].action_spec
        if spec.continuous_size == 0:
            moves = np.where(action.discrete[:, 0] == 1, 1.0, -1.0)
        elif spec.discrete_size == 0:
            moves = np.clip(action.continuous[:, 0], -1.0, 1.0)
        else:  # hybrid: the direction is discrete, the stride continuous (half to full)
            stride = 0.75 + 0.25 * np.clip(action.continuous[:, 0], -1.0, 1.0)
            moves = np.where(action.discrete[:, 0] == 1, 1.0, -1.0) * stride
        self._actions[behavior_name] = moves.astype(np.float32)

    def set_action_for_agent(
        self, behavior_name: BehaviorName, agent_id: AgentId, action: ActionTuple
    ) -> None:
        self.set_actions(behavior_name, action)

    def get_steps(self, behavior_name: BehaviorName) -> Tuple[DecisionSteps, TerminalSteps]:
        return self._steps[behavior_name]

    def close(self) -> None:
        pass

    # ------------------------------------------------------------------ dynamics

    def _new_episodes(self, name: str, which: np.ndarray) -> None:
        goal = self._goal.setdefault(name, np.zeros(self.num_agents, dtype=np.float32))
        position = self._position.setdefault(name, np.zeros(self.num_agents, dtype=np.float32))
        steps = self._episode_steps.setdefault(name, np.zeros(self.num_agents, dtype=np.int32))
        goal[which] = self.rng.choice([-1.0, 1.0], size=int(which.sum()))
        position[which] = 0.0
        steps[which] = 0

    def _advance(self, name: str) -> Tuple[DecisionSteps, TerminalSteps]:
        moves = self._actions.pop(name, np.zeros(self.num_agents, dtype=np.float32))
        position = self._position[name]
        position += moves * self.step_size
        self._episode_steps[name] += 1
        reached = np.abs(position) >= 1.0 - 1e-6
        interrupted = ~reached & (self._episode_steps[name] >= self.episode_length)
        rewards = np.full(self.num_agents, -STEP_PENALTY, dtype=np.float32)
        rewards[reached] += np.where(np.sign(position[reached]) == self._goal[name][reached], 1.0, -1.0)
        done = reached | interrupted
        terminal = TerminalSteps(
            self._observations(name, done),
            rewards[done],
            interrupted[done],
            self._agent_ids[done],
            np.zeros(int(done.sum()), dtype=np.int32),
            np.zeros(int(done.sum()), dtype=np.float32),
        )
        # Agents that finished start again at once, as Unity agents do; their first decision
        # step of the new episode carries no reward.
        self._new_episodes(name, done)
        rewards[done] = 0.0
        return self._decision_steps(name, rewards), terminal

    def _decision_steps(self, name: str, rewards: np.ndarray) -> DecisionSteps:
        everyone = np.ones(self.num_agents, dtype=bool)
        return DecisionSteps(
            self._observations(name, everyone),
            rewards,
            self._agent_ids,
            None,
            np.zeros(self.num_agents, dtype=np.int32),
            np.zeros(self.num_agents, dtype=np.float32),
        )

    def _observations(self, name: str, which: np.ndarray) -> List[np.ndarray]:
        goal = self._goal[name][which]
        obs = [np.repeat(goal[:, None], self.vector_size, axis=1).astype(np.float32)]
        if self.visual_shape is not None:
            image = np.ones((len(goal),) + tuple(self.visual_shape), dtype=np.float32)
            obs.append(image * ((goal[:, None, None, None] + 1.0) / 2.0))
        return obs

    def _spend_step_cost(self) -> None:
        if self.step_cpu_s > 0:
            until = time.perf_counter() + self.step_cpu_s
            while time.perf_counter() < until:
                pass
        if self.step_sleep_s > 0:
            time.sleep(self.step_sleep_s)

    # ------------------------------------------------------------------ side channels

    def _read_env_parameters(self) -> None:
        """Decode what the trainer queued on the environment-parameters channel.

        A Unity build receives these bytes; here the env reads the channel's outgoing queue.
        Only plain float parameters are decoded (samplers are left to Unity).
        """
        for channel in self._param_channels:
            messages, channel.message_queue = channel.message_queue, []
            for buffer in messages:
                message = IncomingMessage(bytes(buffer))
                key = message.read_string()
                if message.read_int32() == EnvironmentParametersChannel.EnvironmentDataTypes.FLOAT:
                    self.env_parameters[key] = message.read_float32()
        step_size = self.env_parameters.get("step_size", self.step_size)
        if not step_size > 0:
            raise ValueError(f"step_size must be > 0, got {step_size}")
        self.step_size = step_size

    def _report_stats(self) -> None:
        """Send each parameter back as a stat (and the pid, if asked), as a Unity build would."""
        stats = {f"Environment/Param/{key}": value for key, value in self.env_parameters.items()}
        if self.report_pid:
            stats["Environment/Env Worker Pid"] = float(os.getpid())
        for channel in self._stats_channels:
            for key, value in stats.items():
                message = OutgoingMessage()
                message.write_string(key)
                message.write_float32(value)
                message.write_int32(StatsAggregationMethod.MOST_RECENT.value)
                channel.on_message_received(IncomingMessage(bytes(message.buffer)))


def simple_env(worker_id: int, side_channels: List[SideChannel], **kwargs) -> SimpleEnvironment:
    """An env factory for ``env_manager: {env: "mlagents_plugin.testing:simple_env"}``."""
    return SimpleEnvironment(worker_id, side_channels, **kwargs)
