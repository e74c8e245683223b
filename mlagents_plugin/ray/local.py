"""A Ray that the project starts itself (no ``ray.address`` given; tests; benchmarks): loopback only.

# NOTE [ Ray on loopback ]
# Left to its defaults, a Ray head reaches out of the machine: its usage-stats module asks cloud
# metadata addresses (169.254.169.254, metadata.google.internal) which cloud it runs in, even with
# usage stats off, and may post a "usage disabled" report; and it rewrites 127.0.0.1 to the
# machine's outward address, found by "connecting" a UDP socket to 8.8.8.8. A Ray that we start
# ourselves therefore runs with the environment below, set before ``ray.init`` so that every Ray
# process inherits it: usage stats off and their report URL on a dead loopback port; HTTP(S)
# proxies on that dead port, so the metadata probes die at once on loopback; no rewriting of
# 127.0.0.1 (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, plus an explicit node address); token
# authentication with a token made for this run; no dashboard. Its temporary directory is short
# (Ray's socket paths must fit in 107 bytes) and ours, and is removed when Ray stops. The
# trainer gets its own proxy settings back once Ray runs, and the rest of its environment when
# Ray stops; Ray's processes, env workers included, keep the loopback environment.
# A cluster given by address is the user's: its settings are left alone (docs/ray.md).
"""
import contextlib
import logging
import os
import secrets
import shutil
import socket
import sys
import tempfile
from typing import Any, Callable, Dict, Iterator, List, Optional

from mlagents_plugin.core import platform
from mlagents_plugin.core.internals import Internal, verify
from mlagents_plugin.local import hardening, processes

LOOPBACK = "127.0.0.1"
_DEAD_PORT = "http://127.0.0.1:9"  # discard: nothing listens, so a connect is refused at once


