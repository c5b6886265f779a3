"""The runner's plan of faults: which run takes which faults, in what order, how often."""

from __future__ import annotations

import pytest
from fault_schedule import BY_NAME, FAULTS, UnknownFault, plan
from faults import ACTIONS


def test_full_run_takes_every_fault_once_in_order() -> None:
    assert plan() == [f.name for f in FAULTS]
    assert len(set(plan())) == len(FAULTS)


def test_quick_run_is_one_partition_and_one_broker_crash() -> None:
    assert plan(quick=True) == ["broker-crash", "isolate-host"]


@pytest.mark.parametrize(
    ("only", "trials", "expected"),
    [
        ("pause-host", 1, ["pause-host"]),
        ("split-2-3, etcd-crash", 1, ["split-2-3", "etcd-crash"]),
        ("etcd-crash,pause-host", 2, ["etcd-crash", "etcd-crash", "pause-host", "pause-host"]),
    ],
)
def test_faults_given_run_in_their_order_each_trials_times(
    only: str, trials: int, expected: list[str]
) -> None:
    assert plan(only=only, trials=trials) == expected
    assert plan(quick=True, only=only, trials=trials) == expected  # --faults wins


def test_unknown_faults_are_named() -> None:
    with pytest.raises(UnknownFault) as err:
        plan(only="etcd-crash,flood,zap")
    assert err.value.names == ["flood", "zap"]
    assert "known: etcd-crash" in str(err.value)


@pytest.mark.parametrize(("only", "trials"), [(",", 1), ("", 0)])
def test_an_empty_or_zero_plan_is_refused(only: str, trials: int) -> None:
    with pytest.raises(ValueError):
        plan(only=only, trials=trials)


def test_every_fault_has_an_action_and_says_what_it_tests() -> None:
    assert set(ACTIONS) == set(BY_NAME)
    assert all(f.tests.endswith(".") for f in FAULTS)
