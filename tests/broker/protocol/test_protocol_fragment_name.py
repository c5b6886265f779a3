"""Tests of fragment content names and paths."""

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gazette.broker.protocol import (
    CODEC_EXTENSIONS,
    ValidationError,
    codec_extension,
    codec_from_extension,
    content_name,
    content_path,
    parse_content_name,
    parse_content_path,
    parse_relative_path,
    pb,
    sha1sum_from_digest,
    sha1sum_of,
)

HELLO_HEX = "aaf4c61ddcc5e8a2dabede0f3b482cd9aea9434d"


def hello_fragment(codec: int = pb.NONE, postfix: str = "") -> pb.Fragment:
    return pb.Fragment(
        journal="a/journal",
        begin=0x1234,
        end=0x5678,
        sum=sha1sum_from_digest(hashlib.sha1(b"hello").digest()),
        compression_codec=codec,  # type: ignore[arg-type]
        path_postfix=postfix,
    )


def test_golden_content_name() -> None:
    assert content_name(hello_fragment()) == (
        "0000000000001234-0000000000005678-aaf4c61ddcc5e8a2dabede0f3b482cd9aea9434d.raw"
    )


@pytest.mark.parametrize(
    "codec, ext",
    [
        (pb.NONE, ".raw"),
        (pb.GZIP, ".gz"),
        (pb.ZSTANDARD, ".zst"),
        (pb.SNAPPY, ".sz"),
        (pb.GZIP_OFFLOAD_DECOMPRESSION, ""),
    ],
)
def test_codec_extensions(codec: int, ext: str) -> None:
    assert codec_extension(codec) == ext
    assert CODEC_EXTENSIONS[codec] == ext
    assert codec_from_extension(ext) == codec
    assert content_name(hello_fragment(codec)) == (
        f"0000000000001234-0000000000005678-{HELLO_HEX}{ext}"
    )


@pytest.mark.parametrize(
    "ext, codec",
    [
        (".gzip", pb.GZIP),
        (".GZ", pb.GZIP),
        (".zstandard", pb.ZSTANDARD),
        (".snappy", pb.SNAPPY),
        (".gzod", pb.GZIP_OFFLOAD_DECOMPRESSION),
        (".RAW", pb.NONE),
    ],
)
def test_legacy_extensions_parse(ext: str, codec: int) -> None:
    assert codec_from_extension(ext) == codec
    frag = parse_content_name("a/journal", f"0000000000001234-0000000000005678-{HELLO_HEX}{ext}")
    assert frag.compression_codec == codec


def test_codec_extension_errors() -> None:
    with pytest.raises(ValidationError, match=r"no extension for CompressionCodec \(0\)"):
        codec_extension(pb.INVALID)
    with pytest.raises(ValidationError, match=r"unrecognized compression extension \('.bz2'\)"):
        codec_from_extension(".bz2")


def test_content_path() -> None:
    assert content_path(hello_fragment()) == (
        f"a/journal/0000000000001234-0000000000005678-{HELLO_HEX}.raw"
    )
    frag = hello_fragment(pb.GZIP, postfix="date=2024-01-02/hour=03")
    path = f"a/journal/date=2024-01-02/hour=03/0000000000001234-0000000000005678-{HELLO_HEX}.gz"
    assert content_path(frag) == path
    assert parse_content_path("a/journal", path) == frag
    assert parse_relative_path("a/journal", path[len("a/journal/") :]) == frag


def test_parse_golden() -> None:
    frag = parse_content_name("a/journal", f"00000000499602d2-7fffffffffffffff-{HELLO_HEX}.gz")
    assert frag == pb.Fragment(
        journal="a/journal",
        begin=1234567890,
        end=(1 << 63) - 1,
        sum=sha1sum_of(b"hello"),
        compression_codec=pb.GZIP,
    )
    # Upper-case hex and unpadded offsets are read too.
    frag = parse_content_name("a/journal", f"0-A-{HELLO_HEX.upper()}.raw")
    assert (frag.begin, frag.end) == (0, 10)


