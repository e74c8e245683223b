"""What users and ML-Agents reach by name: the public names, the entry points, the .pth file.
The package's rooms may move; these may not."""
import importlib.metadata
import os
import sysconfig

import pytest

import mlagents_plugin
from mlagents_plugin import fast_protobuf

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("name", mlagents_plugin.__all__)
def test_every_public_name_resolves(name):
    value = getattr(mlagents_plugin, name)
    assert getattr(value, "__name__", name) == name  # the class or function of that name, not a stand-in


def test_the_managers_are_ml_agents_env_managers():
    from mlagents.trainers.env_manager import EnvManager

    assert issubclass(mlagents_plugin.SupervisedEnvManager, EnvManager)
    assert issubclass(mlagents_plugin.RayEnvManager, EnvManager)


@pytest.mark.parametrize(
    "group, name, loads",
    [
        ("mlagents.trainer_type", "mlagents_plugin", "register"),
        ("pytest11", "mlagents_plugin", "env_manager_factory"),
        ("console_scripts", "mlagents-plugin-player", "main"),
    ],
)
def test_entry_points_load(group, name, loads):
    (entry_point,) = [ep for ep in importlib.metadata.entry_points(group=group) if ep.name == name]
    loaded = entry_point.load()
    assert callable(getattr(loaded, loads, loaded))


def test_the_mlagents_entry_point_registers_ppo_fast_with_ppos_settings(ml_agents_hooks):
    from mlagents.trainers.ppo.optimizer_torch import PPOSettings

    from mlagents_plugin.trainers.ppo_fast import FastPPOTrainer

    (entry_point,) = [
        ep for ep in importlib.metadata.entry_points(group="mlagents.trainer_type") if ep.name == "mlagents_plugin"
    ]
    assert entry_point.load()() == ({"ppo_fast": FastPPOTrainer}, {"ppo_fast": PPOSettings})


def test_the_pth_file_loads_fast_protobuf_where_it_is_needed():
    path = os.path.join(sysconfig.get_paths()["purelib"], fast_protobuf.PTH_NAME)
    with open(path) as f:
        assert f.read() == fast_protobuf.PTH_LINE
    import mlagents_envs.communicator_objects.unity_output_pb2  # noqa: F401

    served = fast_protobuf.served_modules()
    assert served if fast_protobuf.needed() else not served, "the .pth file did not install the finder"
