"""Fixtures of the SQLStore tests: a real PostgreSQL server for the session, and `backend`,
which runs a test against a fresh PostgreSQL database and against a fresh sqlite3 file."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gazette.stores.sqlstore.testing import PostgresServer

_databases = itertools.count()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    with PostgresServer() as server:
        yield server


@dataclass
class Backend:
    """A fresh database: `connect` makes a DB-API connection to it."""

    name: str
    connect: Callable[[], Any]


@pytest.fixture(params=["postgresql", "sqlite"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        path = tmp_path / "store.sqlite"
        yield Backend("sqlite", lambda: sqlite3.connect(path, timeout=10))
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    db = f"test_{next(_databases)}"
    with psycopg.connect(server.conninfo, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {db}")
    conninfo = server.conninfo.replace("dbname=postgres", f"dbname={db}")
    yield Backend("postgresql", lambda: psycopg.connect(conninfo))
    with psycopg.connect(server.conninfo, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE {db} WITH (FORCE)")
