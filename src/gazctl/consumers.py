"""The consumer processes a ``gazctl shards`` command talks to (``--consumer``).

Every consumer process of an application serves the same ``consumer.Shard`` service over the
same etcd keys, so any one of them answers for all shards. ``--consumer`` takes one address
or several, comma-separated: a call goes to the first that answers, and a consumer that is
down (UNAVAILABLE: refused, unreachable, shutting down) is passed over for the next, with a
line on stderr, so one stopped process fails no command. Once one has answered, the
command's later calls go to it.

Failures become one `ConsumerError` line naming the consumer. An address that answers gRPC
but has no ``consumer.Shard`` service (UNIMPLEMENTED, which gRPC reports as "Method not
found!") is most often a broker given by mistake, as brokers and consumers both speak gRPC;
it is probed with a broker call so that the message can say so.

A consumer serving TLS is reached at its ``https://`` address, or with any of
``--consumer-cert-file``, ``--consumer-cert-key-file``, ``--consumer-trusted-ca-file``; one
verifying calls wants ``--consumer-auth-keys`` or ``--consumer-auth-token`` (env
``CONSUMER_CERT_FILE`` ... ``CONSUMER_AUTH_TOKEN``, upstream's names). Each flag is also
taken as upstream gazctl spells it, ``--consumer.cert-file`` ... ``--consumer.auth-token``.
A refused call (UNAUTHENTICATED) fails the command with the consumer's reason.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import grpc.aio

from gazette.auth.client_settings import ClientSettings
from gazette.auth.flags import add_client_flags, client_settings_from_args
from gazette.auth.tls import TLSConfigError
from gazette.broker.protocol import protocol_pb2 as bpb
from gazette.broker.protocol import protocol_pb2_grpc as bpb_grpc
from gazette.consumer.shard_client import ShardClient, ShardStatusError
from gazette.gazctl.main import GazctlError, Streams

__all__ = [
    "DEFAULT_CONSUMER",
    "ConsumerError",
    "Consumers",
    "add_consumer_client_flags",
    "consumer_client_settings",
    "parse_consumers",
]

DEFAULT_CONSUMER = "127.0.0.1:8090"
"""Where ``gazette-consumer`` listens by default (its ``--listen``)."""

STAT_NOT_SERVED = "Stat is not served by this process"
"""What a consumer's Shard service answers Stat with when it has no runtime behind it (an
UNIMPLEMENTED of a consumer, not of an address lacking the service)."""

BROKER_PROBE_TIMEOUT = 2.0
"""Seconds the probe of an address which lacks the Shard service may take."""

T = TypeVar("T")


class ConsumerError(GazctlError):
    """A consumer could not be reached, refused a call, or is not a consumer at all."""


def parse_consumers(text: str) -> list[str]:
    """The addresses of a ``--consumer`` value (comma-separated); GazctlError if none."""
    out = [e.strip() for e in text.split(",") if e.strip()]
    if not out:
        raise GazctlError(f"--consumer {text!r}: expected one or more comma-separated addresses")
    return out


def add_consumer_client_flags(p: argparse.ArgumentParser | Any) -> None:
    """Declare ``--consumer-cert-file`` ... ``--consumer-auth-token`` on `p`, each also
    spelled as upstream gazctl spells it (``--consumer.cert-file`` ...; module docs)."""
    add_client_flags(p, "consumer-", "CONSUMER_", service="consumer", alias_prefix="consumer.")


def consumer_client_settings(args: argparse.Namespace) -> ClientSettings:
    """The consumer client's TLS and authorization of `args` (declared by
    `add_consumer_client_flags`; none if it has none of them). GazctlError if they cannot go
    together."""
    if not hasattr(args, "consumer_auth_token"):
        return ClientSettings()
    try:
        return client_settings_from_args(args, "consumer-", "CONSUMER_")
    except ValueError as err:
        raise GazctlError(str(err)) from None


class Consumers:
    """Shard clients of the ``--consumer`` addresses, opened as they are needed; `call` runs a
    call on the first that answers, with the TLS and authorization of `settings` (module
    docs). Use as ``async with Consumers(text, io, settings)``."""

    def __init__(self, text: str, io: Streams, settings: ClientSettings | None = None) -> None:
        self.endpoints = parse_consumers(text)
        self.io = io
        settings = settings or ClientSettings()
        try:
            self._tls = settings.tls()
            if self._tls is not None:
                self._tls.check()
            self._auth = settings.authorizer()
        except (TLSConfigError, ValueError) as err:
            raise GazctlError(str(err)) from None
        self._current = 0
        self._clients: dict[str, ShardClient] = {}

    @classmethod
    def of_args(cls, args: argparse.Namespace, io: Streams) -> Consumers:
        """The consumers of ``--consumer``, with the client settings of `args`."""
        return cls(args.consumer, io, consumer_client_settings(args))

    @property
    def endpoint(self) -> str:
        """The address calls go to now."""
        return self.endpoints[self._current]

    def _client(self) -> ShardClient:
        sc = self._clients.get(self.endpoint)
        if sc is None:
            sc = ShardClient(self.endpoint, tls=self._tls, auth=self._auth)
            self._clients[self.endpoint] = sc
        return sc

    async def call(self, fn: Callable[[ShardClient], Awaitable[T]]) -> T:
        """``await fn(client)`` with the client of the first consumer that answers. Raises
        `ConsumerError` (from the gRPC error or `ShardStatusError`) naming the consumer;
        cancellation cancels the call."""
        while True:
            endpoint = self.endpoint
            try:
                return await fn(self._client())
            except ShardStatusError as err:
                raise ConsumerError(f"consumer {endpoint}: {err}") from err
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE:
                    raise await self._describe(endpoint, err) from err
                if self._current + 1 == len(self.endpoints):
                    raise self._unavailable(err) from err
                self._current += 1
                self.io.err(
                    f"gazctl: consumer {endpoint} is unavailable ({err.details()}); "
                    f"trying {self.endpoint}"
                )

    def _unavailable(self, err: grpc.aio.AioRpcError) -> ConsumerError:
        if len(self.endpoints) == 1:
            return ConsumerError(f"consumer {self.endpoint} is unavailable: {err.details()}")
        return ConsumerError(
            f"no consumer of {', '.join(self.endpoints)} is available (the last: {err.details()})"
        )

    async def _describe(self, endpoint: str, err: grpc.aio.AioRpcError) -> ConsumerError:
        code, details = err.code(), err.details() or ""
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return ConsumerError(f"consumer {endpoint} refused: {details}")
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return ConsumerError(
                f"consumer {endpoint} refused the call (UNAUTHENTICATED): {details}; give "
                "--consumer-auth-keys or --consumer-auth-token (env CONSUMER_AUTH_KEYS, "
                "CONSUMER_AUTH_TOKEN) that grant it"
            )
        if code == grpc.StatusCode.UNIMPLEMENTED and details != STAT_NOT_SERVED:
            what = (
                "it is a Gazette broker."
                if await self._is_broker(endpoint)
                else "is it a broker, or another gRPC server?"
            )
            return ConsumerError(
                f"{endpoint} serves no consumer Shard service (UNIMPLEMENTED: {details}); "
                f"{what} --consumer (env CONSUMER_ADDRESS) takes the gRPC address of a "
                f"gazette-consumer process (its --listen, default {DEFAULT_CONSUMER})"
            )
        return ConsumerError(f"consumer {endpoint}: RPC failed ({code.name}): {details}")

    async def _is_broker(self, endpoint: str) -> bool:
        """Whether `endpoint` answers a broker's journal listing (of no journal)."""
        stub = bpb_grpc.JournalStub(self._client().channel)
        req = bpb.ListRequest()
        req.selector.include.labels.add(name="name", value=f"gazctl/probe/{os.getpid()}")
        call = stub.List(req, timeout=BROKER_PROBE_TIMEOUT)
        try:
            async for _ in call:
                return True
            return True
        except grpc.aio.AioRpcError:
            return False
        finally:
            call.cancel()

    async def close(self) -> None:
        for sc in self._clients.values():
            await sc.close()

    async def __aenter__(self) -> Consumers:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
