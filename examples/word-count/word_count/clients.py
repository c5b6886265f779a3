"""Clients of the word-count cluster, secured as the cluster is.

Like gazctl, they read TLS files and authorization from the environment under upstream's
names: ``BROKER_TRUSTED_CA_FILE``, ``BROKER_AUTH_KEYS`` ... for brokers, ``CONSUMER_*`` for
consumers (docs/security.md). Without them they are plaintext and unauthorized.
"""

from __future__ import annotations

from collections.abc import Sequence

from gazette.auth.client_settings import ClientSettings
from gazette.broker.client import JournalClient
from gazette.consumer.shard_client import ShardClient

__all__ = ["consumer_settings", "journal_client", "shard_client"]


def consumer_settings() -> ClientSettings:
    """The environment's settings of consumer clients."""
    return ClientSettings.from_environ("CONSUMER_")


def journal_client(brokers: str | Sequence[str]) -> JournalClient:
    """A client of `brokers` with the environment's ``BROKER_*`` settings."""
    settings = ClientSettings.from_environ("BROKER_")
    return JournalClient(brokers, tls=settings.tls(), auth=settings.authorizer())


def shard_client(endpoint: str) -> ShardClient:
    """A client of the consumer at `endpoint` with the environment's ``CONSUMER_*``
    settings."""
    settings = consumer_settings()
    return ShardClient(endpoint, tls=settings.tls(), auth=settings.authorizer())