# Ray's internals this module relies on (pinned ray==2.60.0), checked by ``check()``.
INTERNALS = [
    Internal("ray._private.ray_constants:ENABLE_RAY_CLUSTER", "reset when Ray was imported before prepare_environment"),
    Internal("ray._private.ray_constants:ENABLE_RAY_CLUSTERS_ENV_VAR", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER is read"),
    Internal("ray._raylet:Config.initialize", "re-reads Ray's configuration from the environment"),
    Internal("ray._raylet:AuthenticationTokenLoader.instance", "re-reads RAY_AUTH_TOKEN"),
    Internal("ray._raylet:AuthenticationTokenLoader.reset_cache", "re-reads RAY_AUTH_TOKEN"),
    Internal("ray._common.usage.usage_lib:_usage_stats_report_url", "its URL goes to a dead loopback port",
             "RAY_USAGE_STATS_REPORT_URL"),
    Internal("ray._private.worker:init", "private arguments: the node's address", "_node_ip_address"),
    Internal("ray._private.worker:init", "private arguments: a short temp dir", "_temp_dir"),
    Internal("ray.cluster_utils:Cluster", "the multi-node loopback cluster (tests, benchmarks)"),
]


def check() -> List[str]:
    """What of ``INTERNALS`` no longer matches the installed Ray (none when Ray is not installed)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return []
    return [f"Ray: {p}; the loopback Ray is not safe with this Ray (ray/local.py)." for p in verify(INTERNALS)]


def loopback_environment() -> Dict[str, str]:
    """The environment every Ray process the project starts runs with (NOTE [ Ray on loopback ])."""
    return {
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_USAGE_STATS_REPORT_URL": _DEAD_PORT + "/",
        "http_proxy": _DEAD_PORT,
        "https_proxy": _DEAD_PORT,
        "HTTP_PROXY": _DEAD_PORT,
        "HTTPS_PROXY": _DEAD_PORT,
        "no_proxy": "localhost,127.0.0.1,::1",
        "NO_PROXY": "localhost,127.0.0.1,::1",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": os.environ.get("RAY_AUTH_TOKEN") or secrets.token_hex(32),
    }


def prepare_environment() -> str:
    """Set the loopback environment in this process and make Ray's temporary directory.

    Returns the directory to pass to Ray as its temp dir. Call before Ray starts anything.
    """
    os.environ.update(loopback_environment())
    os.environ.pop("RAY_ADDRESS", None)
    if "ray" in sys.modules:
        # Ray read part of its environment when it was imported (pinned ray==2.60.0): its
        # configuration and token (RAY_AUTH_MODE, RAY_AUTH_TOKEN), read again as Ray's own
        # tests do, and RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER, kept in a module constant.
        from ray._private import ray_constants
        from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]  # Cython, no stubs

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
        ray_constants.ENABLE_RAY_CLUSTER = False
    # Short (see the NOTE), and named after this process, so that its reaper, or any later
    # reaper's sweep, removes it if this process is killed (NOTE [ No orphans ]).
    parent, stem = os.path.split(processes.DIR_ROOT)
    root = tempfile.mkdtemp(prefix=f"{stem}{os.getpid()}-", dir=parent)
    hardening.layer(platform.hardened()).remove_with_me(root)
    os.environ["RAY_TMPDIR"] = root
    os.makedirs(os.path.join(root, "ray"))
    return os.path.join(root, "ray")


class LocalRay:
    """A one-node Ray this process started on loopback; ``stop`` ends it and puts back the
    process environment as it was before ``start``."""

    def __init__(self, num_cpus: Optional[int] = None, resources: Optional[Dict[str, float]] = None):
        import ray

        self._saved_environment = dict(os.environ)
        self.temp_dir = prepare_environment()
        try:
            ray.init(
                address="local",
                include_dashboard=False,
                _node_ip_address=LOOPBACK,
                _temp_dir=self.temp_dir,
                num_cpus=num_cpus,
                resources=resources or None,
                logging_level=logging.WARNING,
            )
        except BaseException:
            self.stop()
            raise
        # Ray's processes have the loopback environment now; the trainer's own HTTP needs
        # (if any) get their proxies back. Ray's auth settings stay until ``stop``.
        for key in _PROXY_KEYS:
            _restore(key, self._saved_environment)

    def stop(self) -> None:
        import ray

        ray.shutdown()
        shutil.rmtree(os.path.dirname(self.temp_dir), ignore_errors=True)
        for key in set(os.environ) | set(self._saved_environment):
            _restore(key, self._saved_environment)


_PROXY_KEYS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "no_proxy", "NO_PROXY")


def _restore(key: str, saved: Dict[str, str]) -> None:
    if key in saved:
        os.environ[key] = saved[key]
    else:
        os.environ.pop(key, None)


@contextlib.contextmanager
def loopback_cluster(num_cpus: int) -> Iterator[Any]:
    """A Ray ``Cluster`` on loopback (ray.cluster_utils: each node is a set of processes on this
    machine) with this process connected to it, for tests and benchmarks that add and remove
    nodes. A lost node is noticed in about 2 s (health checks every 0.5 s) rather than 15."""
    temp_dir = prepare_environment()
    import ray
    from ray.cluster_utils import Cluster

    cluster = None
    try:
        cluster = Cluster(
            initialize_head=True,
            head_node_args=dict(
                node_ip_address=LOOPBACK,
                num_cpus=num_cpus,
                include_dashboard=False,
                dashboard_host=LOOPBACK,
                temp_dir=temp_dir,
                _system_config={
                    "health_check_period_ms": 500,
                    "health_check_timeout_ms": 500,
                    "health_check_failure_threshold": 3,
                },
            ),
        )
        ray.init(address=cluster.address, _node_ip_address=LOOPBACK, logging_level=logging.WARNING)
        yield cluster
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(os.path.dirname(temp_dir), ignore_errors=True)


REACH_TIMEOUT_S = 10.0


def check_reachable(address: str) -> None:
    """Fail within REACH_TIMEOUT_S, in words, if nothing answers at a ``host:port`` address
    (``ray.init`` itself retries for minutes). ``auto`` and the like are Ray's to resolve."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit() or "://" in host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as e:
        from mlagents.trainers.exception import TrainerConfigError

        raise TrainerConfigError(
            f"env_manager.ray.address {address!r}: nothing answers at {host}:{port} "
            f"({e.strerror or type(e).__name__}, within {REACH_TIMEOUT_S:.0f} s). Is the Ray head "
            "running there (`ray status` on it), is the port the head's (6379 by default; "
            "10001 for ray://), and can this machine reach it?"
        ) from None


# NOTE [ Sharing Ray in one process ]
# Ray has one connection per process. Managers in one process share the connection a manager
# made (a local Ray it started, or a cluster it connected to by address), counted, so that only
# the last one to close ends it: closing one manager never takes another's actors. A connection
# the process had before any manager (its own ``ray.init``) is left alone.
_ours: Optional[Callable[[], None]] = None  # ends the connection we made
_users = 0


def connect(address: Optional[str], num_cpus: int, resources: Dict[str, float]) -> Callable[[], None]:
    """Make sure this process is connected to Ray; return what to call when done with it.

    No address: a one-node Ray on loopback (``LocalRay``) with ``num_cpus`` logical CPUs and
    ``resources``; an address: that cluster.
    """
    global _ours, _users
    import ray

    if _ours is None:
        if ray.is_initialized():
            return lambda: None  # the process's own connection
        if address is None:
            _ours = LocalRay(num_cpus, resources).stop
        else:
            check_reachable(address)
            ray.init(address=address, logging_level=logging.WARNING)
            _ours = ray.shutdown  # disconnects; the cluster runs on
    _users += 1
    released = False

    def release() -> None:
        global _ours, _users
        nonlocal released
        if released:
            return
        released = True
        _users -= 1
        if _users == 0 and _ours is not None:
            end, _ours = _ours, None
            end()

    return release
