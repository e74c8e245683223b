"""Batched inference (core/batching.py): one forward pass for every ready worker gives each worker
what a call of its own would have given. Process-free: real policies, real envs, in this process;
the manager's side on the fake backend (tests/fake_backend.py)."""
import contextlib
import copy
from typing import Iterator, List, Tuple

import numpy as np
import pytest
from fake_backend import Behavior, FakeBackend, FakeClock
from mlagents.trainers.action_info import ActionInfo
from mlagents.trainers.policy.torch_policy import TorchPolicy
from mlagents.trainers.settings import NetworkSettings, RunOptions
from mlagents.trainers.torch_entities.networks import SimpleActor
from mlagents_envs.base_env import DecisionSteps

from mlagents_plugin.core import batching
from mlagents_plugin.core.lifecycle import WorkerState
from mlagents_plugin.core.manager import SupervisedManagerBase
from mlagents_plugin.core.protocol import EnvironmentCommand
from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.testing import SimpleEnvironment, make_factory

pytestmark = pytest.mark.fast

AGENTS = [1, 3, 0, 2]  # agents per worker; worker 2 has none this step
LSTM = NetworkSettings.MemorySettings(memory_size=16, sequence_length=4)
CASES = {
    "discrete": dict(action="discrete"),
    "continuous": dict(action="continuous"),
    "hybrid": dict(action="hybrid"),
    "visual": dict(action="discrete", visual_shape=(3, 20, 20)),
    "lstm": dict(action="hybrid", memory=LSTM),
    "masks": dict(action="discrete", masks=True),
}


def make_policy(spec, deterministic: bool, memory=None) -> TorchPolicy:
    settings = NetworkSettings(num_layers=2, hidden_units=16, deterministic=deterministic, memory=memory)
    return TorchPolicy(0, spec, settings, SimpleActor, {"conditional_sigma": False, "tanh_squash": False})


class CustomPolicy(TorchPolicy):
    """Overrides get_action (with what it does already): never batched, never early."""

    def get_action(self, decision_requests, worker_id=0):
        return super().get_action(decision_requests, worker_id)


def twin(policy: TorchPolicy) -> TorchPolicy:
    """The same network, weights and memories: one for batched calls, one for per-worker calls."""
    other = make_policy(policy.behavior_spec, policy.network_settings.deterministic, policy.network_settings.memory)
    other.actor.load_state_dict(policy.actor.state_dict())
    other.memory_dict = copy.deepcopy(policy.memory_dict)
    return other


def with_masks(steps: DecisionSteps, rng) -> DecisionSteps:
    """The same steps, each agent forbidden one of its two moves at random."""
    forbidden = rng.integers(0, 2, size=len(steps))
    mask = np.zeros((len(steps), 2), dtype=bool)
    mask[np.arange(len(steps)), forbidden] = True
    return DecisionSteps(steps.obs, steps.reward, steps.agent_id, [mask], steps.group_id, steps.group_reward)


def worker_requests(envs, rng, masks: bool):
    requests = []
    for worker_id, env in enumerate(envs):
        steps = env.get_steps("Simple")[0]
        requests.append((worker_id, with_masks(steps, rng) if masks else steps))
    return requests


def assert_same(batched: ActionInfo, alone: ActionInfo, exact_discrete: bool) -> None:
    assert batched.agent_ids == alone.agent_ids
    assert batched.outputs.keys() == alone.outputs.keys()
    for key, expected in alone.outputs.items():
        got = batched.outputs[key]
        assert type(got) is type(expected), key
        pairs = (
            [(got.continuous, expected.continuous), (got.discrete, expected.discrete)]
            if hasattr(expected, "continuous")
            else [(got, expected)]
        )
        for a, b in pairs:
            assert a.shape == b.shape and a.dtype == b.dtype, key
            if exact_discrete and a.dtype.kind == "i":
                np.testing.assert_array_equal(a, b, err_msg=key)
            else:  # one matrix product for all rows may round differently in the last bit
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("case", CASES)
def test_a_deterministic_policy_gives_each_worker_what_its_own_call_gives(case):
    options = dict(CASES[case])
    memory, masks = options.pop("memory", None), options.pop("masks", False)
    envs = [SimpleEnvironment(worker_id=w, num_agents=n, **options) for w, n in enumerate(AGENTS)]
    policy = make_policy(envs[0].behavior_specs["Simple"], deterministic=True, memory=memory)
    alone_policy = twin(policy)
    rng = np.random.default_rng(0)
    for _ in range(6):  # several rounds: recurrent memories carry over from one to the next
        requests = worker_requests(envs, rng, masks)
        batched = batching.get_actions(policy, requests)
        alone = [alone_policy.get_action(steps, worker_id) for worker_id, steps in requests]
        for b, a in zip(batched, alone, strict=True):
            assert_same(b, a, exact_discrete=True)
        assert batched[2] == ActionInfo.empty()  # no agents: what get_action gives
        if masks:
            for (_, steps), info in zip(requests, batched, strict=True):
                if len(steps):  # a forbidden move is never chosen
                    chosen = info.env_action.discrete[:, 0]
                    assert not steps.action_mask[0][np.arange(len(steps)), chosen].any()
        if memory is not None:
            assert policy.memory_dict.keys() == alone_policy.memory_dict.keys()
            for agent, saved in alone_policy.memory_dict.items():
                np.testing.assert_allclose(policy.memory_dict[agent], saved, rtol=1e-5, atol=1e-6)
        for env, info in zip(envs, batched, strict=True):
            if info.agent_ids:
                env.set_actions("Simple", info.env_action)
            env.step()


