"""A drop-in for upstream's SubprocessEnvManager: its contract where it is right, workers as
light and quick as its, and the habits of ML-Agents users (re-running a results folder)."""
import inspect
import os
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import yaml
from helpers import REPO, alive_after, free_port_block, learn_command, run_learn, write_config
from mlagents.trainers.learn import create_environment_factory
from mlagents_envs.exception import UnityEnvironmentException, UnityTimeOutException

from mlagents_plugin.core.errors import BuildNotFoundError
from mlagents_plugin.local.supervisor import SupervisedEnvManager
from mlagents_plugin.player.build import make_build
from mlagents_plugin.testing import UnexpectedExceptionEnvironment, make_factory


def slow_failing_factory(worker_id, side_channels):
    """Upstream's scenario: the env takes a moment, then fails, so the trainer is already
    waiting for the worker when the error comes."""
    time.sleep(0.5)
    raise UnityEnvironmentException("the build did not start")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_envs", [1, 4])
def test_reset_raises_the_error_of_a_worker_that_cannot_start(env_manager_factory, num_envs):
    manager = env_manager_factory(slow_failing_factory, num_envs)
    with pytest.raises(UnityEnvironmentException, match="the build did not start"):
        manager.reset()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_envs", [1, 4])
def test_reset_returns_one_step_per_worker_when_one_restarts_meanwhile(env_manager_factory, tmp_path, num_envs):
    factory = make_factory(
        UnexpectedExceptionEnvironment,
        exception_type=UnityTimeOutException,
        during="init",
        only_worker=num_envs - 1,
        once_file=str(tmp_path / "fired"),
    )
    manager = env_manager_factory(factory, num_envs)
    assert manager.reset() == num_envs
    assert (tmp_path / "fired").exists()
    assert sorted(step.worker_id for step in manager.first_step_infos) == list(range(num_envs))
    assert manager.restart_counts == {"unity": 1}


@pytest.mark.timeout(60)
def test_a_missing_build_fails_at_once_and_is_not_restarted(run_options, env_manager_factory, tmp_path):
    missing = str(tmp_path / "NoSuchBuild")
    run_options.env_settings.env_path = missing  # what mlagents-learn --env sets
    arguments = dict(env_path=missing, no_graphics=True, no_graphics_monitor=True, seed=0, num_areas=1,
                     timeout_wait=60, start_port=5005, env_args=[], log_folder=str(tmp_path))
    accepted = inspect.signature(create_environment_factory).parameters  # 1.0.0 has no no_graphics_monitor
    factory = create_environment_factory(**{k: v for k, v in arguments.items() if k in accepted})
    manager = env_manager_factory(factory, 2)
    started = time.monotonic()
    with pytest.raises(BuildNotFoundError, match="There is no Unity build at") as info:
        manager.reset()
    assert time.monotonic() - started < 10
    assert isinstance(info.value, UnityEnvironmentException)  # what upstream raises
    assert "Couldn't launch" in str(info.value.__cause__)  # mlagents-envs' own words, attached
    assert manager.restart_counts == {}


def test_an_env_factory_that_is_not_callable_is_refused_before_anything_starts(run_options):
    with pytest.raises(TypeError, match="env_factory must be callable"):
        SupervisedEnvManager("my_package.envs:make_env", run_options, 2)


# ---------------------------------------------------------------- what a worker weighs


def fork_server_workers(trainer_pid: int):
    """The env workers of a trainer that uses the fork server: the fork server's children."""
    for child in psutil.Process(trainer_pid).children():
        if "multiprocessing.forkserver" in " ".join(child.cmdline()):
            return child.children()
    return []


