"""Fragment stores against real backends: temporary directories and a moto S3 server."""

from __future__ import annotations

import hashlib
import logging
import random
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gazette.broker.fragment import store_s3
from gazette.broker.fragment.codecs import decompress_to
from gazette.broker.fragment.postfix import evaluate_postfix_template
from gazette.broker.fragment.store import (
    FragmentCorrupted,
    FragmentStore,
    FragmentStoreError,
    clear_store_cache,
    store_for_url,
)
from gazette.broker.fragment.store_file import FileStore
from gazette.broker.fragment.store_s3 import S3Store
from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.sha1sum import sha1sum_of
from gazette.testing.s3 import MotoS3Server

JOURNAL = "examples/events/part-000"
ALL_CODECS: list[int] = [pb.NONE, pb.GZIP, pb.ZSTANDARD, pb.SNAPPY, pb.GZIP_OFFLOAD_DECOMPRESSION]
FILE_CODECS = ALL_CODECS[:4]


@dataclass
class Backend:
    """A store plus raw access to the objects behind it, for tampering."""

    kind: str
    store: FragmentStore
    read_raw: Callable[[str], bytes]  # Key relative to the store root.
    write_raw: Callable[[str, bytes], None]
    make_url: Callable[[str], str]  # URL with the given query suffix.


def _file_backend(tmp_path: Path) -> Backend:
    root = tmp_path / "store"
    root.mkdir()

    def read_raw(rel: str) -> bytes:
        return (root / rel).read_bytes()

    def write_raw(rel: str, data: bytes) -> None:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)

    def make_url(query: str) -> str:
        return f"file://{root}/" + (f"?{query}" if query else "")

    return Backend("file", FileStore(make_url("")), read_raw, write_raw, make_url)


def _s3_backend(moto: MotoS3Server, bucket: str) -> Backend:
    client = moto.client()

    def read_raw(rel: str) -> bytes:
        body: bytes = client.get_object(Bucket=bucket, Key="root/" + rel)["Body"].read()
        return body

    def write_raw(rel: str, data: bytes) -> None:
        client.put_object(Bucket=bucket, Key="root/" + rel, Body=data)

    def make_url(query: str) -> str:
        sep = "&" if query else ""
        return f"s3://{bucket}/root/?endpoint={moto.endpoint}&region=us-east-1{sep}{query}"

    return Backend("s3", S3Store(make_url("")), read_raw, write_raw, make_url)