@pytest.mark.parametrize("case", ["discrete", "hybrid", "lstm"])
def test_a_stochastic_policy_gives_each_worker_outputs_of_the_same_shape(case):
    options = dict(CASES[case])
    memory = options.pop("memory", None)
    envs = [SimpleEnvironment(worker_id=w, num_agents=n, **options) for w, n in enumerate(AGENTS)]
    policy = make_policy(envs[0].behavior_specs["Simple"], deterministic=False, memory=memory)
    requests = worker_requests(envs, np.random.default_rng(0), masks=False)
    batched = batching.get_actions(policy, requests)
    alone = [twin(policy).get_action(steps, worker_id) for worker_id, steps in requests]
    for b, a in zip(batched, alone, strict=True):
        assert b.agent_ids == a.agent_ids and b.outputs.keys() == a.outputs.keys()
        for key in a.outputs:
            if hasattr(a.outputs[key], "continuous"):
                assert b.outputs[key].continuous.shape == a.outputs[key].continuous.shape
                assert b.outputs[key].discrete.shape == a.outputs[key].discrete.shape
            else:
                assert b.outputs[key].shape == a.outputs[key].shape


def test_only_ml_agents_own_get_action_is_batched():
    spec = SimpleEnvironment().behavior_specs["Simple"]
    assert batching.batchable(make_policy(spec, deterministic=True))
    custom = CustomPolicy(0, spec, NetworkSettings(), SimpleActor, {"conditional_sigma": False, "tanh_squash": False})
    assert not batching.batchable(custom)


# ----------------------------------------------------------------- through the manager


class CountingPolicy:
    """Counts a TorchPolicy's forward passes; each takes ``pass_s`` of the fake clock."""

    def __init__(self, policy: TorchPolicy, clock: FakeClock, pass_s: float = 0.0):
        self.calls = 0
        evaluate = policy.evaluate

        def counted(*args, **kwargs):
            self.calls += 1
            clock.now += pass_s
            return evaluate(*args, **kwargs)

        policy.evaluate = counted


def fake_manager(script, n_env: int, clock: FakeClock, **settings) -> SupervisedManagerBase:
    return SupervisedManagerBase(
        make_factory(SimpleEnvironment, num_agents=2), RunOptions(), n_env,
        EnvManagerSettings(**settings), FakeBackend.of(script), clock,
    )


@contextlib.contextmanager
def passes_of_5_ms(script, n_env: int, **settings) -> Iterator[Tuple[SupervisedManagerBase, FakeClock]]:
    """A reset manager on the fake backend whose policy's forward passes take 5 ms; closed after."""
    clock = FakeClock()
    manager = fake_manager(script, n_env, clock, **settings)
    try:
        manager.reset()
        policy = make_policy(manager.training_behaviors["Simple"], deterministic=False)
        CountingPolicy(policy, clock, pass_s=0.005)
        manager.set_policy("Simple", policy)
        yield manager, clock
    finally:
        manager.close()


@pytest.mark.parametrize("batch_inference, evaluations_per_round", [(True, 1), (False, 4)])
def test_workers_ready_together_share_one_forward_pass(batch_inference, evaluations_per_round):
    clock = FakeClock()
    script = lambda worker_id, incarnation: Behavior(step_s=0.01)  # all four answer in the same wait
    manager = fake_manager(script, 4, clock, batch_inference=batch_inference)
    try:
        manager.reset()
        spec = manager.training_behaviors["Simple"]
        policy = make_policy(spec, deterministic=False)
        counter = CountingPolicy(policy, clock)
        manager.set_policy("Simple", policy)
        stepped = 0
        for _ in range(10):
            stepped += len(manager.get_steps())
        assert stepped == 40  # every round: all four workers
        # 11 rounds of actions: the last round's went out with its steps (NOTE [ Actions as steps land ])
        assert counter.calls == 11 * evaluations_per_round
    finally:
        manager.close()


@pytest.mark.parametrize("late_s, batches", [(0.004, [4] * 8), (1.0, [3] * 8)])
def test_workers_due_within_a_pass_are_waited_for(late_s, batches):
    """NOTE [ Gathering a batch ]: a pass takes 5 ms; worker 3's steps take ``late_s`` longer
    than the others' 10 ms. 4 ms later, it is waited for and one pass serves all four; 1 s
    later, it is not (it comes once a second, alone)."""
    script = lambda worker_id, incarnation: Behavior(step_s=0.01 + (late_s if worker_id == 3 else 0.0))
    with passes_of_5_ms(script, 4) as (manager, _):
        for _ in range(6):  # the workers report their step times, the trainer learns its pass's
            manager.get_steps()
        assert [len(manager.get_steps()) for _ in batches] == batches


