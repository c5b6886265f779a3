"""The member processes' garbage-collector settings (mainboilerplate.gc_tuning), checked in
child interpreters: freezing objects is process-wide."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = """
import gc, json
from gazette.mainboilerplate import gc_tuning
before = gc.get_threshold()
changed = gc_tuning.tune()
print(json.dumps({"changed": changed, "frozen": gc.get_freeze_count(),
                  "before": before, "after": gc.get_threshold()}))
"""


def _probe(**env: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_tune_freezes_what_is_imported_and_raises_the_young_threshold() -> None:
    got = _probe(GAZETTE_GC="")
    assert got["changed"] is True
    assert isinstance(got["frozen"], int) and got["frozen"] > 1000
    before, after = got["before"], got["after"]
    assert isinstance(before, list) and isinstance(after, list)
    assert after == [20_000, before[1], before[2]]


def test_gazette_gc_default_keeps_pythons_settings() -> None:
    got = _probe(GAZETTE_GC="default")
    assert got["changed"] is False and got["frozen"] == 0 and got["after"] == got["before"]


MEMBER = """
import gc
from gazette.mainboilerplate.process import run_main

async def main(cfg):
    print(gc.get_freeze_count(), gc.get_threshold()[0])

run_main("probe", lambda: None, lambda cfg: "warning", main, fenced=LookupError,
         on_fenced=lambda cfg, err: None)
"""


def test_member_processes_tune_before_they_run() -> None:
    out = subprocess.run(
        [sys.executable, "-c", MEMBER], capture_output=True, text=True, timeout=60, check=True
    )
    frozen, young = map(int, out.stdout.split())
    assert frozen > 1000 and young == 20_000
