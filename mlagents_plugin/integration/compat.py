"""Every use of ML-Agents 1.1.0 internals, in one list, and the check that they still exist.

Beyond ML-Agents' public classes (EnvManager and its protected ``_step``/``_reset_env``/
``_take_step`` contract, BaseEnv, RunOptions, StatsReporter), the package replaces module
attributes, reads private attributes, and reproduces what methods do, which ML-Agents does not
promise to keep: here (the hooks below), and in core/batching.py, core/stepper.py's early actions,
core/worker_inputs.py, the worker's hooks in local/ and trainers/, each named in a comment over its
entries. ``INTERNALS`` names each of them; ``check()`` verifies them all, and runs in
``python -m mlagents_plugin doctor`` and in the test suite, so that an ML-Agents upgrade fails
loudly there rather than subtly in a training run. (Python's: ``local.fork_server.check``; Ray's:
``ray.local.check``.)

Each ``install_*`` wraps ML-Agents' original, never an earlier wrapper of ours: installing
again (a second ``register()`` in one process, as tests do) replaces the hook, and the latest
installation wins.
"""
import contextlib
import functools
import itertools
import os
import sys
from typing import Any, Callable, Dict, Iterator, List

import cattr
import yaml
from mlagents.trainers import learn
from mlagents.trainers import settings as mla_settings
from mlagents.trainers.agent_processor import AgentManager
from mlagents.trainers.behavior_id_utils import get_global_agent_id
from mlagents.trainers.exception import TrainerConfigError
from mlagents.trainers.settings import EnvironmentSettings, strict_to_cls
from mlagents.trainers.subprocess_env_manager import SubprocessEnvManager
from mlagents.trainers.torch_entities import model_serialization

from mlagents_plugin.core.internals import ORIGINAL, Internal, original, verify

# What mlagents-learn would build without us (``enabled: false``).
UPSTREAM_ENV_MANAGER = SubprocessEnvManager


