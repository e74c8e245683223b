"""The restart policy: which failures a worker is restarted after, and how often.

Quotas are ML-Agents' own ``env_settings`` (``--max-lifetime-restarts``,
``--restarts-rate-limit-n``, ``--restarts-rate-limit-period-s``), counted per worker, with
upstream's meaning: -1 switches a limit off.
"""
import datetime
import time
from collections import defaultdict
from typing import Dict, List, NamedTuple

from mlagents.trainers.settings import EnvironmentSettings
from mlagents_envs.exception import (
    UnityCommunicationException,
    UnityCommunicatorStoppedException,
    UnityEnvironmentException,
    UnityTimeOutException,
)

from mlagents_plugin.errors import EnvWorkerError

# The exceptions upstream's SubprocessEnvManager restarts a worker after.
UNITY_RESTARTABLE = (
    UnityCommunicationException,
    UnityTimeOutException,
    UnityEnvironmentException,
    UnityCommunicatorStoppedException,
)


class RestartRecord(NamedTuple):
    monotonic: float
    wall: datetime.datetime
    cause: str


class RestartPolicy:
    def __init__(self, env_settings: EnvironmentSettings):
        self.max_lifetime_restarts = env_settings.max_lifetime_restarts
        self.rate_limit_n = env_settings.restarts_rate_limit_n
        self.rate_limit_period_s = env_settings.restarts_rate_limit_period_s
        self.history: Dict[int, List[RestartRecord]] = defaultdict(list)

    @staticmethod
    def is_restartable(exc: BaseException) -> bool:
        # A lost worker (died, hung) is not restarted yet: it surfaces as is.
        return isinstance(exc, UNITY_RESTARTABLE) and not isinstance(exc, EnvWorkerError)

    def has_quota(self, worker_id: int) -> bool:
        history = self.history[worker_id]
        lifetime_ok = (
            self.max_lifetime_restarts == -1 or len(history) < self.max_lifetime_restarts
        )
        since = time.monotonic() - self.rate_limit_period_s
        recent = sum(1 for record in history if record.monotonic > since)
        rate_ok = self.rate_limit_n == -1 or recent < self.rate_limit_n
        return lifetime_ok and rate_ok

    def record(self, worker_id: int, exc: BaseException) -> None:
        self.history[worker_id].append(
            RestartRecord(
                time.monotonic(), datetime.datetime.now(), f"{type(exc).__name__}: {exc}"
            )
        )

    def explain_refusal(self, worker_id: int) -> str:
        """Why ``worker_id`` gets no more restarts, with its restart history."""
        history = self.history[worker_id]
        limits = (
            f"max_lifetime_restarts={self.max_lifetime_restarts}, "
            f"restarts_rate_limit_n={self.rate_limit_n} per "
            f"restarts_rate_limit_period_s={self.rate_limit_period_s}"
        )
        if not history:
            past = "it was never restarted"
        else:
            past = "its restarts: " + "; ".join(
                f"{r.wall:%H:%M:%S} after {r.cause}" for r in history
            )
        return f"Env worker {worker_id} has no restarts left ({limits}); {past}."
