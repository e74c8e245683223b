"""Health numbers of the env workers: restarts by cause, deaths, hangs, step latency.

They reach TensorBoard and the console through ML-Agents' own path for environment stats: the
manager adds them to the ``environment_stats`` of a step it returns, and ML-Agents' AgentManager
hands them to the trainer's StatsReporter, under ``Environment/Env Workers/...``. Latency is
aggregated here and sent about once a second, not per step.
"""
import collections
import time
from typing import Callable, Dict, List, Tuple

from mlagents_envs.side_channel.stats_side_channel import StatsAggregationMethod

from mlagents_plugin.core.restart import Cause

PREFIX = "Environment/Env Workers"
REPORT_INTERVAL_S = 1.0

StatList = List[Tuple[float, StatsAggregationMethod]]


class WorkerHealth:
    def __init__(self) -> None:
        self.steps = 0
        self.latency_total_s = 0.0
        self.interval_latency_s = 0.0
        self.interval_steps = 0
        self.failures: "collections.Counter[Cause]" = collections.Counter()
        self.restarts: "collections.Counter[Cause]" = collections.Counter()
        self.port_moves = 0

    @property
    def mean_latency_ms(self) -> float:
        """Only meaningful once the worker has stepped."""
        return 1000 * self.latency_total_s / max(self.steps, 1)


class HealthStats:
    def __init__(self, n_env: int, clock: Callable[[], float] = time.monotonic):
        self.workers = [WorkerHealth() for _ in range(n_env)]
        self._events: Dict[str, StatList] = collections.defaultdict(list)
        self._clock = clock
        self._last_report = clock()

    def stepped(self, worker_id: int, latency_s: float) -> None:
        health = self.workers[worker_id]
        health.steps += 1
        health.latency_total_s += latency_s
        health.interval_latency_s += latency_s
        health.interval_steps += 1

    def failed(self, worker_id: int, cause: Cause, restarted: bool) -> None:
        health = self.workers[worker_id]
        health.failures[cause] += 1
        if cause is Cause.DIED:
            self._event("Deaths")
        elif cause is Cause.HUNG:
            self._event("Hangs")
        if restarted:
            health.restarts[cause] += 1
            self._event(f"Restarts/{cause.value}")

    def moved_port(self, worker_id: int) -> None:
        self.workers[worker_id].port_moves += 1
        self._event("Port Moves")

    def due(self) -> Dict[str, StatList]:
        """Stats to attach to the next step: events as they happen, latency once a second."""
        now = self._clock()
        if not self._events and now - self._last_report < REPORT_INTERVAL_S:
            return {}
        stats, self._events = dict(self._events), collections.defaultdict(list)
        if now - self._last_report >= REPORT_INTERVAL_S:
            self._last_report = now
            for worker_id, health in enumerate(self.workers):
                if health.interval_steps:
                    mean_ms = 1000 * health.interval_latency_s / health.interval_steps
                    stats[f"{PREFIX}/Step Latency (ms)/worker {worker_id}"] = [
                        (mean_ms, StatsAggregationMethod.AVERAGE)
                    ]
                    health.interval_latency_s, health.interval_steps = 0.0, 0
        return stats

    def summary(self, worker_id: int) -> str:
        health = self.workers[worker_id]
        restarts = ", ".join(f"{c.value} {n}" for c, n in sorted(health.restarts.items(), key=_by_value))
        text = f"{health.steps} steps"
        if health.steps:
            text += f", mean step latency {health.mean_latency_ms:.2f} ms"
        text += f", restarts: {restarts or 'none'}"
        if health.port_moves:
            text += f", moved to another port {health.port_moves} time(s)"
        return text

    def _event(self, name: str) -> None:
        self._events[f"{PREFIX}/{name}"].append((1.0, StatsAggregationMethod.SUM))


def _by_value(item: Tuple[Cause, int]) -> str:
    return item[0].value