INTERNALS = [
    Internal("mlagents.trainers.settings:load_config", "replaced: sees the YAML before it is validated"),
    Internal("mlagents.trainers.settings:RunOptions.from_argparse", "reads the YAML via load_config", "load_config("),
    Internal("mlagents.trainers.settings:RunOptions.from_argparse", "wrapped: its config errors become one line",
             "TrainerConfigError("),
    Internal("mlagents.trainers.learn:SubprocessEnvManager", "replaced: run_training builds our manager"),
    Internal("mlagents.trainers.learn:run_training", "builds the env manager", "SubprocessEnvManager("),
    Internal("mlagents.trainers.learn:write_run_options", "replaced: adds env_manager to configuration.yaml"),
    Internal("mlagents.trainers.settings:strict_to_cls", "structures EnvironmentSettings in our cattrs hook"),
    Internal("mlagents.trainers.settings:EnvironmentSettings.validate_num_envs", "its refusal we take over",
             "num_envs must be 1"),
    Internal("mlagents.trainers.torch_entities.model_serialization:ModelSerializer.export_policy_model",
             "wrapped: exports with dynamo=False", "torch.onnx.export("),
    Internal("mlagents.trainers.agent_processor:AgentProcessor._clean_agent_data", "called on a replaced worker"),
    Internal("mlagents.trainers.agent_processor:AgentProcessor._clear_group_status_and_obs",
             "called on a replaced worker"),
    Internal("mlagents.trainers.agent_processor:AgentProcessor.__init__", "its per-agent dicts are read",
             "self._experience_buffers"),
    Internal("mlagents.trainers.agent_processor:AgentProcessor.__init__", "", "self._last_step_result"),
    Internal("mlagents.trainers.agent_processor:AgentProcessor.__init__", "", "self._last_take_action_outputs"),
    Internal("mlagents.trainers.agent_processor:AgentProcessor.__init__", "", "self._episode_steps"),
    # replaced in worker processes by local/player_watch.py and, on Linux, local/linux/players.py
    # (which must not import this module: torch)
    Internal("mlagents_envs.env_utils:launch_executable", "replaced: watches each player it launches"),
    Internal("mlagents_envs.env_utils:launch_executable", "starts the player through its module's subprocess, "
             "which linux/players.py replaces: the player dies with its worker", "subprocess.Popen("),
    Internal("mlagents_envs.environment:UnityEnvironment.__init__", "launches via env_utils.launch_executable",
             "launch_executable("),
    # replaced in worker processes by local/rpc_server.py: NOTE [ One run per port ], NOTE [ Loopback only ]
    Internal("mlagents_envs.rpc_communicator:RpcCommunicator.create_server",
             "replaced: binds its port without SO_REUSEPORT", "grpc.so_reuseport"),
    Internal("mlagents_envs.rpc_communicator:RpcCommunicator.create_server",
             "replaced: binds every address, where ours binds loopback", '"[::]:"'),
    Internal("mlagents_envs.rpc_communicator:RpcCommunicator.create_server", "ours sets what it sets",
             "self.unity_to_external = UnityToExternalServicerImplementation()"),
    Internal("mlagents_envs.rpc_communicator:RpcCommunicator.create_server", "", "self.is_open = True"),
    Internal("mlagents_envs.rpc_communicator:RpcCommunicator.__init__", "creates the server", "self.create_server()"),
    Internal("mlagents_envs.rpc_communicator:RpcCommunicator.check_port", "called by our create_server"),
    # core/worker_inputs.py: the trainer makes the analytics messages, worker 0's channel queues them as they are
    Internal("mlagents.trainers.training_analytics_side_channel:TrainingAnalyticsSideChannel.environment_initialized",
             "queues one message, which worker_inputs.Analytics takes", "queue_message_to_send("),
    Internal("mlagents.trainers.training_analytics_side_channel:TrainingAnalyticsSideChannel.training_started", "",
             "queue_message_to_send("),
    Internal("mlagents_envs.side_channel.side_channel:SideChannel.queue_message_to_send",
             "its queue is read and written as a list of messages", "self.message_queue.append(msg.buffer)"),
    # core/batching.py: one evaluate for many workers, then what get_action does for each (NOTE [ Batched inference ])
    Internal("mlagents.trainers.policy.torch_policy:TorchPolicy.get_action", "batching.get_actions does what it does",
             "run_out = self.evaluate(decision_requests, global_agent_ids)"),
    Internal("mlagents.trainers.policy.torch_policy:TorchPolicy.get_action", "",
             'self.save_memories(global_agent_ids, run_out.get("memory_out"))'),
    Internal("mlagents.trainers.policy.torch_policy:TorchPolicy.get_action", "",
             'self.check_nan_action(run_out.get("action"))'),
    Internal("mlagents.trainers.policy.torch_policy:TorchPolicy.get_action", "",
             "get_global_agent_id(worker_id, int(agent_id))"),
    Internal("mlagents.trainers.policy.torch_policy:TorchPolicy.get_action", "", "return ActionInfo.empty()"),
    Internal("mlagents.trainers.policy.torch_policy:TorchPolicy.get_action", "",
             'env_action=run_out.get("env_action")'),
    Internal("mlagents.trainers.policy.torch_policy:TorchPolicy.evaluate",
             "called once on the workers' DecisionSteps together: reads their observations and masks",
             "obs = decision_requests.obs"),
    Internal("mlagents.trainers.policy.torch_policy:TorchPolicy.evaluate", "",
             "self._extract_masks(decision_requests)"),
    Internal("mlagents.trainers.policy.torch_policy:TorchPolicy.evaluate", "memories by global agent id",
             "self.retrieve_memories(global_agent_ids)"),
    Internal("mlagents.trainers.policy.torch_policy:TorchPolicy._extract_masks",
             "a worker without masks is nothing masked, as batching fills it", "1 - np.concatenate("),
    Internal("mlagents.trainers.policy.policy:Policy.save_memories", "called for a batch's agents"),
    Internal("mlagents.trainers.policy.policy:Policy.check_nan_action", "called on a batch's actions"),
    Internal("mlagents_envs.base_env:_ActionTupleBase", "evaluate's ActionTuples and LogProbsTuples are split by rows"),
    Internal("mlagents.trainers.torch_entities.action_log_probs:LogProbsTuple", "", "(_ActionTupleBase)"),
    Internal("mlagents.trainers.behavior_id_utils:get_global_agent_id",
             "batching names agents as get_action does; drop_worker_trajectories finds a worker's by prefix",
             'f"agent_{worker_id}-{agent_id}"'),
    # core/stepper.py keeps the EnvManager's own policies dict, which set_policy fills in place
    Internal("mlagents.trainers.env_manager:EnvManager.set_policy", "the stepper reads the dict it fills",
             "self.policies[brain_name] = policy"),
    # core/stepper.py's early actions (NOTE [ Actions as steps land ]) and trainers/ppo_fast.py
    Internal("mlagents.trainers.policy.torch_policy:TorchPolicy", "only ML-Agents' own policy class acts early"),
    Internal("mlagents.trainers.policy.policy:Policy.__init__",
             "read: a recurrent policy does not act early, and ppo_fast takes its trajectories one by one",
             "self.use_recurrent"),
    Internal("mlagents.trainers.settings:check_hyperparam_schedules",
             "wrapped: ppo_fast's schedules are filled in as ppo's", 'trainer_type == "ppo"'),
    Internal("mlagents.trainers.settings:TrainerSettings.structure", "calls it by the module's name",
             "check_hyperparam_schedules("),
    # trainers/ppo_fast.py: its update is upstream's, on arrays (NOTE [ The same minibatches ])
    Internal("mlagents.trainers.trainer.on_policy_trainer:OnPolicyTrainer._update_policy",
             "ppo_fast's update draws what it draws, in the same order",
             "self.update_buffer.shuffle(sequence_length=self.policy.sequence_length)"),
    Internal("mlagents.trainers.trainer.on_policy_trainer:OnPolicyTrainer._update_policy", "",
             "minibatch = buffer.make_mini_batch(i, i + batch_size)"),
    Internal("mlagents.trainers.trainer.on_policy_trainer:OnPolicyTrainer._update_policy", "",
             "(advantages - advantages.mean()) / (advantages.std() + 1e-10)"),
    Internal("mlagents.trainers.buffer:AgentBuffer.shuffle", "ppo_fast makes the same draw", "np.random.shuffle(s)"),
    Internal("mlagents.trainers.trainer.rl_trainer:RLTrainer._clear_update_buffer", "called by ppo_fast's update"),
    Internal("mlagents.trainers.trainer.rl_trainer:RLTrainer.__init__", "cleared by ppo_fast's update",
             "self.cumulative_returns_since_policy_update"),
    # trainers/ppo_fast.py's round and trainers/trajectories.py are upstream's, step for step
    # (NOTE [ A round at once ])
    Internal("mlagents.trainers.trainer.rl_trainer:RLTrainer.advance", "ppo_fast's advance takes what it takes",
             "for _ in range(traj_queue.qsize()):"),
    Internal("mlagents.trainers.trainer.rl_trainer:RLTrainer.advance", "", "if self._is_ready_update():"),
    Internal("mlagents.trainers.trainer.on_policy_trainer:OnPolicyTrainer._is_ready_update",
             "called by ppo_fast's advance"),
    Internal("mlagents.trainers.ppo.trainer:PPOTrainer._process_trajectory",
             "ppo_fast's round does what it does, in order", "self.optimizer.critic.update_normalization("),
    Internal("mlagents.trainers.ppo.trainer:PPOTrainer._process_trajectory", "",
             "reward_signal.evaluate(agent_buffer_trajectory) * reward_signal.strength"),
    Internal("mlagents.trainers.ppo.trainer:PPOTrainer._process_trajectory", "", "local_return = local_advantage + "),
    Internal("mlagents.trainers.ppo.trainer:PPOTrainer._process_trajectory", "",
             "self._append_to_update_buffer(agent_buffer_trajectory)"),
    Internal("mlagents.trainers.trainer.rl_trainer:RLTrainer._append_to_update_buffer",
             "ppo_fast appends sequences of one step as it does", "resequence_and_append("),
    Internal("mlagents.trainers.trainer.rl_trainer:RLTrainer._process_trajectory",
             "called by ppo_fast's round for the step count, summaries and checkpoints", "self._increment_step("),
    Internal("mlagents.trainers.trainer.rl_trainer:RLTrainer.__init__", "added to by ppo_fast's round",
             "self.collected_rewards"),
    Internal("mlagents.trainers.trainer.trainer:Trainer.__init__", "reported to by ppo_fast's round",
             "self._stats_reporter"),
    Internal("mlagents.trainers.trainer.rl_trainer:RLTrainer._warn_if_group_reward", "called by ppo_fast's round"),
    Internal("mlagents.trainers.trainer.rl_trainer:RLTrainer._update_end_episode_stats", "called by ppo_fast's round"),
    Internal("mlagents.trainers.optimizer.torch_optimizer:TorchOptimizer.get_trajectory_value_estimates",
             "ppo_fast's batched pass gives its values", "self.critic.critic_pass("),
    Internal("mlagents.trainers.optimizer.torch_optimizer:TorchOptimizer.get_trajectory_value_estimates", "",
             "next_value_estimate[k] = 0.0"),
    Internal("mlagents.trainers.trajectory:Trajectory.to_agentbuffer", "trainers/trajectories.py makes what it makes",
             "mask = 1 - np.concatenate(exp.action_mask)"),
    Internal("mlagents.trainers.trajectory:Trajectory.to_agentbuffer", "",
             "cont_next_actions = np.zeros_like(exp.action.continuous)"),
    Internal("mlagents.trainers.buffer:AgentBufferField.append", "trainers/trajectories.py sets the mask's padding",
             "self.padding_value = padding_value"),
]


