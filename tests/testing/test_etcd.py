"""The test kit's etcd: temporary data directories are made in memory when there is room, so
a busy disk cannot stall its log syncs (gazette.testing.etcd)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gazette.testing import etcd as etcd_kit
from gazette.testing.etcd import EtcdServer, scratch_dir


def test_temporary_data_goes_to_memory_when_there_is_room() -> None:
    with EtcdServer() as server:
        assert server.data_dir is not None
        assert server.data_dir.parent == Path("/dev/shm")
        assert (server.data_dir / "data" / "member" / "wal").is_dir()
        made = server.data_dir
    assert not made.exists(), "the temporary data directory outlived the server"


def test_no_room_in_memory_means_the_system_temporary_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert scratch_dir() == "/dev/shm"
    st = os.statvfs("/dev/shm")
    monkeypatch.setattr(etcd_kit, "_MEMORY_ROOM", st.f_blocks * st.f_frsize + 1)
    assert scratch_dir() is None
    monkeypatch.setattr(etcd_kit, "_MEMORY_DIR", tmp_path / "absent")
    assert scratch_dir() is None


def test_free_ports_are_below_the_ephemeral_range_and_never_given_twice() -> None:
    """A harness restarts a process on its port: no outgoing connection's source port (the
    ephemeral range) may take it meanwhile."""
    from pathlib import Path

    from gazette.testing.etcd import free_port

    floor = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert all(1024 <= p < floor for p in ports), ports
    assert len(set(ports)) == len(ports)