def maps_torch(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as maps:
        return "libtorch" in maps.read()


PPO_TRAINER = textwrap.dedent("""
    import os
    from mlagents.plugins.trainer_type import register_trainer_plugins
    from mlagents.trainers.settings import RunOptions, TrainerSettings
    from mlagents_plugin import EnvManagerSettings, SupervisedEnvManager
    from mlagents_plugin.testing import SimpleEnvironment, make_factory
    if __name__ == "__main__":
        register_trainer_plugins()
        run_options = RunOptions()
        run_options.behaviors["Simple"] = TrainerSettings(trainer_type="ppo")  # PPOSettings import torch
        settings = EnvManagerSettings(start_method="spawn")
        manager = SupervisedEnvManager(make_factory(SimpleEnvironment), run_options, 2, settings)
        manager.reset()
        print(os.getpid(), *manager.worker_pids.values(), flush=True)
        input()  # until the test has looked
        manager.close()
""")


@pytest.mark.timeout(60)
def test_workers_do_not_load_torch_although_the_run_options_name_ppo(tmp_path):
    """Workers get no trainer settings (NOTE [ Workers get no trainer settings ]). Spawned, so
    that a worker maps libtorch only if it imported torch: the default fork server of a script
    is a fork of the trainer, and its workers map the trainer's libtorch (NOTE [ A fork server
    forked from the trainer ])."""
    script = tmp_path / "trainer.py"
    script.write_text(PPO_TRAINER)
    trainer = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        trainer_pid, *workers = map(int, trainer.stdout.readline().split())
        assert len(workers) == 2 and not any(maps_torch(pid) for pid in workers)
        assert maps_torch(trainer_pid)  # the trainer does
        trainer.communicate("\n", timeout=30)
        assert trainer.returncode == 0
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()


SPAWNING_TRAINER = textwrap.dedent("""
    import torch_env  # beside this script: it imports torch
    from mlagents.trainers.settings import RunOptions
    from mlagents_plugin import EnvManagerSettings, SupervisedEnvManager
    if __name__ == "__main__":
        manager = SupervisedEnvManager(torch_env.make_env, RunOptions(), 2, EnvManagerSettings(start_method="spawn"))
        manager.reset()
        manager.close()
        print("closed", flush=True)
""")

TORCH_ENV_MODULE = textwrap.dedent("""
    import torch
    from mlagents_plugin.testing import SimpleEnvironment
    def make_env(worker_id, side_channels):
        return SimpleEnvironment(worker_id, side_channels)
""")


@pytest.mark.timeout(90)
def test_spawned_workers_of_a_torch_env_leave_without_a_word(tmp_path):
    """Issue 32: a spawned worker ran its interpreter's teardown, where torch's library
    finalizers print "Exception ignored ... 'NoneType' object is not callable" (about three
    per worker). It now leaves as a forked one does, by os._exit once it is done."""
    (tmp_path / "torch_env.py").write_text(TORCH_ENV_MODULE)
    (tmp_path / "trainer.py").write_text(SPAWNING_TRAINER)
    run = subprocess.run(
        [sys.executable, str(tmp_path / "trainer.py")], cwd=tmp_path, capture_output=True, text=True, timeout=80
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("closed"), run.stderr[-3000:]
    assert "Exception ignored" not in run.stderr and "Traceback" not in run.stderr, run.stderr[-3000:]


@pytest.fixture(scope="module")
def goal_build(tmp_path_factory):
    directory = tmp_path_factory.mktemp("builds")
    make_build(str(directory), "goal")
    return directory / "goal"


@pytest.mark.e2e
@pytest.mark.timeout(300)
@pytest.mark.parametrize("env", ["python", "build"])
def test_under_mlagents_learn_no_worker_loads_torch(tmp_path, goal_build, env):
    def edit(config):
        config["behaviors"]["Goal" if env == "build" else "Simple"]["max_steps"] = 10**7

    if env == "build":
        config = write_config(tmp_path, "goal_player.yaml", edit)
        args = [f"--env={goal_build}", f"--base-port={free_port_block(10)}"]
    else:
        config = write_config(tmp_path, "simple_python_env.yaml", edit)
        args = []
    trainer = subprocess.Popen(
        learn_command(config, "--num-envs=2", *args), cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    output = []
    try:
        for line in trainer.stdout:
            output.append(line)
            if "Step: " in line:
                break
        workers = fork_server_workers(trainer.pid)
        assert len(workers) == 2, "".join(output[-30:])
        assert not [w.pid for w in workers if maps_torch(w.pid)], "a worker mapped libtorch"
    finally:
        os.killpg(trainer.pid, 2)  # Ctrl-C
        output.append(trainer.communicate(timeout=60)[0])
    text = "".join(output)
    assert text.count("pkg_resources is deprecated") <= 1, "workers import ML-Agents' trainers"


# ------------------------------------------------------------- results folder re-runs


@pytest.mark.e2e
@pytest.mark.timeout(400)
@pytest.mark.parametrize("env", ["python", "build"])
def test_a_run_can_be_repeated_from_its_results_folder(tmp_path, goal_build, env):
    def edit(config):
        behaviors = config["behaviors"]
        behaviors[next(iter(behaviors))]["max_steps"] = 600
        config.setdefault("env_manager", {})["restart_backoff_s"] = 0.25

    if env == "build":
        config = write_config(tmp_path, "goal_player.yaml", edit)
        args = [f"--env={goal_build}", f"--base-port={free_port_block(10)}"]
    else:
        config = write_config(tmp_path, "simple_python_env.yaml", edit)
        args = []
    first = run_learn(tmp_path, config, "--num-envs=2", *args)
    assert first.returncode == 0, first.stdout[-3000:]
    saved = tmp_path / "results" / "run" / "configuration.yaml"
    section = yaml.safe_load(saved.read_text())["env_manager"]
    assert section["restart_backoff_s"] == 0.25
    again = subprocess.run(
        [learn_command(saved)[0], str(saved), "--run-id=again"],
        cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "restart_backoff_s=0.25" in again.stdout
    assert (tmp_path / "results" / "again" / "configuration.yaml").exists()


# ------------------------------------------------------------------- the test kit


def test_the_pytest_plugin_loads_without_ml_agents_trainers_or_torch():
    code = (
        "import sys, mlagents_plugin.testing.pytest_plugin, mlagents_plugin.testing\n"
        "heavy = [m for m in ('torch', 'mlagents.trainers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "from mlagents_plugin.testing import check_environment_trains, train\n"
        "assert 'torch' in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]


# A trainer forked into its fork server runs no native thread: no BLAS or OpenMP pool, which
# numpy's OpenBLAS starts at import on any machine of two cores or more (tests/test_fork_server.py).
ONE_NATIVE_THREAD = {"OMP_NUM_THREADS": "1"}

SCRIPT_BESIDE_ITS_ENV = textwrap.dedent("""
    import os, sys, threading
    from mlagents.trainers.settings import RunOptions
    from mlagents_plugin import EnvManagerSettings, SupervisedEnvManager
    import env_beside  # found through sys.path[0], this script's folder, as a user's own env module is
    def train():
        settings = EnvManagerSettings(start_method="forkserver")
        manager = SupervisedEnvManager(env_beside.make_env, RunOptions(), 3, settings)
        manager.reset({})
        print(" ".join(map(str, manager.worker_pids.values())), flush=True)
        manager.close()
    if __name__ == "__main__":
        if sys.argv[1] == "thread":
            trainer = threading.Thread(target=train)
            trainer.start()
            trainer.join()
        else:
            train()
""")

ENV_BESIDE = textwrap.dedent("""
    import os
    from mlagents_plugin.testing import SimpleEnvironment
    open(os.path.join(os.path.dirname(__file__), f"imported-by-{os.getpid()}"), "w").close()
    def make_env(worker_id, side_channels):
        return SimpleEnvironment(worker_id, side_channels)
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("trainer_thread", ["main", "thread"])
def test_an_env_module_found_on_the_trainers_sys_path_is_imported_once(tmp_path, trainer_thread):
    """From the main thread of a trainer that runs no native thread, the fork server is a fork of
    the trainer and has the module already
    (NOTE [ A fork server forked from the trainer ]). From another thread it is a fresh
    interpreter, and Python's fork server would ignore the sys.path it is given (NOTE [ The fork
    server's sys.path ]): an env module beside the user's script was imported again by every
    worker."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text(SCRIPT_BESIDE_ITS_ENV)
    (folder / "env_beside.py").write_text(ENV_BESIDE)
    run = subprocess.run(
        [sys.executable, str(folder / "train.py"), trainer_thread], cwd=tmp_path, capture_output=True, text=True,
        timeout=100, env={**os.environ, **ONE_NATIVE_THREAD},
    )
    assert run.returncode == 0, run.stderr
    workers = {int(pid) for pid in run.stdout.split()}
    importers = {int(path.name.rpartition("-")[2]) for path in folder.glob("imported-by-*")}
    assert len(workers) == 3 and not importers & workers, (importers, workers)
    # the trainer; from another thread, the fresh fork server too
    assert len(importers) == (1 if trainer_thread == "main" else 2)


FORKING_TRAINER = textwrap.dedent("""
    import inspect, os, socket, sys
    import torch  # as an env module's own imports would: a fork of the trainer has it already
    from mlagents.trainers.learn import create_environment_factory
    from mlagents.trainers.settings import RunOptions
    from mlagents_plugin import SupervisedEnvManager
    from mlagents_plugin.local import fork_server
    from mlagents_plugin.testing import make_factory
    if __name__ == "__main__":
        build, base_port = sys.argv[1], int(sys.argv[2])
        if build:  # by keyword: ML-Agents 1.0.0's has no no_graphics_monitor
            arguments = dict(env_path=build, no_graphics=True, seed=0, num_areas=1, timeout_wait=60,
                             start_port=base_port, env_args=[], log_folder=os.getcwd())
            if "no_graphics_monitor" in inspect.signature(create_environment_factory).parameters:
                arguments["no_graphics_monitor"] = True
            factory = create_environment_factory(**arguments)
        else:
            factory = make_factory()
        held = socket.create_server(("127.0.0.1", 0))  # the trainer's: no fork may keep it
        manager = SupervisedEnvManager(factory, RunOptions(), 2)
        manager.reset()
        port = held.getsockname()[1]
        held.close()  # before the test binds the port again
        print(fork_server.running_pid(), port, *manager.worker_pids.values(), flush=True)
        input()  # until the test has looked
        manager.close()
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("env", ["python", "build"])
def test_a_python_envs_fork_server_is_a_fork_of_the_trainer_that_keeps_none_of_its_descriptors(
    tmp_path, goal_build, env
):
    """NOTE [ A fork server forked from the trainer ]: a Python env's workers inherit what the
    trainer imported, as upstream's forked workers do; a build's fork server stays a fresh
    interpreter, so its workers stay free of the trainer's torch."""
    script = tmp_path / "trainer.py"
    script.write_text(FORKING_TRAINER)
    build = str(goal_build) if env == "build" else ""
    trainer = subprocess.Popen(
        [sys.executable, str(script), build, str(free_port_block(4))], cwd=tmp_path,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, **ONE_NATIVE_THREAD},
    )
    try:
        server, port, *workers = map(int, trainer.stdout.readline().split())
        assert len(workers) == 2 and psutil.Process(server).ppid() == trainer.pid
        assert {psutil.Process(pid).ppid() for pid in workers} == {server}
        forked = psutil.Process(server).cmdline() == psutil.Process(trainer.pid).cmdline()
        assert forked == (env == "python")
        assert all(maps_torch(pid) == forked for pid in [server, *workers])
        # the trainer closed its listening socket: had the server or a worker kept it, the port
        # would still be taken
        socket.create_server(("127.0.0.1", port)).close()
        trainer.kill()  # the fork server ends when its trainer does, and the workers with it
        trainer.wait()
        assert alive_after([server, *workers], 10.0) == []
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()


@pytest.mark.fast
def test_the_fork_server_gets_the_sys_path_the_import_system_uses(monkeypatch, tmp_path):
    """A pathlib.Path on sys.path (common) imports as its str; a bytes entry is skipped, as the
    import system skips it."""
    import json

    from mlagents_plugin.local import fork_server

    monkeypatch.setattr(sys, "path", [*sys.path, tmp_path, b"/bytes/entry"])
    with fork_server._sys_path_passed():
        passed = json.loads(os.environ[fork_server.TRAINER_ENV])
    assert passed["sys_path"][-1] == str(tmp_path) and "/bytes/entry" not in passed["sys_path"]
    assert fork_server.TRAINER_ENV not in os.environ
