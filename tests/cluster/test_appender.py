"""The appender's bounds: it does not outlive `--max-seconds` nor its parent, even with an
append retrying against a broker that does not answer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from node_cluster import ROOT

APPENDER = ROOT / "tools" / "cluster" / "appender.py"
NOWHERE = "127.0.0.1:9"  # Nothing listens: every append attempt fails and is retried.


def argv(log: Path, *extra: str) -> list[str]:
    return [
        sys.executable, str(APPENDER), "--broker", NOWHERE, "--journal", "a/journal",
        "--log", str(log), *extra,
    ]  # fmt: skip


def test_it_stops_after_max_seconds(tmp_path: Path) -> None:
    t0 = time.monotonic()
    r = subprocess.run(
        argv(tmp_path / "acks.jsonl", "--max-seconds", "1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "0 appends acknowledged; --max-seconds 1 reached" in r.stdout
    assert time.monotonic() - t0 < 30


def test_it_stops_once_its_parent_is_gone(tmp_path: Path) -> None:
    # A parent that starts the appender, says its pid, and exits without stopping it, once
    # the appender has taken note of its parent (it opens its acks file after that; its
    # imports may take seconds on a loaded machine).
    out, acks = tmp_path / "appender.out", tmp_path / "acks.jsonl"
    parent = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        p = subprocess.Popen({argv(acks)!r}, stdout=open({str(out)!r}, "w"),
                             stderr=subprocess.STDOUT)
        print(p.pid, flush=True)
        deadline = time.monotonic() + 60
        while not os.path.exists({str(acks)!r}) and time.monotonic() < deadline:
            time.sleep(0.05)
        """
    )
    r = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    pid = int(r.stdout)
    deadline = time.monotonic() + 20
    while Path(f"/proc/{pid}").exists() and _state(pid) != "Z":
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"appender {pid} still ran 20 s after its parent exited")
        time.sleep(0.2)
    assert "0 appends acknowledged; parent" in out.read_text()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
