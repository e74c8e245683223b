"""The build's end of ML-Agents' gRPC link: what Unity's RpcCommunicator.cs does.

The trainer (mlagents-envs' RpcCommunicator) is the gRPC *server*; the build is the *client* and
calls the single unary method ``UnityToExternalProto.Exchange``, one call at a time, always
speaking first. The handshake is two calls: the first sends the academy's name, versions and
capabilities and gets back the seed, ``num_areas`` and the trainer's versions; the second is
empty, and its answer is the trainer's first real input (the RESET of ``env.reset()``). Then
every call carries an output and brings back the next input. The trainer's ``close()`` answers
with status 400; a build that quits on its own sends 400 itself.
"""
from typing import Optional, Tuple

import grpc
from mlagents_envs.communicator_objects.unity_message_pb2 import UnityMessageProto
from mlagents_envs.communicator_objects.unity_output_pb2 import UnityOutputProto
from mlagents_envs.communicator_objects.unity_rl_initialization_input_pb2 import (
    UnityRLInitializationInputProto,
)
from mlagents_envs.communicator_objects.unity_rl_initialization_output_pb2 import (
    UnityRLInitializationOutputProto,
)
from mlagents_envs.communicator_objects.unity_rl_input_pb2 import UnityRLInputProto
from mlagents_envs.communicator_objects.unity_to_external_pb2_grpc import UnityToExternalProtoStub

OK, QUIT = 200, 400


class TrainerGone(Exception):
    """The trainer closed the link, asked us to quit (``closed``), or is unreachable."""

    def __init__(self, message: str, closed: bool = False):
        super().__init__(message)
        self.closed = closed


class NoTrainer(TrainerGone):
    """No trainer answered the first call of the handshake."""


class BuildCommunicator:
    def __init__(self, port: int, connect_timeout_s: float):
        self.connect_timeout_s = connect_timeout_s
        # No keepalive pings: the trainer's server answers pings on a quiet connection (a policy
        # update can take minutes) with GOAWAY "too_many_pings". No size limit on our side; the
        # trainer's server keeps gRPC's 4 MB default, as it does for Unity.
        self.channel = grpc.insecure_channel(
            f"127.0.0.1:{port}",
            options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)],
        )
        self.stub = UnityToExternalProtoStub(self.channel)
        self.open = True

    def handshake(
        self, init_output: UnityRLInitializationOutputProto, between_calls=lambda: None
    ) -> Tuple[UnityRLInitializationInputProto, UnityRLInputProto]:
        """The two handshake calls; returns the trainer's init input and its first real input.

        The first call waits for the trainer's server (``wait_for_ready``), as a build started
        by hand waits for the Editor's Play button's counterpart, ``mlagents-learn``.
        """
        output = UnityOutputProto()
        output.rl_initialization_output.CopyFrom(init_output)
        try:
            reply = self._call(_message(output), self.connect_timeout_s, wait_for_ready=True)
        except TrainerGone as e:
            raise NoTrainer(str(e)) from None
        init_input = reply.unity_input.rl_initialization_input
        between_calls()
        reply = self._call(_message(None), None)
        return init_input, reply.unity_input.rl_input

    def exchange(self, output: UnityOutputProto) -> UnityRLInputProto:
        return self._call(_message(output), None).unity_input.rl_input

    def say_goodbye(self) -> None:
        """Status 400, as Unity sends when the player quits; best effort."""
        if self.open:
            self.open = False
            try:
                self.stub.Exchange(_message(None, QUIT), timeout=2.0)
            except grpc.RpcError:
                pass

    def close(self) -> None:
        self.open = False
        self.channel.close()

    def _call(
        self, message: UnityMessageProto, timeout: Optional[float], wait_for_ready: bool = False
    ) -> UnityMessageProto:
        try:
            reply = self.stub.Exchange(message, timeout=timeout, wait_for_ready=wait_for_ready)
        except grpc.RpcError as e:
            self.open = False
            raise TrainerGone(f"gRPC {e.code().name}: {e.details()}") from None
        except BaseException:
            # Interrupted mid-call: never start a second call (say_goodbye) while this one may
            # still be pending: the trainer would have two threads reading one pipe.
            self.open = False
            raise
        if reply.header.status != OK:
            self.open = False
            raise TrainerGone(f"the trainer closed the link (status {reply.header.status})", closed=True)
        return reply


def _message(output: Optional[UnityOutputProto], status: int = OK) -> UnityMessageProto:
    message = UnityMessageProto()
    message.header.status = status
    if output is not None:
        message.unity_output.CopyFrom(output)
    return message
