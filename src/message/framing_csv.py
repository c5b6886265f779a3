"""The `text/csv` framing: one RFC 4180 record per message, its first column the UUID.

Records are written as Go's encoding/csv writes them, which Gazette uses: fields separated by
",", a field quoted (with "" for a quote) when it holds a comma, a quote, a carriage return or
a newline, or begins with a space or tab, and each record ended by "\\n". The decoder accepts
"\\r\\n" endings too. A quoted field may span lines, so a frame is one whole record, not one
line.

Messages are objects with two methods (see `CSVFrameable`); the framing handles the UUID
column itself, through the message's `get_uuid` / `set_uuid`:

- `to_csv_row() -> list[str]`: the message's fields, after the UUID column.
- `load_csv_row(row: list[str]) -> None`: fill the message from those fields.

`message.csv_message.CSVMessage` implements both for dataclasses.

The decoder reports a record that is not well-formed CSV (a stray quote, text after a closing
quote), a blank line, or a record longer than `max_frame_size` as a Desync. An unterminated
quoted field swallows the lines after it until the size limit is reached; the decoder then
skips only the first line of the record and resumes after it.
"""

from __future__ import annotations

import csv
import uuid as _uuid
from typing import Protocol, runtime_checkable

from gazette.message.framing import (
    CONTENT_TYPE_CSV,
    DEFAULT_MAX_FRAME_SIZE,
    Desync,
    Frame,
    FrameDecoder,
    MarshalError,
    UnmarshalError,
    _register_builtin,
)

__all__ = ["CSVFraming", "CSVFrameable", "CSV_FRAMING", "format_csv_record", "parse_csv_record"]


@runtime_checkable
class CSVFrameable(Protocol):
    """What the CSV framing requires of a message (besides get_uuid / set_uuid)."""

    def to_csv_row(self) -> list[str]: ...

    def load_csv_row(self, row: list[str]) -> None: ...


def _quote(field: str) -> str:
    if (
        '"' in field
        or "," in field
        or "\n" in field
        or "\r" in field
        or field[:1].isspace()  # As Go's unicode.IsSpace: \v, \f, U+0085, U+00A0 too.
        or field == "\\."  # Go quotes it, for PostgreSQL's sake.
    ):
        return '"' + field.replace('"', '""') + '"'
    return field


def format_csv_record(fields: list[str]) -> str:
    """One CSV record, "\\n" included."""
    line = ",".join(fields)
    # Usually no field needs quoting, which a few scans of the whole line can tell.
    if (
        line.count(",") == len(fields) - 1
        and '"' not in line
        and "\n" not in line
        and "\r" not in line
        and "\\." not in line
        and not any(f[:1].isspace() for f in fields)
    ):
        if not line and len(fields) == 1:
            return '""\n'  # Not a blank line, which readers skip.
        return line + "\n"
    return ",".join([_quote(f) for f in fields]) + "\n"


def parse_csv_record(payload: bytes) -> list[str]:
    """The fields of one record (without its line ending); UnmarshalError if it's malformed."""
    try:
        text = payload.decode()
        if text and '"' not in text and "\n" not in text and "\r" not in text:
            return text.split(",")  # No quoted fields: nothing for a CSV parser to do.
        return next(csv.reader((text,), strict=True))
    except (ValueError, csv.Error, StopIteration) as exc:
        raise UnmarshalError(f"invalid CSV record: {exc or 'empty'}") from None


class CSVFraming:
    """Frames messages as CSV records. Use the registered instance, `CSV_FRAMING`."""

    content_type = CONTENT_TYPE_CSV

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        # (payload, fields) of the record the decoder parsed last; see JSONFraming._last.
        self._last: tuple[bytes, list[str]] | None = None

    def marshal(self, msg: object) -> bytes:
        try:
            to_row = msg.to_csv_row  # type: ignore[attr-defined]
            get_uuid = msg.get_uuid  # type: ignore[attr-defined]
        except AttributeError:
            raise MarshalError(
                f"{type(msg).__name__} lacks to_csv_row or get_uuid, as {self.content_type} "
                "requires"
            ) from None
        uid = get_uuid()
        row = to_row()
        try:
            return format_csv_record([str(uid) if uid is not None else "", *row]).encode()
        except (TypeError, ValueError) as exc:
            raise MarshalError(f"{type(msg).__name__}: bad CSV row {row!r}: {exc}") from exc

    def unmarshal(self, payload: bytes, msg: object) -> None:
        last = self._last
        if last is not None and last[0] is payload:
            self._last = None
            fields = last[1]
        else:
            fields = parse_csv_record(payload)
        try:
            load_row = msg.load_csv_row  # type: ignore[attr-defined]
            set_uuid = msg.set_uuid  # type: ignore[attr-defined]
        except AttributeError:
            raise UnmarshalError(
                f"{type(msg).__name__} lacks load_csv_row or set_uuid, as {self.content_type} "
                "requires"
            ) from None
        if fields[0]:
            try:
                uid = _uuid.UUID(fields[0])
            except ValueError:
                raise UnmarshalError(f"first CSV column {fields[0]!r} is not a UUID") from None
            set_uuid(uid)
        load_row(fields[1:])

    def decoder(self, offset: int = 0) -> FrameDecoder:
        return _RecordDecoder(self, offset, self.max_frame_size)


class _RecordDecoder(FrameDecoder):
    __slots__ = ("_framing", "_quotes")

    def __init__(self, framing: CSVFraming, offset: int, max_frame_size: int) -> None:
        super().__init__(offset, max_frame_size)
        self._framing = framing
        self._quotes = 0  # Quote characters in _buf[_pos:_scan].

    def reset(self, offset: int) -> None:
        super().reset(offset)
        self._quotes = 0

    def next_event(self) -> Frame | Desync | None:
        buf = self._buf
        pos = self._pos
        if self._skip_from is not None:
            nl = buf.find(b"\n", self._scan)
            if nl < 0:
                self._discard_all_but(0)
                return None
            self._quotes = 0
            return self._end_skip(nl + 1)

        # A newline ends the record if the quotes before it balance ("" inside a quoted field
        # counts twice), as only then is it outside any quoted field.
        scan = self._scan
        quotes = self._quotes
        while True:
            nl = buf.find(b"\n", scan)
            if nl < 0:
                self._quotes = quotes + buf.count(b'"', scan)
                self._scan = len(buf)
                if len(buf) - pos > self.max_frame_size:
                    return self._skip_first_line()
                return None
            quotes += buf.count(b'"', scan, nl)
            scan = nl + 1
            if not quotes & 1:
                break
        self._quotes = 0
        base = self._base
        self._pos = self._scan = scan
        if scan - pos > self.max_frame_size:
            self._pos = self._scan = pos
            return self._skip_first_line()

        end = nl - 1 if nl > pos and buf[nl - 1] == 0x0D else nl
        record = bytes(buf[pos:end])
        try:
            if not record:
                raise UnmarshalError("blank line")
            fields = parse_csv_record(record)
        except UnmarshalError as exc:
            return Desync(base + pos, base + scan, f"at offset {base + pos}: {exc}")
        self._framing._last = (record, fields)
        return Frame(base + pos, base + scan, record)

    def _skip_first_line(self) -> Frame | Desync | None:
        """Skip the oversized record's first line (it may open an unterminated quote)."""
        self._quotes = 0
        self._start_skip(
            f"record at offset {self._base + self._pos} is longer than {self.max_frame_size} bytes"
        )
        self._scan = self._pos
        return self.next_event()


CSV_FRAMING = CSVFraming()
_register_builtin(CSV_FRAMING)
