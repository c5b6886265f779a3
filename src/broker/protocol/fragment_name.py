"""Names of fragment files within fragment stores.

A persisted fragment is content-addressed by its content name::

    <begin as %016x>-<end as %016x>-<SHA1 of uncompressed content as 40 hex><extension>

and stored under ``<store URL path><journal>/[<path postfix>/]<content name>``.
The extension names the compression codec. Names are parsed back into
Fragments when listing stores, so Go and Python brokers share one index.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gazette.broker.protocol import protocol_pb2 as pb
from gazette.broker.protocol.errors import ValidationError
from gazette.broker.protocol.sha1sum import sha1sum_from_hex, sha1sum_hex
from gazette.broker.protocol.validation import validate_fragment

__all__ = [
    "CODEC_EXTENSIONS",
    "codec_extension",
    "codec_from_extension",
    "content_name",
    "content_path",
    "parse_content_name",
    "parse_content_path",
    "parse_relative_path",
]

# Extension written for each codec. GZIP_OFFLOAD_DECOMPRESSION has none: its
# files are plain gzip, served with Content-Encoding gzip so that clients
# receive them decompressed.
CODEC_EXTENSIONS: Mapping[int, str] = MappingProxyType(
    {
        pb.NONE: ".raw",
        pb.GZIP: ".gz",
        pb.ZSTANDARD: ".zst",
        pb.SNAPPY: ".sz",
        pb.GZIP_OFFLOAD_DECOMPRESSION: "",
    }
)

# Extensions accepted when parsing: those written, plus long forms and ".gzod",
# which Gazette also reads.
_EXTENSION_CODECS: Mapping[str, int] = MappingProxyType(
    {
        ".raw": pb.NONE,
        ".gz": pb.GZIP,
        ".gzip": pb.GZIP,
        ".zst": pb.ZSTANDARD,
        ".zstandard": pb.ZSTANDARD,
        ".sz": pb.SNAPPY,
        ".snappy": pb.SNAPPY,
        "": pb.GZIP_OFFLOAD_DECOMPRESSION,
        ".gzod": pb.GZIP_OFFLOAD_DECOMPRESSION,
    }
)

_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_MAX_OFFSET = (1 << 63) - 1


def codec_extension(codec: int) -> str:
    """The file extension written for `codec`. Raises ValidationError for
    INVALID or an unknown value."""
    try:
        return CODEC_EXTENSIONS[codec]
    except KeyError:
        raise ValidationError(f"no extension for CompressionCodec ({codec})") from None


def codec_from_extension(ext: str) -> pb.CompressionCodec.ValueType:
    """The codec of a file extension (with its '.', case-insensitive; ``""`` is
    GZIP_OFFLOAD_DECOMPRESSION). Raises ValidationError if unrecognized."""
    try:
        return pb.CompressionCodec.ValueType(_EXTENSION_CODECS[ext.lower()])
    except KeyError:
        raise ValidationError(f"unrecognized compression extension ({ext!r})") from None


def content_name(fragment: pb.Fragment) -> str:
    """The content-addressed file name of `fragment`."""
    return (
        f"{fragment.begin:016x}-{fragment.end:016x}-{sha1sum_hex(fragment.sum)}"
        f"{codec_extension(fragment.compression_codec)}"
    )


def content_path(fragment: pb.Fragment) -> str:
    """The path of `fragment` relative to its store's root:
    journal, then the path postfix if any, then the content name."""
    postfix = fragment.path_postfix + "/" if fragment.path_postfix else ""
    return f"{fragment.journal}/{postfix}{content_name(fragment)}"


def _parse_offset(text: str, field: str) -> int:
    if not 1 <= len(text) <= 16 or not _HEX_DIGITS.issuperset(text):
        raise ValidationError(f"not an offset of 1 to 16 hex digits ({text!r})", [field])
    value = int(text, 16)
    if value > _MAX_OFFSET:
        raise ValidationError(f"offset overflows int64 ({text!r})", [field])
    return value


def _parse(journal: str, postfix: str, name: str) -> pb.Fragment:
    dot = name.rfind(".")
    stem, ext = (name[:dot], name[dot:]) if dot != -1 else (name, "")
    fields = stem.split("-")
    if len(fields) != 3:
        raise ValidationError(
            f"not a fragment content name ({name!r}; expected <begin>-<end>-<sha1><ext>)"
        )
    fragment = pb.Fragment(
        journal=journal,
        begin=_parse_offset(fields[0], "Begin"),
        end=_parse_offset(fields[1], "End"),
        compression_codec=codec_from_extension(ext),
        path_postfix=postfix,
    )
    try:
        fragment.sum.CopyFrom(sha1sum_from_hex(fields[2]))
    except ValidationError as err:
        raise err.extend("Sum") from None
    validate_fragment(fragment)
    return fragment


def parse_content_name(journal: str, name: str) -> pb.Fragment:
    """Parse the Fragment of `journal` named by a bare content name.

    Raises ValidationError if the name is malformed: not three '-' separated
    fields, offsets that aren't hex or overflow, a sum that isn't 40 hex digits,
    an unknown extension, or Begin > End.
    """
    if "/" in name:
        raise ValidationError(f"content name cannot contain '/' ({name!r})")
    return _parse(journal, "", name)


def parse_relative_path(journal: str, path: str) -> pb.Fragment:
    """Parse the Fragment of `journal` from its path relative to the journal's
    directory: an optional path postfix, then the content name."""
    postfix, sep, name = path.rpartition("/")
    if sep and not postfix:
        raise ValidationError(f"empty path postfix ({path!r})", ["PathPostfix"])
    return _parse(journal, postfix, name)


def parse_content_path(journal: str, path: str) -> pb.Fragment:
    """Parse the Fragment of `journal` from its `content_path`
    (``journal/[postfix/]name``). Raises ValidationError if the path is not
    under the journal's directory or is malformed."""
    if not path.startswith(journal + "/"):
        raise ValidationError(f"path is not under journal {journal!r} ({path!r})")
    return parse_relative_path(journal, path[len(journal) + 1 :])