def check() -> List[str]:
    """What of ``INTERNALS`` no longer matches the installed ML-Agents."""
    return [f"ML-Agents: {p}; this ML-Agents is not supported (compat.py)." for p in verify(INTERNALS)]


# ----------------------------------------------------------------------------- the hooks


def _replace(owner: Any, name: str, make: Callable[[Any], Callable[..., Any]]) -> None:
    """Set ``owner.name`` to ``make(original)``, where original is ML-Agents' own."""
    upstream = original(getattr(owner, name))
    wrapper = make(upstream)
    setattr(wrapper, ORIGINAL, upstream)
    setattr(owner, name, wrapper)


def install_yaml_section_hook(on_config: Callable[[Dict[str, Any]], None]) -> None:
    """Let ``on_config`` see (and pop keys from) the trainer YAML before ML-Agents validates it
    (``RunOptions.from_argparse`` rejects unknown top-level keys)."""

    def make(original: Callable[[str], Dict[str, Any]]) -> Callable[[str], Dict[str, Any]]:
        def load_config(config_path: str) -> Dict[str, Any]:
            config = original(config_path)
            if isinstance(config, dict):
                on_config(config)
            return config

        return load_config

    _replace(mla_settings, "load_config", make)


def install_env_manager(factory: Callable[..., Any]) -> None:
    """Make ``run_training`` build its env manager with ``factory(env_factory, options, n_env)``."""
    learn.SubprocessEnvManager = factory


