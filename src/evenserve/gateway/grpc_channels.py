"""The gateway's kept gRPC channels to the backends it relays ModelInfer to as bytes.

One channel per backend relayed to (``grpc_forward: grpc``), opened when the gRPC front
starts and connecting at once; opened afresh once its backend was ejected or readmitted (a
channel whose backend was down is in grpc's reconnect backoff and would fail every call
until its next attempt) or its ``grpc_url`` changed.
"""

from __future__ import annotations

import asyncio

import grpc
from tritonclient.grpc import service_pb2_grpc

from evenserve.gateway.backends import BackendRegistry
from evenserve.gateway.dispatcher import Dispatcher
from evenserve.httpio.grpc_service import SERVICE

INFER_METHOD = f"/{SERVICE}/ModelInfer"


#: Each backend channel's options: no size limits (the gateway's own limit applies to what
#: it takes); no transparent retries: the dispatcher retries itself, and grpc's retry
#: support keeps a copy of every request it sends (up to 256 KiB) in case it retries; its
#: own connection (grpc shares one per address between channels by default, so a fresh
#: channel would inherit the old one's reconnect backoff: ``GrpcChannels._channel``).
CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.enable_retries", 0),
    ("grpc.use_local_subchannel_pool", 1),
)


class _Channel:
    """One backend's kept channel: its stub (metadata, config) and its raw ModelInfer call;
    ``since_s``: when it was opened (the registry's clock)."""

    __slots__ = ("channel", "infer", "since_s", "stub", "url")

    def __init__(self, url: str, since_s: float) -> None:
        self.url = url
        self.since_s = since_s
        self.channel = grpc.aio.insecure_channel(url, options=list(CHANNEL_OPTIONS))
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.infer = self.channel.unary_unary(INFER_METHOD)  # bytes in, bytes out


class GrpcChannels:
    """What the gateway's gRPC servicer keeps of its backends: which are relayed to over
    gRPC (``relays``) and their kept channels (``_channel``)."""

    def __init__(self, registry: BackendRegistry, dispatcher: Dispatcher, timeout_s: float) -> None:
        self.registry = registry
        self.dispatcher = dispatcher
        self.timeout_s = timeout_s
        default = dispatcher.cfg.grpc_forward
        #: The backends ModelInfer is relayed to over gRPC (``grpc_forward: grpc``); every
        #: other one gets it translated to HTTP. Backend specs do not change at run time.
        self.relays = frozenset(
            n for n, st in registry.states.items() if st.spec.forwards_grpc(default)
        )
        self._channels: dict[str, _Channel] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def open(self) -> None:
        """A channel to every backend relayed to over gRPC, connecting now (on the running
        loop): the first request does not wait for a connection."""
        for name in self.relays:
            if self.registry.states[name].spec.grpc_url is not None:
                self._channel(name).channel.get_state(try_to_connect=True)

    def _channel(self, name: str) -> _Channel:
        """Backend ``name``'s kept channel; a fresh one if its ``grpc_url`` changed or the
        backend was ejected or readmitted since the channel was opened. A channel whose
        backend was down is in grpc's reconnect backoff (1 s, growing to 2 min) and fails
        every call at once until its next attempt: the backend would be ejected again though
        it is back. A fresh channel connects at once."""
        st = self.registry.states[name]
        url = st.spec.grpc_url
        ch = self._channels.get(name)
        if ch is None or ch.url != url or ch.since_s < st.changed_at_s:
            assert url is not None  # backends without one are never picked
            if ch is not None:  # its calls in flight may finish
                task = asyncio.get_running_loop().create_task(ch.channel.close(self.timeout_s))
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
            ch = self._channels[name] = _Channel(url, self.registry.clock.now())
        return ch

    async def aclose(self) -> None:
        for ch in self._channels.values():
            await ch.channel.close()
        await asyncio.gather(*self._closing, return_exceptions=True)
