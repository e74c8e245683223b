"""mlagents-envs' protobuf modules served from protobuf 6's fast backend (NOTE [ Fast protobuf ])."""
import importlib
import os
import pickle
import pkgutil
import subprocess
import sys

import pytest
from mlagents_envs.communicator_objects import command_pb2, observation_pb2, unity_rl_input_pb2
from mlagents_envs.communicator_objects.unity_message_pb2 import UnityMessageProto

from mlagents_plugin import fast_protobuf
from mlagents_plugin.testing import SimpleEnvironment


@pytest.mark.fast
def test_the_fast_backend_serves_every_module():
    package = importlib.import_module("mlagents_envs.communicator_objects")
    names = [m.name for m in pkgutil.iter_modules(package.__path__) if m.name.endswith("_pb2")]
    assert len(names) == 21  # in mlagents-envs 1.1.0
    for name in names:
        importlib.import_module(f"{package.__name__}.{name}")
    assert fast_protobuf.backend() == "upb"
    assert fast_protobuf.served_modules() == sorted(f"{package.__name__}.{name}" for name in names)


@pytest.mark.fast
def test_the_modules_look_generated():
    assert (command_pb2.STEP, command_pb2.RESET, command_pb2.QUIT) == (0, 1, 2)
    assert command_pb2.CommandProto.Name(1) == "RESET"
    assert (observation_pb2.NONE, observation_pb2.PNG) == (0, 1)
    assert observation_pb2.ObservationProto.FloatData.__qualname__ == "ObservationProto.FloatData"
    assert observation_pb2.DESCRIPTOR.name == "mlagents_envs/communicator_objects/observation.proto"


@pytest.mark.fast
def test_messages_and_classes_pickle_by_reference():
    message = UnityMessageProto()
    message.header.status = 200
    agent_actions = message.unity_input.rl_input.agent_actions["Goal?team=0"].value
    agent_actions.add().discrete_actions.extend([2])
    data = pickle.dumps(message)
    assert pickle.loads(data) == message
    assert pickle.loads(data).SerializeToString() == message.SerializeToString()
    for cls in (UnityMessageProto, observation_pb2.ObservationProto.FloatData,
                unity_rl_input_pb2.UnityRLInputProto.AgentActionsEntry):
        assert pickle.loads(pickle.dumps(cls)) is cls


def probing_env(worker_id, side_channels):
    """Fails to build unless this worker process decodes with the fast backend."""
    from mlagents_envs.communicator_objects import unity_output_pb2

    if fast_protobuf.backend() != "upb" or not getattr(unity_output_pb2, "__fast_protobuf__", False):
        raise RuntimeError(f"slow protobuf in the worker: {fast_protobuf.backend()}")
    return SimpleEnvironment(worker_id, side_channels)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("start_method", ["spawn", "forkserver", "fork"])
def test_workers_use_the_fast_backend(env_manager_factory, start_method):
    manager = env_manager_factory(probing_env, 2, start_method=start_method)
    manager.reset()
    assert len(manager.first_step_infos) == 2


def test_the_slow_backend_is_reported(tmp_path):
    env = dict(os.environ, PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python")
    result = subprocess.run(
        [sys.executable, "-m", "mlagents_plugin", "doctor"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    assert "decodes in pure Python" in result.stdout
