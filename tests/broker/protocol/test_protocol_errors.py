"""Tests of ValidationError and its context path."""

import pickle

import pytest

from gazette.broker.protocol import ValidationError, context


def test_message_without_context() -> None:
    err = ValidationError("invalid value (1)")
    assert str(err) == "invalid value (1)"
    assert isinstance(err, ValueError)


def test_extend_prepends_outermost_first() -> None:
    err = ValidationError("invalid length (1; expected 1024)", ["Length"])
    err.extend("Fragment").extend("Spec")
    assert str(err) == "Spec.Fragment.Length: invalid length (1; expected 1024)"
    assert err.context == ["Spec", "Fragment", "Length"]
    assert err.message == "invalid length (1; expected 1024)"


def test_context_manager_nests() -> None:
    with pytest.raises(ValidationError) as info:
        with context("Changes[0]"):
            with context("Upsert"):
                raise ValidationError("bad", ["Name"])
    assert str(info.value) == "Changes[0].Upsert.Name: bad"


def test_context_manager_ignores_other_errors() -> None:
    with pytest.raises(KeyError):
        with context("Outer"):
            raise KeyError("x")


def test_pickle_round_trip() -> None:
    err = ValidationError("bad", ["A", "B"])
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == "A.B: bad"
