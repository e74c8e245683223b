"""The step wire format and its shared memory (NOTE [ Step wire format ])."""
import os
import pickle
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest
from conftest import leftover_segments
from helpers import SPAWN_ONLY
from mlagents_envs.base_env import ActionTuple

from mlagents_plugin.core import protocol, wire
from mlagents_plugin.testing import SimpleEnvironment, make_factory

VISUAL = dict(num_agents=32, visual_shape=(3, 84, 84))
LISTS_DEV_SHM = pytest.mark.skipif(
    sys.platform != "linux", reason="lists shared memory segments in /dev/shm, a directory on Linux alone"
)


def steps_of(env):
    return {name: env.get_steps(name) for name in env.behavior_specs}


def assert_same(received, sent):
    assert received.keys() == sent.keys()
    for name in sent:
        for got, expected in zip(received[name], sent[name], strict=True):
            assert type(got) is type(expected)
            assert len(got.obs) == len(expected.obs)
            for a, b in zip(got.obs, expected.obs, strict=True):
                np.testing.assert_array_equal(a, b)
            for field in ("reward", "agent_id", "group_id", "group_reward"):
                np.testing.assert_array_equal(np.asarray(getattr(got, field)), np.asarray(getattr(expected, field)))


@pytest.mark.fast
def test_actions_arrive_as_sent_and_writable():
    """A STEP's actions travel as raw bytes (NOTE [ Packing messages ]): the worker gets the same
    values, dtypes and shapes, in arrays it may change in place, as unpickled ones."""
    actions = {
        "A": ActionTuple(np.arange(6, dtype=np.float32).reshape(2, 3), np.array([[1, 0], [2, 1]], np.int32)),
        "B": ActionTuple(np.zeros((0, 2), np.float32), np.zeros((0, 0), np.int32)),  # no agent asks
    }
    sent = protocol.EnvironmentRequest(protocol.EnvironmentCommand.STEP, 3, 7, actions)
    received = protocol.unpack_request(protocol.pack(sent))
    assert (received.cmd, received.worker_id, received.incarnation) == (protocol.EnvironmentCommand.STEP, 3, 7)
    assert received.payload.keys() == actions.keys()
    for name, action in actions.items():
        for got, expected in ((received.payload[name].continuous, action.continuous),
                              (received.payload[name].discrete, action.discrete)):
            assert got.dtype == expected.dtype and got.shape == expected.shape
            np.testing.assert_array_equal(got, expected)
            assert got.flags.writeable


@pytest.mark.fast
@pytest.mark.parametrize(
    "env_kwargs", [dict(num_agents=3), VISUAL, dict(behavior_names=("A", "B"), action="continuous")]
)
def test_round_trip_through_pickle(env_kwargs):
    env = SimpleEnvironment(**env_kwargs)
    env.step()
    encoder, decoder = wire.Encoder(f"{wire.SEGMENT_PREFIX}{os.getpid()}_test_"), wire.Decoder()
    try:
        for _ in range(3):
            env.step()
            sent = steps_of(env)
            received = decoder.decode(pickle.loads(pickle.dumps(encoder.encode(sent))))
            assert_same(received, sent)
            for decision, _terminal in received.values():
                assert all(o.flags.writeable for o in decision.obs)
    finally:
        decoder.close()
        encoder.close()


@LISTS_DEV_SHM
@pytest.mark.fast
def test_large_arrays_go_through_shared_memory_and_small_ones_do_not():
    env = SimpleEnvironment(**VISUAL)
    encoder = wire.Encoder(f"{wire.SEGMENT_PREFIX}{os.getpid()}_test_")
    try:
        encoded = encoder.encode(steps_of(env))
        assert encoded.segment is not None
        assert [shared for _, _, shared, _ in encoded.slots].count(True) == 1  # the camera
        assert len(encoded.buffer) < 4096
    finally:
        encoder.close()
    assert leftover_segments() == []


@pytest.mark.skipif(sys.platform == "win32", reason="the name shm_open refuses (a '/' in it) names a "
                    "shared memory mapping on Windows")