@pytest.mark.parametrize(
    "name, error",
    [
        (
            f"0000000000001234-0000000000005678-{HELLO_HEX}.bz2",
            "unrecognized compression extension",
        ),
        (f"0000000000005678-0000000000001234-{HELLO_HEX}.raw", "End: expected Begin <= End"),
        (
            f"000000000000123g-0000000000005678-{HELLO_HEX}.raw",
            "Begin: not an offset of 1 to 16 hex",
        ),
        (f"-0000000000005678-{HELLO_HEX}.raw", "Begin: not an offset of 1 to 16 hex digits ('')"),
        (f"+1-2-{HELLO_HEX}.raw", "Begin: not an offset of 1 to 16 hex digits ('+1')"),
        (f"1-0x2-{HELLO_HEX}.raw", "End: not an offset"),
        (f"1-8000000000000000-{HELLO_HEX}.raw", "End: offset overflows int64"),
        (f"1-00000000000000002-{HELLO_HEX}.raw", "End: not an offset of 1 to 16 hex"),
        ("1-2-abcd.raw", "Sum: not a SHA1 sum of 40 hex digits ('abcd')"),
        (f"1-2-{HELLO_HEX[:-1]}z.raw", "Sum: not a SHA1 sum"),
        (f"1-2-{HELLO_HEX}-4.raw", "not a fragment content name"),
        ("", "not a fragment content name"),
        (f"x/1-2-{HELLO_HEX}.raw", "content name cannot contain '/'"),
    ],
)
def test_parse_content_name_errors(name: str, error: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_content_name("a/journal", name)
    assert error in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "journal, path, error",
    [
        ("a/journal", f"b/journal/1-2-{HELLO_HEX}.raw", "path is not under journal 'a/journal'"),
        ("a/journal", f"a/journalx/1-2-{HELLO_HEX}.raw", "path is not under journal"),
        ("a/journal", f"a/journal//1-2-{HELLO_HEX}.raw", "PathPostfix: empty path postfix"),
        ("a/journal", f"a/journal/x//y/1-2-{HELLO_HEX}.raw", "PathPostfix: must be a clean path"),
        ("a/journal", f"a/journal/../1-2-{HELLO_HEX}.raw", "PathPostfix: must be a clean path"),
        ("bad", f"bad/1-2-{HELLO_HEX}.raw", "Journal: invalid length (3;"),
    ],
)
def test_parse_content_path_errors(journal: str, path: str, error: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_content_path(journal, path)
    assert error in str(info.value), str(info.value)


_OFFSETS = st.integers(min_value=0, max_value=(1 << 63) - 1)
_POSTFIX = st.sampled_from(["", "a=1", "date=2024-01-01/hour=00", "x%20y"])


@given(
    st.tuples(_OFFSETS, _OFFSETS).map(sorted),
    st.binary(min_size=20, max_size=20),
    st.sampled_from(sorted(CODEC_EXTENSIONS)),
    _POSTFIX,
)
def test_content_name_round_trip(span: list[int], digest: bytes, codec: int, postfix: str) -> None:
    frag = pb.Fragment(
        journal="some/journal",
        begin=span[0],
        end=span[1],
        sum=sha1sum_from_digest(digest),
        compression_codec=codec,  # type: ignore[arg-type]
        path_postfix=postfix,
    )
    name = content_name(frag)
    assert len(name) == 16 + 1 + 16 + 1 + 40 + len(CODEC_EXTENSIONS[codec])
    assert parse_content_path("some/journal", content_path(frag)) == frag
    bare = pb.Fragment()
    bare.CopyFrom(frag)
    bare.path_postfix = ""
    assert parse_content_name("some/journal", name) == bare


@given(st.text())
def test_parse_random_names_raise_only_validation_error(name: str) -> None:
    for fn in (parse_content_name, parse_relative_path, parse_content_path):
        try:
            fn("a/journal", name)
        except ValidationError:
            pass
