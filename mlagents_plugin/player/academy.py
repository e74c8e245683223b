"""The Academy: runs a scene in Unity's order and speaks the protocol through the communicator.

For each input from the trainer, as Unity's Academy does:
1. its side-channel messages are processed first (parameters sent with a RESET apply to the
   episodes that RESET starts);
2. then its command: RESET starts a new episode for every agent (episodes cut short send no
   terminal step); STEP gives each behaviour's actions to the agents that asked for a decision
   in the last output, in that order (actions carry no agent ids);
3. an agent whose episode ends (goal reached, or ``max_step`` reached: interrupted) sends a
   terminal step with its final observation and starts a new episode at once, so the same agent
   id appears twice in one output, terminal first;
4. every agent then asks for a decision;
5. a behaviour's parameters (action spec) travel once, in the first output with its agents;
6. the stats recorded meanwhile travel in the output's side channel.
"""
import io
import logging
import os
import signal
import time
from typing import Dict, List, NamedTuple, Optional

import numpy as np
from mlagents_envs.communicator_objects.agent_info_pb2 import AgentInfoProto
from mlagents_envs.communicator_objects.command_pb2 import QUIT, RESET
from mlagents_envs.communicator_objects.observation_pb2 import NONE, PNG, ObservationProto
from mlagents_envs.communicator_objects.unity_output_pb2 import UnityOutputProto
from mlagents_envs.communicator_objects.unity_rl_initialization_output_pb2 import (
    UnityRLInitializationOutputProto,
)
from mlagents_envs.communicator_objects.unity_rl_input_pb2 import UnityRLInputProto
from mlagents_envs.environment import UnityEnvironment
from mlagents_envs.side_channel.side_channel_manager import SideChannelManager
from PIL import Image

from mlagents_plugin.player.communicator import BuildCommunicator
from mlagents_plugin.player.scenes import Agent, Scene, Sensor, World
from mlagents_plugin.player.side_channels import (
    AnalyticsReceiver,
    EngineConfigurationReceiver,
    EnvironmentParametersReceiver,
    StatsSender,
)

logger = logging.getLogger(__name__)

# The package version of com.unity.ml-agents that goes with mlagents 1.1.0 (Release 22).
UNITY_PACKAGE_VERSION = "3.0.0"


class Faults(NamedTuple):
    """Misbehaviour on request (``--crash-after-steps`` etc.: see cli.py)."""

    crash_after_steps: Optional[int] = None
    crash_exit_code: int = 3
    crash_signal: Optional[str] = None
    hang_after_steps: Optional[int] = None
    slow_start_s: float = 0.0
    die_during_handshake: bool = False
    only_port: Optional[int] = None
    once_file: Optional[str] = None

    def fire(self, port: int) -> bool:
        """Whether a fault may fire in the player on ``port`` now (claims ``once_file``)."""
        if self.only_port is not None and port != self.only_port:
            return False
        if self.once_file is not None:
            try:
                with open(self.once_file, "x"):
                    pass
            except FileExistsError:
                return False
        return True


