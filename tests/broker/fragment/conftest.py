"""Fixtures for fragment tests: one moto S3 server per session, fresh buckets per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from gazette.testing.s3 import MotoS3Server


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3Server]:
    with pytest.MonkeyPatch.context() as mp:
        for key, value in MotoS3Server.env().items():
            mp.setenv(key, value)
        with MotoS3Server() as server:
            yield server


@pytest.fixture
def s3_bucket(moto_s3: MotoS3Server) -> str:
    """A new, empty bucket on the session's moto server."""
    name = f"bucket-{uuid.uuid4().hex[:12]}"
    moto_s3.create_bucket(name)
    return name
