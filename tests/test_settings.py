"""The env_manager section: strict parsing, derived defaults, the entry point's choices."""
import subprocess
import sys

import pytest
from mlagents.trainers.exception import TrainerConfigError
from mlagents.trainers.settings import RunOptions
from mlagents.trainers.subprocess_env_manager import SubprocessEnvManager

from mlagents_plugin.core.settings import EnvManagerSettings, parse_section
from mlagents_plugin.integration import plugin
from mlagents_plugin.testing import SimpleEnvironment, make_factory


@pytest.mark.fast
def test_no_section_means_defaults():
    assert parse_section(None) == EnvManagerSettings()


@pytest.mark.fast
def test_ints_are_accepted_for_float_settings():
    assert parse_section({"shutdown_timeout_s": 3}).shutdown_timeout_s == 3.0


@pytest.mark.fast
def test_bools_are_not_numbers():
    with pytest.raises(TrainerConfigError, match="kill_grace_s"):
        parse_section({"kill_grace_s": True})


@pytest.mark.fast
def test_envs_per_worker_is_a_count_for_the_ray_backend():
    assert parse_section({"backend": "ray", "envs_per_worker": 8}).envs_per_worker == 8
    with pytest.raises(TrainerConfigError, match="'envs_per_worker: 2' is for the Ray backend"):
        parse_section({"envs_per_worker": 2})
    for wrong in (0, 257, True, 2.5):
        with pytest.raises(TrainerConfigError, match="envs_per_worker"):
            parse_section({"backend": "ray", "envs_per_worker": wrong})


@pytest.mark.fast
def test_env_must_name_a_factory():
    with pytest.raises(TrainerConfigError, match="package.module:factory"):
        parse_section({"env": "mlagents_plugin.testing.simple_env"})


@pytest.mark.fast
def test_timeouts_derive_from_timeout_wait():
    run_options = RunOptions()
    run_options.env_settings.timeout_wait = 20
    settings = EnvManagerSettings().resolved(run_options)
    assert settings.step_timeout_s == 30.0
    assert settings.startup_timeout_s == 50.0
    assert EnvManagerSettings(step_timeout_s=5).resolved(run_options).step_timeout_s == 5.0


@pytest.mark.timeout(60)
def test_disabled_gives_back_upstreams_manager(monkeypatch):
    run = plugin.Run(parse_section({"enabled": False}))
    manager = run.make_env_manager(make_factory(SimpleEnvironment), RunOptions(), 1)
    try:
        assert type(manager) is SubprocessEnvManager
    finally:
        manager.close()
        for worker in manager.env_workers:  # upstream's close() does not join its workers
            worker.process.join(timeout=10)


def test_asking_for_ray_without_ray_says_how_to_install_it():
    """Run where ``import ray`` fails, as in an install without the [ray] extra."""
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import mlagents_plugin\n"
        "try:\n"
        "    import mlagents_plugin.ray.manager\n"
        "except ImportError as e:\n"
        "    print(e)\n"
        "from mlagents_plugin.integration import plugin\n"
        "from mlagents_plugin.core.settings import EnvManagerSettings\n"
        "try:\n"
        "    plugin.env_manager_class(EnvManagerSettings(backend='ray'))\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert out.count("pip install ray==2.60.0") == 2, out
    assert "ConfigError env_manager.backend is 'ray'." in out


@pytest.mark.fast
def test_ray_section_is_parsed_strictly():
    settings = parse_section(
        {"backend": "ray", "ray": {"address": "auto", "num_cpus_per_worker": 2, "resources": {"unity": 1}}}
    )
    assert settings.ray.address == "auto" and settings.ray.num_cpus_per_worker == 2.0
    assert settings.ray.scheduling_strategy == "SPREAD"
    with pytest.raises(TrainerConfigError, match=r"env_manager.ray: unknown setting 'num_cpus'"):
        parse_section({"backend": "ray", "ray": {"num_cpus": 1}})
    # Ray's actor options refuse them, once Ray is up: refused here, before anything starts
    for reserved in ("CPU", "GPU", "memory", "object_store_memory", "bundle"):
        with pytest.raises(TrainerConfigError, match=r"env_manager.ray.resources: .*not Ray's own: CPU, GPU"):
            parse_section({"backend": "ray", "ray": {"resources": {reserved: 1}}})
    with pytest.raises(TrainerConfigError, match="env_manager.backend: expected one of subprocess, ray, got 'k8s'"):
        parse_section({"backend": "k8s"})


@pytest.mark.fast
def test_listen_takes_localhost_as_loopback_and_says_a_host_name_is_not_looked_up():
    """Issue 32: ``listen: localhost`` was refused, though it names what loopback binds."""
    assert parse_section({"listen": "localhost"}).listen == "loopback"
    assert parse_section({"listen": "LocalHost"}).as_dict()["listen"] == "loopback"
    with pytest.raises(TrainerConfigError, match="a host name is not looked up.*got 'trainer.example'"):
        parse_section({"listen": "trainer.example"})
