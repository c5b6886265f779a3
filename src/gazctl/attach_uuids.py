"""``gazctl attach-uuids``: give each input line a fresh message UUID.

As Gazette's command: every line of each input file (stdin if none) is rendered through
``--template`` (default ``{{.UUID}},{{.Line}}`` plus a newline, i.e. a CSV row prefixed with its
UUID) to stdout. UUIDs are version-1 Gazette UUIDs of one new random producer, with a clock
that follows wall time and ticks per line, flagged OUTSIDE_TXN (committed: readers process
them at once). Attaching UUIDs to a file once, before appending it, makes the append safe to
retry: consumers drop the duplicates.

The template language is the subset of Go's text/template that the command's data offers:
the actions ``{{.UUID}}`` and ``{{.Line}}``; any other action is rejected.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Iterator
from typing import IO, Any

from gazette.gazctl.main import GazctlError, Streams
from gazette.message.uuid import (
    Flags,
    build_uuid,
    clock_from_unix_ns,
    new_producer_id,
    tick,
    update,
)

__all__ = ["register", "render_template", "DEFAULT_TEMPLATE"]

DEFAULT_TEMPLATE = "{{.UUID}},{{.Line}}\n"

_ACTION = re.compile(r"\{\{(.*?)\}\}", re.S)
_FIELDS = {"UUID", "Line"}


def register(groups: Any, common: argparse.ArgumentParser) -> None:
    """Add the ``attach-uuids`` command to the `groups` subparsers."""
    p = groups.add_parser(
        "attach-uuids",
        help="generate and attach UUIDs to text input records",
        description=__doc__,
    )
    p.add_argument(
        "--template",
        default=DEFAULT_TEMPLATE,
        help="output template with {{.UUID}} and {{.Line}} (default: %(default)r)",
    )
    p.add_argument(
        "--max-length",
        type=int,
        default=4 << 20,
        help="maximum byte length of an input line (default %(default)s)",
    )
    p.add_argument(
        "--skip-header", action="store_true", help="omit the first line of each input file"
    )
    p.add_argument("paths", nargs="*", metavar="/path/to/file", help="inputs (default: stdin)")
    p.set_defaults(handler=cmd_attach_uuids)


def compile_template(template: str) -> list[str]:
    """Split `template` into literal text (even indices) and field names (odd indices).

    Raises GazctlError for actions other than ``{{.UUID}}`` and ``{{.Line}}``.
    """
    parts: list[str] = []
    pos = 0
    for m in _ACTION.finditer(template):
        field = m.group(1).strip()
        if not field.startswith(".") or field[1:] not in _FIELDS:
            raise GazctlError(
                f"unsupported template action {m.group(0)!r} (use {{{{.UUID}}}}, {{{{.Line}}}})"
            )
        parts += [template[pos : m.start()], field[1:]]
        pos = m.end()
    if "{{" in template[pos:]:
        raise GazctlError(f"unclosed template action in {template!r}")
    parts.append(template[pos:])
    return parts


def render_template(parts: list[str], uuid: str, line: str) -> str:
    """Render compiled `parts` for one line."""
    values = {"UUID": uuid, "Line": line}
    return "".join(p if i % 2 == 0 else values[p] for i, p in enumerate(parts))


def _lines(f: IO[bytes], max_length: int, name: str) -> Iterator[bytes]:
    """Lines of `f` without their newline (and a trailing carriage return), like Go's
    bufio.ScanLines. Raises GazctlError for a line longer than `max_length`."""
    while True:
        line = f.readline(max_length + 2)
        if not line:
            return
        if line.endswith(b"\n"):
            line = line[:-1]
        elif len(line) > max_length:
            raise GazctlError(f"{name}: line longer than --max-length ({max_length} bytes)")
        if line.endswith(b"\r"):
            line = line[:-1]
        if len(line) > max_length:
            raise GazctlError(f"{name}: line longer than --max-length ({max_length} bytes)")
        yield line


async def cmd_attach_uuids(args: argparse.Namespace, io: Streams) -> int:
    parts = compile_template(args.template)
    producer = new_producer_id()
    clock = clock_from_unix_ns(time.time_ns())
    inputs: list[tuple[str, IO[bytes]]] = []
    try:
        for path in args.paths:
            inputs.append((path, open(path, "rb")))
        if not inputs:
            inputs.append(("stdin", io.stdin))
        out = io.stdout
        for name, f in inputs:
            interactive = f is io.stdin
            skip = args.skip_header
            for raw in _lines(f, args.max_length, name):
                if skip:
                    skip = False
                    continue
                clock = tick(update(clock))
                uuid = str(build_uuid(producer, clock, Flags.OUTSIDE_TXN))
                line = raw.decode("utf-8", "surrogateescape")
                out.write(render_template(parts, uuid, line).encode("utf-8", "surrogateescape"))
                if interactive:
                    out.flush()  # Records stream through pipelines as they arrive.
        out.flush()
    finally:
        for _, f in inputs:
            if f is not io.stdin:
                f.close()
    return 0
