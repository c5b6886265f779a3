"""`make demo SECURE=1`: the whole demo (a three-broker journal through a broker's SIGKILL,
word-count's consumers with standbys through a primary's SIGKILL, their query API, the Spark
export) with TLS and authorization on everywhere, run as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_secured_demo_runs_end_to_end() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "demo.py"), "--secure", "--lines", "1000"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    out = proc.stdout
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "secured: certificates and an auth key made for the run" in out
    # Brokers advertise https:// routes; every read-back was identical after the kill.
    assert "https://127.0.0.1:" in out
    assert out.count(" bytes, identical") == 3
    # The consumers' counts are exact through the query API (one consumer proxying) and in
    # the Spark export, all over TLS with signed calls.
    assert out.count("bigram counts equal those computed from the text") == 3
    assert "proxied (" in out
    assert out.rstrip().endswith("All of it with TLS and authorization on.")
