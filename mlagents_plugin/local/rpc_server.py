"""The gRPC server each env worker runs for its Unity build, as mlagents-envs runs it, but alone
on its port and on loopback. Installed in worker processes (it imports mlagents-envs only, never
the trainers), in place of ``RpcCommunicator.create_server``, an internal that
integration/compat.py lists and checks.

# NOTE [ One run per port ]
# A Unity build connects to the trainer's gRPC server at base_port + worker id, and the default
# base port (5005) is everybody's. mlagents-envs checks that the port is free, then binds it with
# SO_REUSEPORT. Two runs started together both pass the check before either binds, and both
# bind: the kernel then hands each player's connection to either run's server, players talk to
# the wrong trainer, and both runs stall until mlagents-envs' --timeout-wait gives up (60 s), then
# recover through restarts. So the server is bound without SO_REUSEPORT, which makes the bind
# itself the claim: the second run's bind fails at once with UnityWorkerInUseException, before
# its player starts, and that worker moves to a port nobody uses (core/restart.py's decide), saying
# which process holds the port. Explicit ports behave as before: base_port + worker id while free.
#
# NOTE [ Loopback only ]
# mlagents-envs binds "[::]:port": every address, IPv4 and IPv6, with no authentication, so that
# a build in a Docker container can connect. Anyone who reaches the machine could then feed the
# trainer observations and rewards, or hold the port first. The builds a worker launches, the
# Editor on the same machine, and the builds a Ray actor launches on its node all connect to
# localhost, so by default the server listens on 127.0.0.1 and, where the machine has it, ::1
# (a build may resolve "localhost" either way); both binds are the claim. ``env_manager.listen``
# opens it for a build or Editor elsewhere: ``all`` (as mlagents-envs), or one address of this
# machine besides loopback.
"""
import functools
import ipaddress
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any, List, Optional

import grpc
from mlagents_envs.communicator_objects.unity_to_external_pb2_grpc import (
    add_UnityToExternalProtoServicer_to_server,
)
from mlagents_envs.exception import UnityWorkerInUseException
from mlagents_envs.rpc_communicator import RpcCommunicator, UnityToExternalServicerImplementation

from mlagents_plugin.core.errors import ListenAddressError
from mlagents_plugin.core.internals import ORIGINAL, original

# mlagents-envs serves each build with this many threads
_SERVER_THREADS = 10


def install(listen: str) -> None:
    """Serve every Unity build of this process on ports bound exclusively (NOTE [ One run per
    port ]), on the addresses ``listen`` names (NOTE [ Loopback only ])."""
    global _listen
    _listen = listen
    setattr(_create_server, ORIGINAL, original(RpcCommunicator.create_server))
    RpcCommunicator.create_server = _create_server


_listen = "loopback"  # this process's env_manager.listen, set by install()


def addresses(listen: str, port: int) -> List[str]:
    """The gRPC addresses a server on ``port`` binds for the setting ``listen``."""
    if listen == "all":
        return [f"[::]:{port}"]
    loopback = [f"127.0.0.1:{port}"] + ([f"[::1]:{port}"] if has_ipv6_loopback() else [])
    if listen == "loopback":
        return loopback
    ip = ipaddress.ip_address(listen)  # and loopback: the builds --env launches connect there
    named = f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
    return loopback + ([] if named in loopback else [named])


@functools.lru_cache(maxsize=None)
def has_ipv6_loopback() -> bool:
    """Whether ::1 can be bound here (not in a container or host with IPv6 turned off)."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


def _create_server(self: Any) -> None:
    """``RpcCommunicator.create_server``, without SO_REUSEPORT, on the addresses of ``listen``."""
    self.check_port(self.port)  # mlagents-envs' own check: a port held by anyone is refused
    server = grpc.server(
        thread_pool=ThreadPoolExecutor(max_workers=_SERVER_THREADS),
        options=(("grpc.so_reuseport", 0),),
    )
    self.unity_to_external = UnityToExternalServicerImplementation()
    add_UnityToExternalProtoServicer_to_server(self.unity_to_external, server)
    started = False
    try:
        for address in addresses(_listen, self.port):
            if not _bind(server, address):
                _refuse(_listen, self.worker_id)
        server.start()
        started = True
    except BaseException:
        _let_go(server, started)
        raise
    self.server = server
    self.is_open = True


def _let_go(server: grpc.Server, started: bool) -> None:
    """Free the ports ``server`` bound (127.0.0.1 when ::1 was refused). gRPC frees a server's
    ports only once it has run: one that never started holds them while the process lives."""
    if not started:
        try:
            server.start()  # serves nothing: no player has been launched for it
        except Exception:
            pass
    server.stop(None).wait()


def _bind(server: grpc.Server, address: str) -> bool:
    try:
        return bool(server.add_insecure_port(address))
    except RuntimeError:  # grpcio raises on a port it could not bind (older ones returned 0)
        return False


def _refuse(listen: str, worker_id: int) -> None:
    """Why an address could not be bound: held by someone (the manager moves the worker to
    another port), or the address the user named cannot be listened on here (not restarted)."""
    problem = cannot_listen_on(listen)
    if problem:
        raise ListenAddressError(f"env_manager.listen: {problem}")
    raise UnityWorkerInUseException(worker_id)


def cannot_listen_on(listen: str) -> Optional[str]:
    """Why this machine cannot listen on the setting ``listen``'s address; None if it can."""
    if listen in ("loopback", "all"):
        return None
    ip = ipaddress.ip_address(listen)
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((str(ip), 0))
    except OSError as e:
        return (f"this machine cannot listen on {ip} ({e.strerror}): name one of its own addresses, "
                "or use loopback or all")
    return None
