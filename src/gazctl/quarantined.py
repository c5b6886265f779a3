"""``gazctl journals quarantined``: the spools a broker set aside instead of publishing.

A broker quarantines a spool of a journal it no longer serves when its bytes differ from the
journal's (broker.quarantine): it lies under ``<spool-dir>/quarantine/<journal>/`` on that
broker's machine, with a ``.reason`` record beside it. This command lists them from a spool
directory, so it runs where the broker runs, as the broker's user (the files are private).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gazette.broker.quarantine import list_quarantined
from gazette.gazctl.main import GazctlError, Streams

HELP = "list spools a broker set aside because they conflict with their journal"


def add_journals_quarantined(cmds: Any, common: argparse.ArgumentParser) -> None:
    """Add ``journals quarantined`` to the `cmds` subparsers."""
    p: argparse.ArgumentParser = cmds.add_parser(
        "quarantined",
        help=HELP,
        description=HELP
        + ". Each is plain journal content from its begin offset; an operator may read it and "
        "re-append what should be kept. Reads the broker's spool directory (on its machine).",
        parents=[common],
    )
    p.add_argument(
        "--spool-dir",
        default=os.environ.get("BROKER_SPOOL_DIR", ""),
        help="the broker's --spool-dir (env BROKER_SPOOL_DIR)",
    )
    p.add_argument(
        "-o", "--format", choices=("table", "json"), default="table", help="output format"
    )
    p.set_defaults(handler=cmd_journals_quarantined)


async def cmd_journals_quarantined(args: argparse.Namespace, io: Streams) -> int:
    if not args.spool_dir:
        raise GazctlError("give the broker's spool directory: --spool-dir (or BROKER_SPOOL_DIR)")
    spool_dir = Path(args.spool_dir)
    if not spool_dir.is_dir():
        raise GazctlError(f"spool directory {spool_dir} does not exist")
    found = list_quarantined(spool_dir)
    if args.format == "json":
        for q in found:
            io.out(json.dumps({**asdict(q), "path": str(q.path)}))
        return 0
    if not found:
        io.err(f"no quarantined spools under {spool_dir}")
        return 0
    io.out(f"{'JOURNAL':<32} {'BEGIN':>14} {'END':>14}  {'QUARANTINED':<20}  REASON")
    for q in found:
        io.out(f"{q.journal:<32} {q.begin:>14} {q.end:>14}  {q.quarantined_at:<20}  {q.reason}")
        io.out(f"{'':<32} {q.path}")
    return 0
