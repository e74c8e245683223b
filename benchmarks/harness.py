"""Run steppers in alternating slices and measure them, so that on a shared, noisy machine
every stepper sees the same noise; the ratios between them are what holds. And ``FirstLog``,
the fault benchmarks' clock on a log line."""
import logging
import statistics
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

from steppers import Factory, Stepper

from mlagents_plugin.testing import SimpleEnvironment, make_factory


class Scenario(NamedTuple):
    name: str
    env: Dict  # SimpleEnvironment's keyword arguments
    workers: Tuple[int, ...]


def side_by_side(
    scenarios: List[Scenario],
    makers: Callable[[Factory, int], List[Callable[[], Stepper]]],
    timing: Tuple[int, float, float],
    describe: Callable[[Dict], str],
) -> List[Dict]:
    """For each scenario and worker count: build the steppers ``makers`` gives, ``interleave``
    them with ``timing`` (slices, slice_s, warmup_s), close them whatever happens."""
    rows = []
    for scenario in scenarios:
        for n_env in scenario.workers:
            steppers: List[Stepper] = []
            try:
                for make in makers(make_factory(SimpleEnvironment, **scenario.env), n_env):
                    steppers.append(make())
                results = interleave(steppers, *timing)
            finally:
                for stepper in steppers:
                    stepper.close()
            rows.append({"scenario": scenario.name, "workers": n_env, "results": results})
            print(describe(rows[-1]), flush=True)
    return rows


class Totals:
    def __init__(self) -> None:
        self.env_steps = 0
        self.agent_steps = 0
        self.cpu_s = 0.0
        self.wall_s = 0.0
        self.latencies: List[float] = []

    def as_dict(self) -> Dict[str, float]:
        lat = sorted(self.latencies) or [float("nan")]
        return {
            "env_steps_per_s": self.env_steps / self.wall_s,
            "agent_steps_per_s": self.agent_steps / self.wall_s,
            "trainer_cores": self.cpu_s / self.wall_s,
            "trainer_cpu_us_per_env_step": 1e6 * self.cpu_s / max(self.env_steps, 1),
            "get_steps_p50_ms": 1000 * statistics.median(lat),
            "get_steps_p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        }


def measure(stepper: Stepper, seconds: float, totals: Totals) -> None:
    cpu0, wall0 = time.process_time(), time.perf_counter()
    now = wall0
    while now - wall0 < seconds:
        env_steps, agent_steps = stepper.step()
        after = time.perf_counter()
        totals.latencies.append(after - now)
        totals.env_steps += env_steps
        totals.agent_steps += agent_steps
        now = after
    totals.cpu_s += time.process_time() - cpu0
    totals.wall_s += now - wall0


def interleave(steppers: List[Stepper], slices: int, slice_s: float, warmup_s: float) -> Dict[str, Dict[str, float]]:
    totals = {s.name: Totals() for s in steppers}
    for stepper in steppers:
        measure(stepper, warmup_s, Totals())
    for _ in range(slices):
        for stepper in steppers:
            measure(stepper, slice_s, totals[stepper.name])
    return {name: t.as_dict() for name, t in totals.items()}


class FirstLog(logging.Handler):
    """When (``time.perf_counter``) a log record containing ``text`` was first seen; None before."""

    def __init__(self, text: str):
        super().__init__()
        self.text = text
        self.at: Optional[float] = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.at is None and self.text in record.getMessage():
            self.at = time.perf_counter()
