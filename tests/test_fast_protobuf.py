"""mlagents-envs' protobuf modules decode in C: served from protobuf 6's upb backend where protobuf is
4 or newer (Python 3.11: NOTE [ Fast protobuf ]), or loaded as they are, with protobuf 3.20's C++
backend, where the finder steps aside (Python 3.10)."""
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
def test_every_module_decodes_in_c():
    package = importlib.import_module("mlagents_envs.communicator_objects")
    names = [m.name for m in pkgutil.iter_modules(package.__path__) if m.name.endswith("_pb2")]
    assert len(names) == 21  # in mlagents-envs 1.0.0 and 1.1.0
    for name in names:
        importlib.import_module(f"{package.__name__}.{name}")
    if fast_protobuf.needed():
        assert fast_protobuf.backend() == "upb"
        assert fast_protobuf.served_modules() == sorted(f"{package.__name__}.{name}" for name in names)
    else:  # protobuf 3.x: the files load as they are
        assert fast_protobuf.backend() == "cpp"
        assert fast_protobuf.served_modules() == []


@pytest.mark.fast
def test_the_modules_look_generated():
    assert (command_pb2.STEP, command_pb2.RESET, command_pb2.QUIT) == (0, 1, 2)
    assert command_pb2.CommandProto.Name(1) == "RESET"
    assert (observation_pb2.NONE, observation_pb2.PNG) == (0, 1)
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
    if not fast_protobuf.needed():
        return  # protobuf 3.x names nested classes without their parent: only messages pickle
    assert observation_pb2.ObservationProto.FloatData.__qualname__ == "ObservationProto.FloatData"
    for cls in (UnityMessageProto, observation_pb2.ObservationProto.FloatData,
                unity_rl_input_pb2.UnityRLInputProto.AgentActionsEntry):
        assert pickle.loads(pickle.dumps(cls)) is cls


def probing_env(worker_id, side_channels):
    """Fails to build unless this worker process decodes in C, served by the finder where needed."""
    from mlagents_envs.communicator_objects import unity_output_pb2

    served = getattr(unity_output_pb2, "__fast_protobuf__", False)
    if fast_protobuf.backend() == "python" or served != fast_protobuf.needed():
        raise RuntimeError(f"slow protobuf in the worker: {fast_protobuf.backend()}")
    return SimpleEnvironment(worker_id, side_channels)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("start_method", ["spawn", "forkserver", "fork"])
def test_workers_decode_in_c(env_manager_factory, start_method):
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
