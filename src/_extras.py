"""Optional parts of the package and the extras that install them.

A client-only install (``pip install gazette-py``) brings the client library, messages, the
recovery log and gazctl. Servers, stores and features each bring their dependencies through an
extra (pyproject.toml); a module that needs one calls `require` before importing it, so that a
missing extra fails with one line naming it instead of a bare ``No module named ...``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

__all__ = ["DISTRIBUTION", "MissingExtra", "broker_main", "consumer_main", "require"]

DISTRIBUTION = "gazette-py"
"""The name `pip install` knows the package by."""


class MissingExtra(ImportError):
    """A part of the package was imported without the extra that installs its dependencies."""

    def __init__(self, what: str, extra: str, missing: list[str]) -> None:
        super().__init__(
            f"{what} needs the '{extra}' extra (missing: {', '.join(missing)}): "
            f"pip install '{DISTRIBUTION}[{extra}]'",
            name=missing[0],
        )
        self.extra = extra
        self.missing = missing


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # A finder refused it.
        return False


def require(what: str, extra: str, *modules: str) -> None:
    """Raise `MissingExtra` naming `extra` unless every one of `modules` is importable."""
    missing = [m for m in modules if not _importable(m)]
    if missing:
        raise MissingExtra(what, extra, missing)


def _run(module: str, prog: str) -> None:
    """Run `module`'s ``main()``; a missing extra ends the command with one line, status 2."""
    try:
        main = importlib.import_module(module).main
    except MissingExtra as err:
        print(f"{prog}: {err}", file=sys.stderr)
        sys.exit(2)
    main()


def broker_main() -> None:
    """The ``gazette-broker`` command."""
    _run("gazette.broker.main", "gazette-broker")


def consumer_main() -> None:
    """The ``gazette-consumer`` command."""
    _run("gazette.consumer.main", "gazette-consumer")