@pytest.fixture(params=["file", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "file":
        return _file_backend(tmp_path)
    moto: MotoS3Server = request.getfixturevalue("moto_s3")
    return _s3_backend(moto, request.getfixturevalue("s3_bucket"))


@pytest.fixture
def s3(moto_s3: MotoS3Server, s3_bucket: str) -> Backend:
    return _s3_backend(moto_s3, s3_bucket)


@pytest.fixture
def fs(tmp_path: Path) -> Backend:
    return _file_backend(tmp_path)


def content(size: int, seed: int = 0) -> bytes:
    rng = random.Random(seed)
    lines = [f'{{"seq": {i}, "v": {rng.random()}}}\n'.encode() for i in range(size // 20 + 1)]
    return b"".join(lines)[:size]


def spool(
    tmp_path: Path, data: bytes, begin: int = 0, codec: int = pb.NONE, postfix: str = ""
) -> tuple[pb.Fragment, Path]:
    frag = pb.Fragment(
        journal=JOURNAL,
        begin=begin,
        end=begin + len(data),
        compression_codec=codec,  # type: ignore[arg-type]
        path_postfix=postfix,
    )
    if data:
        frag.sum.CopyFrom(sha1sum_of(data))
    local = tmp_path / f"spool-{begin}-{hashlib.sha1(data).hexdigest()[:8]}"
    local.write_bytes(data)
    return frag, local


def rel_path(frag: pb.Fragment) -> str:
    from gazette.broker.protocol.fragment_name import content_path

    return content_path(frag)


def codecs_for(b: Backend) -> list[int]:
    return FILE_CODECS if b.kind == "file" else ALL_CODECS


# ---------------------------------------------------------------------------------------------


async def test_round_trip_every_codec(backend: Backend, tmp_path: Path) -> None:
    data = content(300_000)
    offset = 0
    persisted: list[pb.Fragment] = []
    for codec in codecs_for(backend):
        chunk = data[offset % 1000 :]
        frag, local = spool(tmp_path, chunk, begin=offset, codec=codec)
        offset += len(chunk)
        assert not await backend.store.exists(frag)

        before = int(time.time())
        out = await backend.store.persist(frag, local)
        assert out.backing_store == backend.store.url
        assert before - 2 <= out.mod_time <= int(time.time()) + 2
        assert frag.backing_store == ""  # Input untouched.
        assert await backend.store.exists(frag)
        persisted.append(out)

        dest = tmp_path / f"fetched-{codec}"
        await backend.store.fetch(frag, dest)
        assert dest.read_bytes() == chunk

        raw = b"".join([c async for c in backend.store.open_raw(frag)])
        assert raw == backend.read_raw(rel_path(frag))
        assert _decompress(codec, raw) == chunk

    listed = sorted(await backend.store.list(JOURNAL), key=lambda f: f.begin)
    assert len(listed) == len(persisted)
    for got, want in zip(listed, persisted, strict=True):
        assert (got.journal, got.begin, got.end, got.sum, got.compression_codec) == (
            want.journal,
            want.begin,
            want.end,
            want.sum,
            want.compression_codec,
        )
        assert got.backing_store == backend.store.url
        assert abs(got.mod_time - want.mod_time) <= 2
        assert got.path_postfix == ""


def _decompress(codec: int, raw: bytes) -> bytes:
    import io

    out = io.BytesIO()
    decompress_to(codec, io.BytesIO(raw), out)
    return out.getvalue()


async def test_large_fragment_chunks(backend: Backend, tmp_path: Path) -> None:
    data = random.Random(5).randbytes(1 << 20) + content(3 << 20)
    for codec in (pb.NONE, pb.ZSTANDARD):
        frag, local = spool(tmp_path, data, codec=codec)
        await backend.store.persist(frag, local)
        dest = tmp_path / "dest"
        await backend.store.fetch(frag, dest)
        assert dest.read_bytes() == data


async def test_persist_is_idempotent(backend: Backend, tmp_path: Path) -> None:
    frag, local = spool(tmp_path, content(10_000), codec=pb.GZIP)
    first = await backend.store.persist(frag, local)
    # Replace the stored object with a sentinel: a second persist must not touch it.
    backend.write_raw(rel_path(frag), b"sentinel")
    second = await backend.store.persist(frag, local)
    assert backend.read_raw(rel_path(frag)) == b"sentinel"
    assert second.backing_store == first.backing_store
    assert abs(second.mod_time - first.mod_time) <= 2


async def test_persist_rejects_local_content_mismatch(backend: Backend, tmp_path: Path) -> None:
    frag, local = spool(tmp_path, content(5_000), codec=pb.SNAPPY)
    local.write_bytes(content(5_000, seed=9))  # Same length, other bytes.
    with pytest.raises(FragmentCorrupted, match="SHA1 mismatch"):
        await backend.store.persist(frag, local)
    assert not await backend.store.exists(frag)

    local.write_bytes(content(4_999))  # Short.
    with pytest.raises(FragmentCorrupted, match="expected 5000"):
        await backend.store.persist(frag, local)
    assert not await backend.store.exists(frag)


@pytest.mark.parametrize("codec", [pb.NONE, pb.GZIP, pb.ZSTANDARD, pb.SNAPPY])
async def test_flipped_byte_is_detected(backend: Backend, tmp_path: Path, codec: int) -> None:
    data = content(200_000, seed=codec)
    frag, local = spool(tmp_path, data, codec=codec)
    await backend.store.persist(frag, local)
    path = rel_path(frag)
    good = backend.read_raw(path)

    positions = {len(good) // 3, len(good) // 2, len(good) - 1}
    if codec == pb.NONE:
        positions.add(0)
    for pos in sorted(positions):
        bad = bytearray(good)
        bad[pos] ^= 0x01
        backend.write_raw(path, bytes(bad))
        dest = tmp_path / f"dest-{pos}"
        with pytest.raises(FragmentCorrupted) as info:
            await backend.store.fetch(frag, dest)
        assert backend.store.url in str(info.value)
        assert not dest.exists()
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(f".{dest.name}")]

    # Truncated and extended objects, too.
    for bad_bytes in (good[: len(good) - 10], good + (b"x" if codec == pb.NONE else good)):
        backend.write_raw(path, bad_bytes)
        with pytest.raises(FragmentCorrupted):
            await backend.store.fetch(frag, tmp_path / "dest")
        assert not (tmp_path / "dest").exists()


async def test_fetch_missing_fragment(backend: Backend, tmp_path: Path) -> None:
    frag, _ = spool(tmp_path, b"never persisted")
    with pytest.raises(FragmentStoreError) as info:
        await backend.store.fetch(frag, tmp_path / "dest")
    assert not isinstance(info.value, FragmentCorrupted)
    assert backend.store.url in str(info.value)


async def test_path_postfix(backend: Backend, tmp_path: Path) -> None:
    spec = pb.JournalSpec(name=JOURNAL)
    tpl = (
        'date={{ .Spool.FirstAppendTime.Format "2006-01-02" }}/'
        'hour={{ .Spool.FirstAppendTime.Format "15" }}'
    )
    postfix = evaluate_postfix_template(tpl, datetime(2024, 3, 5, 7, tzinfo=UTC), spec)
    assert postfix == "date=2024-03-05/hour=07"

    a, la = spool(tmp_path, content(1000), begin=0, codec=pb.ZSTANDARD, postfix=postfix)
    b, lb = spool(tmp_path, content(1000, 1), begin=1000, codec=pb.NONE)
    await backend.store.persist(a, la)
    await backend.store.persist(b, lb)

    stored = backend.read_raw(
        f"{JOURNAL}/date=2024-03-05/hour=07/"
        f"{0:016x}-{1000:016x}-{hashlib.sha1(content(1000)).hexdigest()}.zst"
    )
    assert _decompress(pb.ZSTANDARD, stored) == content(1000)

    listed = sorted(await backend.store.list(JOURNAL), key=lambda f: f.begin)
    assert [(f.begin, f.path_postfix) for f in listed] == [(0, postfix), (1000, "")]
    dest = tmp_path / "dest"
    await backend.store.fetch(listed[0], dest)
    assert dest.read_bytes() == content(1000)


async def test_find_replace(backend: Backend, tmp_path: Path) -> None:
    store = store_for_url(backend.make_url("find=/events/&replace=/old-events/"))
    frag, local = spool(tmp_path, content(2000), codec=pb.GZIP)
    await store.persist(frag, local)

    rewritten = rel_path(frag).replace("/events/", "/old-events/", 1)
    assert rewritten.startswith("examples/old-events/part-000/")
    assert _decompress(pb.GZIP, backend.read_raw(rewritten)) == content(2000)
    # The plain store does not see it under the journal's own name.
    assert await backend.store.list(JOURNAL) == []

    listed = await store.list(JOURNAL)
    assert len(listed) == 1 and listed[0].journal == JOURNAL
    assert await store.exists(frag)
    dest = tmp_path / "dest"
    await store.fetch(frag, dest)
    assert dest.read_bytes() == content(2000)


async def test_list_skips_garbage(
    backend: Backend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    frag, local = spool(tmp_path, content(100), codec=pb.NONE)
    await backend.store.persist(frag, local)
    for junk in (
        f"{JOURNAL}/README.txt",
        f"{JOURNAL}/0000000000000000-0000000000000064-nothex.raw",
        f"{JOURNAL}/0000000000000000-0000000000000064.raw",
        f"{JOURNAL}/0000000000000064-0000000000000000-{'0' * 40}.raw",  # begin > end
        f"{JOURNAL}/0000000000000000-0000000000000064-{'0' * 40}.bogus",
        f"{JOURNAL}/sub/notes",
    ):
        backend.write_raw(junk, b"junk")
    # A sibling journal sharing a name prefix is not listed.
    backend.write_raw(f"{JOURNAL}0/{0:016x}-{1:016x}-{'1' * 40}.raw", b"x")
    with caplog.at_level(logging.WARNING, logger="gazette.broker.fragment.store"):
        listed = await backend.store.list(JOURNAL)
    assert [(f.begin, f.end) for f in listed] == [(0, 100)]
    assert sum("skipping unparseable fragment name" in r.getMessage() for r in caplog.records) == 6
    assert await backend.store.list("no/such/journal") == []


async def test_remove(backend: Backend, tmp_path: Path) -> None:
    frag, local = spool(tmp_path, content(100), codec=pb.SNAPPY)
    await backend.store.persist(frag, local)
    await backend.store.remove(frag)
    assert not await backend.store.exists(frag)
    assert await backend.store.list(JOURNAL) == []
    await backend.store.remove(frag)  # Absent: not an error.


async def test_empty_fragment(backend: Backend, tmp_path: Path) -> None:
    frag, local = spool(tmp_path, b"", begin=100, codec=pb.GZIP)
    assert frag.sum == pb.SHA1Sum()
    await backend.store.persist(frag, local)
    dest = tmp_path / "dest"
    await backend.store.fetch(frag, dest)
    assert dest.read_bytes() == b""


async def test_s3_signed_url_is_fetchable(s3: Backend, tmp_path: Path) -> None:
    for codec in (pb.GZIP, pb.GZIP_OFFLOAD_DECOMPRESSION):
        data = content(50_000, seed=codec)
        frag, local = spool(tmp_path, data, codec=codec)
        await s3.store.persist(frag, local)
        url = await s3.store.sign_get_url(frag, 60)
        assert url.startswith("http://127.0.0.1:")
        req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
            encoding = resp.headers.get("Content-Encoding")
        assert body == s3.read_raw(rel_path(frag))
        assert _decompress(pb.GZIP, body) == data
        if codec == pb.GZIP_OFFLOAD_DECOMPRESSION:
            assert encoding == "gzip"
            assert rel_path(frag).endswith(hashlib.sha1(data).hexdigest())  # No extension.


async def test_file_signed_url_points_to_file(fs: Backend, tmp_path: Path) -> None:
    frag, local = spool(tmp_path, content(100), codec=pb.ZSTANDARD)
    await fs.store.persist(frag, local)
    url = await fs.store.sign_get_url(frag, 60)
    assert url == f"file://{tmp_path}/store/{rel_path(frag)}"
    assert Path(url.removeprefix("file://")).read_bytes() == fs.read_raw(rel_path(frag))


async def test_file_store_rejects_gzip_offload(fs: Backend, tmp_path: Path) -> None:
    frag, local = spool(tmp_path, content(100), codec=pb.GZIP_OFFLOAD_DECOMPRESSION)
    with pytest.raises(FragmentStoreError, match="GZIP_OFFLOAD_DECOMPRESSION"):
        await fs.store.persist(frag, local)


async def test_file_persist_leaves_no_temporaries(fs: Backend, tmp_path: Path) -> None:
    frag, local = spool(tmp_path, content(10_000), codec=pb.GZIP)
    await fs.store.persist(frag, local)
    names = [p.name for p in (tmp_path / "store" / JOURNAL).iterdir()]
    assert names == [rel_path(frag).rsplit("/", 1)[1]]


async def test_s3_multipart_upload(
    s3: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_s3, "_MULTIPART", 5 << 20)  # S3's minimum part size.
    store = S3Store(s3.make_url(""))
    data = random.Random(3).randbytes(11 << 20)
    frag, local = spool(tmp_path, data, codec=pb.NONE)
    await store.persist(frag, local)
    head = s3_client_head(s3, frag)
    assert head["ETag"].endswith('-3"')  # Uploaded in three parts.
    dest = tmp_path / "dest"
    await store.fetch(frag, dest)
    assert dest.read_bytes() == data


def s3_client_head(b: Backend, frag: pb.Fragment) -> dict[str, str]:
    assert isinstance(b.store, S3Store)
    head: dict[str, str] = b.store._client.head_object(
        Bucket=b.store.bucket, Key=b.store.key_of(frag)
    )
    return head


async def test_health(backend: Backend, tmp_path: Path) -> None:
    await backend.store.health()
    # A journal named like the probe is never listed as a fragment.
    assert await backend.store.list(JOURNAL) == []


async def test_health_of_missing_directory(tmp_path: Path) -> None:
    store = FileStore(f"file://{tmp_path}/missing/")
    with pytest.raises(FragmentStoreError, match="does not exist") as info:
        await store.health()
    assert store.url in str(info.value)
    frag, local = spool(tmp_path, b"x")
    with pytest.raises(FragmentStoreError, match="missing"):
        await store.persist(frag, local)
    assert not (tmp_path / "missing").exists()  # Never created.


async def test_health_of_missing_bucket(moto_s3: MotoS3Server) -> None:
    url = f"s3://no-such-bucket-here/root/?endpoint={moto_s3.endpoint}&region=us-east-1"
    store = S3Store(url)
    with pytest.raises(FragmentStoreError, match="does not exist") as info:
        await store.health()
    assert url in str(info.value)


async def test_s3_unreachable_endpoint(tmp_path: Path, moto_s3: MotoS3Server) -> None:
    from gazette.testing.etcd import free_port

    url = f"s3://b/root/?endpoint=http://127.0.0.1:{free_port()}&region=us-east-1"
    store = S3Store(url)
    store._client.meta.config.retries = {"max_attempts": 0}
    frag, _ = spool(tmp_path, b"x")
    with pytest.raises(FragmentStoreError) as info:
        await store.exists(frag)
    assert "s3://b/root/" in str(info.value)


def test_store_for_url(tmp_path: Path, moto_s3: MotoS3Server) -> None:
    clear_store_cache()
    url = f"file://{tmp_path}/"
    a = store_for_url(url)
    assert isinstance(a, FileStore) and store_for_url(url) is a
    s3_url = f"s3://bucket/p/?endpoint={moto_s3.endpoint}&Region=us-east-1&storageClass=STANDARD"
    assert isinstance(store_for_url(s3_url), S3Store)
    assert isinstance(a, FragmentStore)

    bad: list[tuple[str, str]] = [
        ("gs://bucket/p/", "unsupported fragment store scheme"),
        (f"file://{tmp_path}", "must end in '/'"),
        (f"file://{tmp_path}/?nope=1", "unknown URL argument"),
        ("s3://bucket/p/?endpoint=x&endpoint=y", "repeated"),
        ("file://host/dir/", "no host"),
    ]
    for u, msg in bad:
        with pytest.raises(FragmentStoreError, match=msg):
            store_for_url(u)
    clear_store_cache()
