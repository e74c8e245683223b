"""Env factories reach fresh worker processes, whatever module they live in."""
import importlib.util
import sys
import textwrap
import types

import pytest
from mlagents.trainers.exception import TrainerConfigError

from mlagents_plugin.core import factories
from mlagents_plugin.core.settings import parse_section
from mlagents_plugin.integration import python_envs
from mlagents_plugin.testing import raising_factory

SOURCE = textwrap.dedent(
    """
    from mlagents_plugin.testing import SimpleEnvironment

    def make(worker_id, side_channels, num_agents=1):
        return SimpleEnvironment(worker_id, side_channels, num_agents=num_agents)
    """
)


@pytest.fixture
def module_off_sys_path(tmp_path):
    """A module loaded from a file that is not on sys.path, as pytest's importlib mode does."""
    path = tmp_path / "envs_only_the_trainer_has.py"
    path.write_text(SOURCE)
    spec = importlib.util.spec_from_file_location("envs_only_the_trainer_has", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


@pytest.fixture
def module_in_memory():
    module = types.ModuleType("envs_built_at_run_time")
    exec(SOURCE, module.__dict__)
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("start_method", ["spawn", "forkserver", "fork"])
@pytest.mark.parametrize("which", ["module_off_sys_path", "module_in_memory"])
def test_factory_from_a_module_a_fresh_process_cannot_import(
    request, env_manager_factory, start_method, which
):
    module = request.getfixturevalue(which)
    factory = python_envs.make_env_factory(f"{module.__name__}:make", {"num_agents": 3})
    manager = env_manager_factory(factory, 2, start_method=start_method)
    manager.reset()
    steps = manager.first_step_infos
    assert len(steps) == 2
    assert all(len(step.current_all_step_result["Simple"][0]) == 3 for step in steps)


@pytest.mark.fast
def test_importable_factories_are_pickled_by_reference():
    factory = python_envs.make_env_factory("mlagents_plugin.testing:simple_env", {})
    assert b"mlagents_plugin.testing.simple_env" in factories.dumps_factory(factory)


class ScriptError(Exception):
    """An exception type of a module other machines cannot import (this test module)."""


@pytest.mark.fast
def test_what_a_closure_holds_is_shipped_to_other_machines_by_value():
    factory = raising_factory(ScriptError, "no env")  # a closure over ScriptError
    assert __name__ in factories.modules_to_load(factories.dumps_factory(factory))  # by reference
    assert __name__ not in factories.modules_to_load(factories.dumps_factory(factory, other_machines=True))


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("no_such_module_anywhere:make", "there is no module 'no_such_module_anywhere'"),
        ("mlagents_plugin.testing:no_such_factory", "has no 'no_such_factory'"),
        ("mlagents_plugin.testing:__all__", "'__all__' is a list, not a function or class"),
        (
            "broken_syntax_env:make",
            r"importing 'broken_syntax_env' failed: SyntaxError at .*broken_syntax_env.py, line 2",
        ),
        (
            "raising_env:make",
            r"importing 'raising_env' failed: RuntimeError: no GPU here \(at .*raising_env.py, line 3\)",
        ),
    ],
)
@pytest.mark.fast
def test_bad_env_spec_is_explained(spec, expected, tmp_path, monkeypatch):
    (tmp_path / "broken_syntax_env.py").write_text("def make(worker_id, side_channels):\n    return (\n")
    (tmp_path / "raising_env.py").write_text("import os\n\nraise RuntimeError('no GPU here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TrainerConfigError, match=expected) as info:
        python_envs.resolve(spec)
    assert info.value.__cause__ is None  # the message says it all: no raw traceback chained


@pytest.mark.fast
@pytest.mark.parametrize("spec", [":", "module:", ":factory", "a:b:c", "no_colon"])
def test_env_spec_must_name_a_module_and_a_factory(spec):
    with pytest.raises(TrainerConfigError, match="env_manager.env: expected 'package.module:factory'"):
        parse_section({"env": spec})
