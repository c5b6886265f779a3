"""Validation errors of broker protocol messages.

A `ValidationError` describes one problem with a message, and the path of
fields which lead to it. Validators of nested messages raise errors naming only
their own fields; each enclosing validator prepends the field it descended
through, so that the caller sees the full path, e.g.::

    Changes[0].Upsert.Fragment.Length: invalid value (1; expected 1024 <= Length <= 17179869184)

The path is built with `ValidationError.extend` or, more conveniently, the
`context` manager.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ValidationError", "context"]


class ValidationError(ValueError):
    """A message, or a value within one, is not well-formed.

    `context` is the path of fields leading to the bad value, outermost first;
    `message` describes the problem and quotes the bad value.
    """

    def __init__(self, message: str, context: list[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.context: list[str] = list(context) if context else []

    def extend(self, outer: str) -> ValidationError:
        """Prepend the field `outer` to this error's context, and return the error."""
        self.context.insert(0, outer)
        return self

    def __str__(self) -> str:
        if self.context:
            return ".".join(self.context) + ": " + self.message
        return self.message

    def __repr__(self) -> str:
        return f"ValidationError({str(self)!r})"

    def __reduce__(self) -> tuple[type[ValidationError], tuple[str, list[str]]]:
        return (ValidationError, (self.message, self.context))


@contextmanager
def context(outer: str) -> Iterator[None]:
    """Prepend `outer` to the context of any ValidationError raised in the block.

    Other exceptions pass through untouched.
    """
    try:
        yield
    except ValidationError as err:
        err.extend(outer)
        raise
