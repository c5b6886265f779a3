"""The runner's results: trials combined per fault, the table, the JSON line, the exit status."""

from __future__ import annotations

import json

from trial_table import HEADER, TrialResult, exit_status, final_json, render, summarize


def passing(fault: str, recovery: float = 2.0) -> TrialResult:
    return TrialResult(
        fault,
        streams_verified=100,
        streams_expected=100,
        acks_checked=50,
        recovery_s=recovery,
        append_stall_s=recovery + 1,
    )


def test_trials_of_a_fault_combine_counts_summed_times_worst() -> None:
    results = [passing("etcd-crash", 1.0), passing("pause-host"), passing("etcd-crash", 4.0)]
    results[2].acks_checked = 80
    a, b = summarize(results)
    assert (a.fault, a.trials, a.streams_verified, a.recovery_s) == ("etcd-crash", 2, 200, 4.0)
    assert (a.acks_checked, a.append_stall_s) == (80, 5.0)
    assert (b.fault, b.trials) == ("pause-host", 1)
    assert a.ok and b.ok


def test_a_fault_that_did_not_converge_has_no_recovery_time() -> None:
    results = [passing("split-2-3"), passing("split-2-3")]
    results[1].recovery_s = None
    (s,) = summarize(results)
    assert s.recovery_s is None and not s.ok
    assert render([s]).splitlines()[2].split()[:7] == [
        "split-2-3",
        "2",
        "200/200",
        "0",
        "0/50",
        "-",
        "-",
    ]


def test_table_has_a_row_per_fault_under_the_header() -> None:
    lines = render(summarize([passing("etcd-crash"), passing("pause-host", 12.25)])).splitlines()
    assert lines[0].split("  ")[0] == "fault"
    assert set(lines[1]) == {"-", " "}
    assert lines[3].split() == [
        "pause-host", "1", "100/100", "0", "0/50", "-", "12.2", "13.2", "0",
    ]  # fmt: skip


def test_any_violation_lost_append_or_failure_fails_the_run() -> None:
    assert exit_status([passing("a"), passing("b")]) == 0
    assert exit_status([]) == 1
    for change in (
        {"violations": 1, "violation_kinds": {"duplicate": 1}},
        {"acks_lost": 1},
        {"zombies": 2, "zombies_fenced": 1},
        {"failures": ["chunker exited 1"]},
    ):
        bad = passing("b")
        for k, v in change.items():
            setattr(bad, k, v)
        results = [passing("a"), bad]
        assert exit_status(results) == 1
        doc = json.loads(final_json(results))
        assert doc["ok"] is False
        assert [f["ok"] for f in doc["faults"]] == [True, False]
        assert [t["fault"] for t in doc["trials"]] == ["a", "b"]


def test_violations_are_shown_by_kind() -> None:
    a, b = passing("pause-host"), passing("pause-host")
    a.violations, a.violation_kinds = 3, {"missing": 2, "duplicate": 1}
    b.violations, b.violation_kinds = 2, {"missing": 2}
    (s,) = summarize([a, b])
    assert s.violation_kinds == {"duplicate": 1, "missing": 4}
    assert "5 (1 duplicate, 4 missing)" in render([s])


def test_zombies_fenced_are_counted_over_trials_and_shown_of_those_made() -> None:
    a, b = passing("pause-host"), passing("pause-host")
    a.zombies = a.zombies_fenced = 2
    b.zombies, b.zombies_fenced = 2, 1
    (s,) = summarize([a, b])
    assert (s.zombies, s.zombies_fenced, s.ok) == (4, 3, False)
    row = render([s]).splitlines()[2].split()
    assert row[HEADER.index("zombies fenced")] == "3/4"
    (fenced,) = summarize([a])
    assert fenced.ok and "2/2" in render([fenced]).splitlines()[2].split()
    assert json.loads(final_json([a, b]))["faults"][0]["zombies_fenced"] == 3