def install_run_options_writer(extra_sections: Callable[[], Dict[str, Any]]) -> None:
    """Add ``extra_sections()`` to the ``configuration.yaml`` ML-Agents writes into the results
    folder, so that ``mlagents-learn results/<run-id>/configuration.yaml`` runs the same again."""

    def make(original: Callable[[str, Any], None]) -> Callable[[str, Any], None]:
        def write_run_options(output_dir: str, run_options: Any) -> None:
            original(output_dir, run_options)
            path = os.path.join(output_dir, "configuration.yaml")
            if os.path.isfile(path):  # ML-Agents only warns when it cannot write it
                with open(path, "a") as f:
                    yaml.safe_dump(extra_sections(), f, sort_keys=False)

        return write_run_options

    _replace(learn, "write_run_options", make)


def install_env_settings_check(check: Callable[[EnvironmentSettings], None]) -> None:
    """Let ``check`` judge the environment settings (``--env``, ``--num-envs``...) in place of
    ML-Agents' validator, which refuses num_envs > 1 without a Unity build: the Editor is a
    single env, but a Python env (``env_manager.env``) has no such limit. The hook goes into
    cattrs' global converter, which ML-Agents structures settings with in
    ``RunOptions.from_argparse``: before the results folder exists.
    """

    def structure(d: Dict[str, Any], t: type) -> EnvironmentSettings:
        d = dict(d)
        num_envs = d.get("num_envs", 1)
        d["num_envs"] = 1  # past ML-Agents' validator: ``check`` decides
        env_settings = strict_to_cls(d, t)
        env_settings.num_envs = num_envs
        check(env_settings)
        return env_settings

    cattr.register_structure_hook(EnvironmentSettings, structure)