@pytest.mark.fast
def test_without_shared_memory_everything_goes_through_the_pipe():
    env = SimpleEnvironment(**VISUAL)
    encoder, decoder = wire.Encoder("bad/name/"), wire.Decoder()  # shm_open refuses a '/'
    sent = steps_of(env)
    encoded = encoder.encode(sent)
    assert encoded.segment is None and encoder.shared_memory_failed
    assert_same(decoder.decode(pickle.loads(pickle.dumps(encoded))), sent)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "start_method", [pytest.param("forkserver", marks=SPAWN_ONLY), "spawn", pytest.param("fork", marks=SPAWN_ONLY)]
)
def test_camera_observations_arrive_intact(env_manager_factory, start_method):
    manager = env_manager_factory(make_factory(SimpleEnvironment, **VISUAL), 2, start_method=start_method)
    manager.reset()
    for step in manager.first_step_infos:
        local = SimpleEnvironment(step.worker_id, **VISUAL)  # same seed: the same observations
        local.reset()  # as the worker's env was: built (which resets), then reset
        assert_same(step.current_all_step_result, steps_of(local))
    for _ in range(20):
        manager.get_steps()


@LISTS_DEV_SHM
@pytest.mark.timeout(60)
def test_a_killed_workers_segment_is_removed(env_manager_factory):
    manager = env_manager_factory(make_factory(SimpleEnvironment, **VISUAL), 2, restart_backoff_s=0.0)
    manager.reset()
    manager.get_steps()
    assert len(leftover_segments()) == 2
    psutil.Process(manager.worker_pids[1]).kill()
    while not manager.restart_counts:
        manager.get_steps()
    # Once the restarted worker has sent a step, its segment exists (steps from before the
    # restart were dropped with the dead worker).
    while 1 not in {step.worker_id for step in manager.get_steps()}:
        pass
    # Worker 1's segments: the new incarnation's, none of the dead one's. (Worker 0 is not
    # counted: it replaces its segment by a larger one when a step carries more, at any moment.)
    incarnations = [name.split("_")[-2] for name in leftover_segments() if name.split("_")[-3] == "1"]
    assert incarnations == ["1"]
    manager.close()
    assert leftover_segments() == []


@LISTS_DEV_SHM
@pytest.mark.timeout(60)
def test_segments_of_a_killed_trainer_are_removed(tmp_path):
    script = tmp_path / "trainer.py"
    script.write_text(
        textwrap.dedent("""
        from mlagents.trainers.settings import RunOptions
        from mlagents_plugin import SupervisedEnvManager
        from mlagents_plugin.testing import SimpleEnvironment, make_factory
        if __name__ == "__main__":
            factory = make_factory(SimpleEnvironment, num_agents=32, visual_shape=(3, 84, 84))
            manager = SupervisedEnvManager(factory, RunOptions(), 2)
            manager.reset()
            manager.get_steps()
            print("STEPPING", flush=True)
            while True:
                manager.get_steps()
    """)
    )
    trainer = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    prefix = f"{wire.SEGMENT_PREFIX}{trainer.pid}_"
    try:
        while trainer.stdout.readline().strip() != "STEPPING":
            pass
        assert [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
        trainer.kill()
        trainer.wait()
        deadline = time.monotonic() + 5  # the trainer's reaper removes them (NOTE [ No orphans ])
        while [n for n in os.listdir("/dev/shm") if n.startswith(prefix)] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [n for n in os.listdir("/dev/shm") if n.startswith(prefix)] == []
    finally:
        trainer.kill()
        trainer.wait()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("end", ["close", "kill a worker, then close"])  # SIGKILL; TerminateProcess on Windows
def test_the_resource_tracker_has_nothing_to_clean_up_at_exit(tmp_path, end):
    """Python's resource tracker warns at exit about segments it thinks leaked; it must find none,
    whether the workers removed their segments or the manager did for a killed worker."""
    script = tmp_path / "trainer.py"
    script.write_text(
        textwrap.dedent(f"""
        import psutil
        from mlagents.trainers.settings import RunOptions
        from mlagents_plugin import SupervisedEnvManager
        from mlagents_plugin.testing import SimpleEnvironment, make_factory
        if __name__ == "__main__":
            factory = make_factory(SimpleEnvironment, num_agents=32, visual_shape=(3, 84, 84))
            manager = SupervisedEnvManager(factory, RunOptions(), 4)
            manager.reset()
            for _ in range(300):
                manager.get_steps()
            if {end!r} != "close":
                psutil.Process(manager.worker_pids[1]).kill()
                for _ in range(50):
                    manager.get_steps()
            manager.close()
    """)
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=110)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resource_tracker" not in result.stderr, result.stderr[-3000:]
