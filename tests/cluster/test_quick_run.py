"""The fault runner's quick schedule end to end: five namespace hosts, every process started
by the node script, stream-sum under load and an appender, one broker crash and one host
isolated; every stream summed exactly once, no acknowledged append lost, and the isolated
host's broker and summer fenced (about 90 s; 140 s with the machine's 2 cores loaded). The
same secured (``--secure``: TLS and authorization on) is marked `cluster`;
test_secured_cluster.py brings a secured cluster up in the default suite."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from node_cluster import NODE_SCRIPT, ROOT

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("nsenter") or not os.access(NODE_SCRIPT, os.X_OK),
    reason="needs root, nsenter and vagrant/provision/gazette-node",
)


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param([], id="plain"),
        pytest.param(["--secure"], id="secured", marks=pytest.mark.cluster),
    ],
)
def test_quick_fault_schedule_passes(flags: list[str]) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tools" / "cluster" / "run.py"), "--quick", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=280)
    except subprocess.TimeoutExpired:
        # SIGTERM first: the runner's Net tears its hosts down on it (namespaces, mounts,
        # processes); SIGKILL would leave them to the next Net's cleanup.
        proc.terminate()
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        pytest.fail(f"the quick run took over 280 s:\n{stdout[-6000:]}{stderr[-3000:]}")
    lines = stdout.strip().splitlines()
    assert proc.returncode == 0, stdout[-6000:] + stderr[-3000:]
    summary = json.loads(lines[-1])
    assert summary["ok"] is True
    faults = {f["fault"]: f for f in summary["faults"]}
    assert set(faults) == {"broker-crash", "isolate-host"}
    for f in faults.values():
        assert f["streams_verified"] == f["streams_expected"] > 0
        assert f["violations"] == 0 and f["acks_lost"] == 0 and f["acks_checked"] > 0
    # The isolated host's broker and summer were cut off past their leases, and fenced.
    isolated = faults["isolate-host"]
    assert isolated["zombies"] == 2 and isolated["zombies_fenced"] == 2, isolated
