"""The gRPC server each env worker runs for its Unity build, as mlagents-envs runs it, but alone
on its port. Installed in worker processes (it imports mlagents-envs only, never the trainers).

# NOTE [ One run per port ]
# A Unity build connects to the trainer's gRPC server at base_port + worker id, and the default
# base port (5005) is everybody's. mlagents-envs checks that the port is free, then binds it with
# SO_REUSEPORT. Two runs started together both pass the check before either binds, and both
# bind: the kernel then hands each player's connection to either run's server, players talk to
# the wrong trainer, and both runs stall until mlagents-envs' --timeout-wait gives up (60 s), then
# recover through restarts. So the server is bound without SO_REUSEPORT, which makes the bind
# itself the claim: the second run's bind fails at once with UnityWorkerInUseException, before
# its player starts, and the manager moves that worker to a port nobody uses (manager.py), saying
# which process holds the port. Explicit ports behave as before: base_port + worker id while free.
"""
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from mlagents_envs.communicator_objects.unity_to_external_pb2_grpc import (
    add_UnityToExternalProtoServicer_to_server,
)
from mlagents_envs.exception import UnityWorkerInUseException
from mlagents_envs.rpc_communicator import RpcCommunicator, UnityToExternalServicerImplementation

from mlagents_plugin.core.internals import ORIGINAL, original

# mlagents-envs serves each build with this many threads
_SERVER_THREADS = 10


def install() -> None:
    """Serve every Unity build of this process on a port bound exclusively (NOTE above)."""
    setattr(_create_server, ORIGINAL, original(RpcCommunicator.create_server))
    RpcCommunicator.create_server = _create_server


def _create_server(self: Any) -> None:
    """``RpcCommunicator.create_server``, without SO_REUSEPORT."""
    self.check_port(self.port)  # mlagents-envs' own check: a port held by anyone is refused
    server = grpc.server(
        thread_pool=ThreadPoolExecutor(max_workers=_SERVER_THREADS),
        options=(("grpc.so_reuseport", 0),),
    )
    self.unity_to_external = UnityToExternalServicerImplementation()
    add_UnityToExternalProtoServicer_to_server(self.unity_to_external, server)
    try:
        bound = server.add_insecure_port(f"[::]:{self.port}")  # as mlagents-envs: every address
    except RuntimeError:  # grpcio >= 1.5x raises where 1.48 returns 0
        bound = 0
    if not bound:
        server.stop(None)
        raise UnityWorkerInUseException(self.worker_id)
    try:
        server.start()
    except BaseException:
        server.stop(None)  # its port and threads, before the error goes on
        raise
    self.server = server
    self.is_open = True
