"""Env managers driven as ML-Agents' TrainerController drives them, side by side with the bare pipe.

Each manager gets, per behaviour, ML-Agents' TorchPolicy (PPO's actor, as ``network_settings``
of the training harness: one layer of 32) and an AgentManager; the loop is TrainerController's
``advance`` without the trainer's update: ``get_steps`` (the policy picks every idle worker's
actions, which are sent), ``process_steps`` (the experiences go into the AgentManager, which
builds trajectories), and the trajectories are taken off its queue and dropped.

- ``ours``: SupervisedEnvManager (batched inference: one forward pass for every idle worker);
- ``ours per worker``: the same with ``batch_inference: false`` (one pass per worker, as upstream);
- ``upstream``: ML-Agents' SubprocessEnvManager;
- ``bare pipe``: the floor, steppers.py's ``BarePipeEnvManager`` (the ``throughput`` section's
  too): a forked worker and a bare pipe each, arrays each way, the policy called per worker.

Two figures per case: the steady state (alternating slices after a warm-up: env steps/s and
the trainer's CPU per env step) and the whole run (construction, first reset, ``WHOLE_RUN_STEPS``
env steps per worker, close: seconds of wall time, median of alternating rounds).
"""
import statistics
import time
from typing import Callable, Dict, List, Tuple

from harness import Scenario, side_by_side
from mlagents.trainers.agent_processor import AgentManager, AgentManagerQueue
from mlagents.trainers.env_manager import EnvManager
from mlagents.trainers.policy.torch_policy import TorchPolicy
from mlagents.trainers.settings import NetworkSettings, RunOptions
from mlagents.trainers.stats import StatsReporter
from mlagents.trainers.subprocess_env_manager import SubprocessEnvManager
from mlagents.trainers.torch_entities.networks import SimpleActor
from steppers import BARE_PIPE, BarePipeEnvManager, Factory, ManagerStepper, Stepper, agent_steps

from mlagents_plugin.core.settings import EnvManagerSettings
from mlagents_plugin.local.supervisor import SupervisedEnvManager
from mlagents_plugin.testing import SimpleEnvironment, make_factory

MANAGERS = ("ours", "ours per worker", "upstream", BARE_PIPE)
TIME_HORIZON = 64  # the AgentManager's trajectory length, as the harness's PPO configuration
WHOLE_RUN_STEPS = 200  # env steps per worker in a whole run

SCENARIOS = [
    Scenario("cheap, 1 agent", dict(num_agents=1), (1, 4, 8)),
    Scenario("cheap, 8 agents", dict(num_agents=8), (8,)),
    Scenario("1 ms CPU + 2 ms sleep, 1 agent", dict(step_cpu_s=0.001, step_sleep_s=0.002), (4,)),
]
QUICK = [Scenario("cheap, 1 agent", dict(num_agents=1), (2,))]


class TrainerLoop(ManagerStepper):
    """TrainerController's ``advance`` around one env manager, its trainers never updating."""

    def _start(self) -> None:
        super()._start()
        manager = self.manager
        self.queues: List[AgentManagerQueue] = []
        for behavior, spec in manager.training_behaviors.items():
            policy = TorchPolicy(
                0, spec, NetworkSettings(num_layers=1, hidden_units=32), SimpleActor,
                {"conditional_sigma": False, "tanh_squash": False},
            )
            agents = AgentManager(policy, behavior, StatsReporter(behavior), TIME_HORIZON, threaded=False)
            manager.set_agent_manager(behavior, agents)
            manager.set_policy(behavior, policy)
            self.queues.append(agents.trajectory_queue)

    def step(self) -> Tuple[int, int]:
        steps = self.manager.get_steps()
        self.manager.process_steps(steps)
        for queue in self.queues:  # what a trainer takes, dropped
            while not queue.empty():
                queue.get_nowait()
        return len(steps), agent_steps(steps)


def _managers(factory: Factory, n_env: int) -> Dict[str, Callable[[], EnvManager]]:
    return {
        "ours": lambda: SupervisedEnvManager(factory, RunOptions(), n_env, EnvManagerSettings()),
        "ours per worker": lambda: SupervisedEnvManager(
            factory, RunOptions(), n_env, EnvManagerSettings(batch_inference=False)
        ),
        "upstream": lambda: SubprocessEnvManager(factory, RunOptions(), n_env),
        BARE_PIPE: lambda: BarePipeEnvManager(factory, n_env),
    }


def _loops(factory: Factory, n_env: int) -> List[Callable[[], Stepper]]:
    return [lambda m=make, n=name: TrainerLoop(n, m()) for name, make in _managers(factory, n_env).items()]


def whole_run(make: Callable[[], EnvManager], name: str, n_env: int) -> float:
    """Seconds from construction to the end of close, ``WHOLE_RUN_STEPS`` env steps per worker."""
    start = time.perf_counter()
    loop = TrainerLoop(name, make())
    try:
        stepped = 0
        while stepped < WHOLE_RUN_STEPS * n_env:
            stepped += loop.step()[0]
    finally:
        loop.close()
    return time.perf_counter() - start


def run(quick: bool) -> List[Dict]:
    scenarios = QUICK if quick else SCENARIOS
    rows = side_by_side(scenarios, _loops, (1, 0.3, 0.2) if quick else (3, 2.0, 0.5), _line)
    rounds = 1 if quick else 3
    cases = [(scenario, n_env) for scenario in scenarios for n_env in scenario.workers]
    for row, (scenario, n_env) in zip(rows, cases, strict=True):
        factory = make_factory(SimpleEnvironment, **scenario.env)
        times: Dict[str, List[float]] = {name: [] for name in MANAGERS}
        for _ in range(rounds):  # alternating, as the steady state
            for name, make in _managers(factory, n_env).items():
                times[name].append(whole_run(make, name, n_env))
        for name, seconds in times.items():
            row["results"][name]["whole_run_s"] = statistics.median(seconds)
        print("  whole run: " + "  ".join(f"{n} {statistics.median(s):.2f}s" for n, s in times.items()), flush=True)
    return rows


def _line(row: Dict) -> str:
    parts = [f"{row['scenario']}, {row['workers']} worker(s):"]
    for name, r in row["results"].items():
        parts.append(f"{name} {r['env_steps_per_s']:.0f}/s {r['trainer_cpu_us_per_env_step']:.0f}us")
    return "  ".join(parts)


def markdown(rows: List[Dict]) -> str:
    out = [
        "| Scenario | Workers | env steps/s: ours / ours per worker / upstream / bare pipe | ours / bare pipe "
        "| ours per worker / bare pipe | ours / upstream | trainer CPU µs per env step: ours / per worker / "
        "upstream / bare | whole run s: ours / per worker / upstream / bare |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        r = [row["results"][name] for name in MANAGERS]
        ours, per_worker, up, bare = (x["env_steps_per_s"] for x in r)
        out.append(
            f"| {row['scenario']} | {row['workers']} | {ours:.0f} / {per_worker:.0f} / {up:.0f} / {bare:.0f} "
            f"| {ours / bare:.2f} | {per_worker / bare:.2f} | {ours / up:.2f} "
            f"| {' / '.join(format(x['trainer_cpu_us_per_env_step'], '.0f') for x in r)} "
            f"| {' / '.join(format(x['whole_run_s'], '.2f') for x in r)} |"
        )
    return "\n".join(out)