def install_config_errors() -> None:
    """Show a configuration error of ``mlagents-learn`` as one line, and exit 1.

    ML-Agents raises TrainerConfigError from ``RunOptions.from_argparse`` (ours among them: the
    ``env_manager:`` section, ``--num-envs``), and it reaches the user as a traceback of 20-odd
    lines ending in the one that matters. That line alone goes to stderr, unless ``--debug``.
    """

    def make(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def from_argparse(args: Any) -> Any:
            try:
                return original(args)
            except TrainerConfigError as e:
                if getattr(args, "debug", False):
                    raise
                sys.stderr.write(f"mlagents-learn: configuration error: {e} (--debug shows where)\n")
                raise SystemExit(1) from None

        return from_argparse

    _replace(mla_settings.RunOptions, "from_argparse", make)


def install_trainer_type_aliases(aliases: Dict[str, str]) -> None:
    """Read a trainer type of ours as the ML-Agents type it stands for (``ppo_fast`` as ``ppo``)
    where ML-Agents fills in settings by type: ``check_hyperparam_schedules`` gives ``beta`` and
    ``epsilon`` the learning rate's schedule only for ``ppo`` and ``poca``, so a YAML that sets
    ``learning_rate_schedule`` alone would otherwise mean another learner."""

    Check = Callable[[Dict[str, Any], str], Dict[str, Any]]

    def make(original: Check) -> Check:
        def check_hyperparam_schedules(val: Dict[str, Any], trainer_type: str) -> Dict[str, Any]:
            return original(val, aliases.get(trainer_type, trainer_type))

        return check_hyperparam_schedules

    _replace(mla_settings, "check_hyperparam_schedules", make)


def use_legacy_onnx_exporter() -> None:
    """Make ML-Agents' ``export_policy_model`` export with ``dynamo=False``.

    torch 2.13's ``torch.onnx.export`` defaults to ``dynamo=True``, which needs the
    ``onnxscript`` package and, with it, would still not honour ML-Agents' opset 9. ML-Agents
    1.1.0 calls it without ``dynamo``, so the model Unity loads is never written and
    ``mlagents-learn`` exits 1 at the very end of a run. Upstream's own function runs, with
    ``torch.onnx.export`` defaulting to ``dynamo=False`` for the duration of the call.
    """

    def make(original: Callable[[Any, str], None]) -> Callable[[Any, str], None]:
        @functools.wraps(original)
        def export_policy_model(self: Any, output_filepath: str) -> None:
            with _legacy_onnx_export():
                original(self, output_filepath)

        return export_policy_model

    _replace(model_serialization.ModelSerializer, "export_policy_model", make)


@contextlib.contextmanager
def _legacy_onnx_export() -> Iterator[None]:
    onnx = model_serialization.torch.onnx
    export = onnx.export
    onnx.export = functools.partial(export, dynamo=False)
    try:
        yield
    finally:
        onnx.export = export


def drop_worker_trajectories(agent_managers: Dict[str, AgentManager], worker_id: int) -> None:
    """Forget every partial trajectory of ``worker_id``'s agents.

    Used when a worker is replaced: the new env reuses agent ids, so without this its first
    observations would be appended to trajectories of the env that failed.
    """
    prefix = get_global_agent_id(worker_id, "")
    for manager in agent_managers.values():
        tracked = itertools.chain(
            manager._experience_buffers,
            manager._last_step_result,
            manager._last_take_action_outputs,
            manager._episode_steps,
        )
        for global_id in {gid for gid in tracked if gid.startswith(prefix)}:
            manager._clean_agent_data(global_id)
            manager._clear_group_status_and_obs(global_id)