class Academy:
    def __init__(self, scene: Scene, communicator: BuildCommunicator, port: int, faults: Faults):
        self.scene = scene
        self.communicator = communicator
        self.port = port
        self.faults = faults
        self.engine = EngineConfigurationReceiver()
        self.parameters = EnvironmentParametersReceiver()
        self.stats = StatsSender()
        self.side_channels = SideChannelManager(
            [self.engine, self.parameters, self.stats, AnalyticsReceiver()]
        )
        self.steps = 0
        self.reset_once = False
        self.specs_sent: set = set()
        self.decision_ids: Dict[str, List[int]] = {}  # per behaviour, in the last output's order
        self.terminal: Dict[str, List[AgentInfoProto]] = {}
        self.quit_requested = False  # SIGUSR1: quit as Application.Quit() does

    def request_quit(self, signum: int = 0, frame: object = None) -> None:
        self.quit_requested = True

    def run(self) -> None:
        """Serve the trainer until it goes away (TrainerGone) or sends QUIT."""
        if self.faults.slow_start_s and self.faults.fire(self.port):
            logger.warning(f"Fault: starting {self.faults.slow_start_s} s late.")
            time.sleep(self.faults.slow_start_s)
        init_input, rl_input = self.communicator.handshake(self._init_output(), self._between_calls)
        logger.info(
            f"Handshake done: trainer communication version {init_input.communication_version}, "
            f"package {init_input.package_version}, seed {init_input.seed}, "
            f"num_areas {init_input.num_areas}."
        )
        world = World(self.scene.options, self.parameters.get, self.stats.add, init_input.seed)
        self.scene.build(world, init_input.num_areas)
        while self._apply(rl_input):
            self._maybe_fail()
            if self.quit_requested:
                logger.info("Quitting on SIGUSR1, as Application.Quit() would.")
                return
            rl_input = self.communicator.exchange(self._output())
        logger.info("QUIT received.")

    # ---------------------------------------------------------------- the handshake

    @staticmethod
    def _init_output() -> UnityRLInitializationOutputProto:
        output = UnityRLInitializationOutputProto(
            name="AcademySingleton",
            communication_version=UnityEnvironment.API_VERSION,
            package_version=UNITY_PACKAGE_VERSION,
        )
        capabilities = output.capabilities  # everything a Unity 2022+ package supports
        capabilities.baseRLCapabilities = True
        capabilities.concatenatedPngObservations = True
        capabilities.compressedChannelMapping = True
        capabilities.hybridActions = True
        capabilities.trainingAnalytics = True
        capabilities.variableLengthObservation = True
        capabilities.multiAgentGroups = True
        return output

    def _between_calls(self) -> None:
        if self.faults.die_during_handshake and self.faults.fire(self.port):
            logger.warning("Fault: dying between the two handshake calls.")
            os._exit(self.faults.crash_exit_code)

    # ---------------------------------------------------------------- inputs

    def _apply(self, rl_input: UnityRLInputProto) -> bool:
        self.side_channels.process_side_channel_message(rl_input.side_channel)
        if rl_input.command == QUIT:
            return False
        if rl_input.command == RESET or not self.reset_once:
            self._reset()
        else:
            self._step(rl_input)
        return True

    def _reset(self) -> None:
        self.reset_once = True
        self.terminal = {behavior.name: [] for behavior in self.scene.behaviors}
        for agents in self.scene.agents.values():
            for agent in agents:
                _begin_episode(agent)

    def _step(self, rl_input: UnityRLInputProto) -> None:
        self.steps += 1
        if self.scene.options.frame_time_s > 0:
            time.sleep(self.scene.options.frame_time_s)
        for behavior in self.scene.behaviors:
            agents = {agent.id: agent for agent in self.scene.agents[behavior.name]}
            actions = rl_input.agent_actions[behavior.name].value if behavior.name in rl_input.agent_actions else []
            for index, agent_id in enumerate(self.decision_ids.get(behavior.name, [])):
                agent = agents[agent_id]
                if index < len(actions):
                    continuous = actions[index].continuous_actions
                    discrete = actions[index].discrete_actions
                else:  # no actions sent for this behaviour: Unity acts with zeros
                    continuous, discrete = [0.0] * behavior.continuous_actions, [0] * len(behavior.discrete_branches)
                agent.step_count += 1
                agent.on_action_received(continuous, discrete)
                if agent.end_reason is None and 0 < agent.max_step <= agent.step_count:
                    agent.episode_interrupted()
                if agent.end_reason is not None:
                    self.terminal[behavior.name].append(self._info(behavior.sensors, agent, done=True))
                    agent.on_episode_end()
                    _begin_episode(agent)

    def _maybe_fail(self) -> None:
        faults = self.faults
        if faults.crash_after_steps is not None and self.steps == faults.crash_after_steps:
            if faults.fire(self.port):
                how = faults.crash_signal or f"exit code {faults.crash_exit_code}"
                logger.warning(f"Fault: crashing at step {self.steps} ({how}).")
                if faults.crash_signal:
                    os.kill(os.getpid(), signal.Signals[faults.crash_signal])
                os._exit(faults.crash_exit_code)
        if faults.hang_after_steps is not None and self.steps == faults.hang_after_steps:
            if faults.fire(self.port):
                logger.warning(f"Fault: hanging at step {self.steps}.")
                while True:
                    time.sleep(3600)

    # ---------------------------------------------------------------- outputs

    def _output(self) -> UnityOutputProto:
        output = UnityOutputProto()
        for behavior in self.scene.behaviors:
            infos = output.rl_output.agentInfos[behavior.name].value
            infos.extend(self.terminal[behavior.name])
            self.terminal[behavior.name] = []
            self.decision_ids[behavior.name] = []
            for agent in self.scene.agents[behavior.name]:
                infos.append(self._info(behavior.sensors, agent, done=False))
                self.decision_ids[behavior.name].append(agent.id)
                agent.reward = agent.group_reward = 0.0  # consumed by this decision
            if behavior.name not in self.specs_sent and len(infos) > 0:
                brain = output.rl_initialization_output.brain_parameters.add()
                brain.brain_name = behavior.name
                brain.is_training = True
                brain.action_spec.num_continuous_actions = behavior.continuous_actions
                brain.action_spec.num_discrete_actions = len(behavior.discrete_branches)
                brain.action_spec.discrete_branch_sizes.extend(behavior.discrete_branches)
                self.specs_sent.add(behavior.name)
        output.rl_output.side_channel = bytes(self.side_channels.generate_side_channel_messages())
        return output

    @staticmethod
    def _info(sensors, agent: Agent, done: bool) -> AgentInfoProto:
        info = AgentInfoProto(
            reward=agent.reward,
            done=done,
            max_step_reached=done and agent.end_reason == "interrupted",
            id=agent.id,
            group_id=agent.group_id,
            group_reward=agent.group_reward,
        )
        mask = None if done else agent.action_mask()
        if mask is not None:
            info.action_mask.extend(mask)
        for sensor, data in zip(sensors, agent.collect_observations(), strict=True):
            info.observations.append(_observation(sensor, data))
        return info


def _begin_episode(agent: Agent) -> None:
    agent.end_reason = None
    agent.step_count = 0
    agent.reward = agent.cumulative_reward = agent.group_reward = 0.0
    agent.on_episode_begin()


def _observation(sensor: Sensor, data: np.ndarray) -> ObservationProto:
    observation = ObservationProto(
        shape=sensor.shape,
        dimension_properties=[p.value for p in sensor.dimension_properties],
        observation_type=sensor.observation_type.value,
        name=sensor.name,
    )
    if sensor.png:
        observation.compression_type = PNG
        observation.compressed_data = _png(data)
    else:
        observation.compression_type = NONE
        observation.float_data.data.extend(np.asarray(data, dtype=np.float32).ravel().tolist())
    return observation


def _png(image_chw: np.ndarray) -> bytes:
    """(3, H, W) in [0, 1] -> PNG bytes; mlagents-envs divides by 255 when it decodes."""
    pixels = (np.clip(image_chw, 0.0, 1.0) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(np.moveaxis(pixels, 0, -1), mode="RGB").save(buffer, format="PNG")
    return buffer.getvalue()
