"""What a real `gazctl` process writes for the user (a read's output and offsets) is private
to them, 0600, even when started with a umask that lets others read (docs/file-modes.md)."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

from gazette.testing.broker import BrokerProcess
from tests.file_modes import OPEN_UMASK


def test_gazctl_writes_private_files(
    gazctl_broker: BrokerProcess, prefix: str, tmp_path: Path
) -> None:
    out, offsets = tmp_path / "content", tmp_path / "offsets.json"
    done = subprocess.run(
        [
            *(
                sys.executable,
                "-m",
                "gazette.gazctl",
                "journals",
                "read",
                "-l",
                f"name={prefix}none",
            ),
            *("--broker", gazctl_broker.endpoint, "-o", str(out), "--offsets-out", str(offsets)),
        ],
        capture_output=True,
        umask=OPEN_UMASK,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in (out, offsets)}
    assert modes == {"content": "0o600", "offsets.json": "0o600"}