def test_a_worker_overdue_by_more_than_a_pass_is_not_waited_for():
    """A worker that hangs is due in the first round after it stopped answering, and waited for
    once; from the next round on it is overdue, and the others' rounds are as short as before."""
    script = lambda worker_id, incarnation: Behavior(step_s=0.01, fault=("hang", 8) if worker_id == 2 else None)
    with passes_of_5_ms(script, 3, step_timeout_s=600) as (manager, clock):
        for _ in range(7):
            assert len(manager.get_steps()) == 3
        rounds = []
        for _ in range(6):
            before = clock.now
            rounds.append((len(manager.get_steps()), round(clock.now - before, 6)))
        # a round: 10 ms of steps, a 5 ms pass; the first without worker 2 waits 5 ms more for it
        assert rounds == [(2, 0.02)] + [(2, 0.015)] * 5


def test_a_worker_killed_while_the_manager_waits_for_another_is_not_returned():
    """Worker 0's step is in and the manager waits for worker 1, due within a pass (NOTE [ Gathering
    a batch ]); meanwhile worker 0 is killed and restarts, and its step is dropped. get_steps
    then waits on, as it does when nothing is in, and returns worker 0's new incarnation's
    first step, never an empty list."""
    script = lambda worker_id, incarnation: Behavior(
        step_s=0.01, fault=(("reply_then_killed", "hang")[worker_id], 8) if incarnation == 0 else None
    )
    with passes_of_5_ms(script, 2) as (manager, _):
        for _ in range(7):
            assert len(manager.get_steps()) == 2
        steps = manager.get_steps()
        assert [(s.worker_id, manager.workers[s.worker_id].incarnation) for s in steps] == [(0, 1)]
        assert manager.restart_counts == {"died": 1}


def sent_steps(manager: SupervisedManagerBase) -> List[int]:
    backend = manager.supervisor.backend
    assert isinstance(backend, FakeBackend)
    return [worker_id for worker_id, command, _ in backend.deliveries if command is EnvironmentCommand.STEP]


@pytest.mark.parametrize(
    "kind, early_actions, early",
    [("feedforward", True, True), ("feedforward", False, False), ("recurrent", True, False), ("custom", True, False)],
    ids=["feedforward", "early_actions-false", "recurrent", "custom-get_action"],
)
def test_actions_go_out_as_steps_land_except_for_recurrent_policies(kind, early_actions, early):
    """NOTE [ Actions as steps land ]: the workers whose steps get_steps returns are already
    stepping again, with the actions the policy gives those steps; the steps carry the actions
    that led to them. A recurrent policy, a custom get_action, or early_actions: false, keeps
    upstream's order."""
    clock = FakeClock()
    manager = fake_manager(lambda worker_id, incarnation: Behavior(step_s=0.01), 2, clock, early_actions=early_actions)
    try:
        manager.reset()
        spec = manager.training_behaviors["Simple"]
        if kind == "custom":
            settings = NetworkSettings(deterministic=True)
            policy = CustomPolicy(0, spec, settings, SimpleActor, {"conditional_sigma": False, "tanh_squash": False})
        else:
            policy = make_policy(spec, deterministic=True, memory=LSTM if kind == "recurrent" else None)
        manager.set_policy("Simple", policy)
        manager.get_steps()
        sent_before = {w.worker_id: manager.stepper.sent_actions(w.worker_id)["Simple"] for w in manager.workers}
        steps = manager.get_steps()
        assert sorted(s.worker_id for s in steps) == [0, 1]
        assert len(sent_steps(manager)) == (6 if early else 4)  # early: 2 rounds ahead of the trainer's 2
        assert all(slot.state is (WorkerState.BUSY if early else WorkerState.IDLE) for slot in manager.workers)
        for step in steps:  # the actions that led to the step: early, sent a round before
            sent_now = manager.stepper.sent_actions(step.worker_id)["Simple"]
            assert step.brain_name_to_action_info["Simple"] is (sent_before[step.worker_id] if early else sent_now)
        if early:  # what was sent answers the steps returned: what the policy gives them
            alone = twin(policy)
            for step in steps:
                sent = manager.stepper.sent_actions(step.worker_id)["Simple"]
                decision_steps = step.current_all_step_result["Simple"][0]
                expected = alone.get_action(decision_steps, step.worker_id)
                np.testing.assert_array_equal(sent.env_action.discrete, expected.env_action.discrete)
    finally:
        manager.close()


def test_a_behaviour_without_a_policy_yet_waits_for_the_trainer():
    """Its step is answered once the trainer has made the policy, at the next get_steps."""
    clock = FakeClock()
    manager = fake_manager(lambda worker_id, incarnation: Behavior(step_s=0.01), 2, clock)
    try:
        manager.reset()
        steps = manager.get_steps()  # the reset's steps, stepped without actions: no policy
        assert all(slot.state is WorkerState.IDLE for slot in manager.workers)
        assert len(steps) == 2 and sent_steps(manager) == [0, 1]
    finally:
        manager.close()
