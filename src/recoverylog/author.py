"""Authors: the random identities of processes which write a recovery log.

Each Recorder (and each Player injecting a hand-off) writes as an Author. Hints
name the author of every Segment, which lets a reader pick the branch of
history the hints were built from. An author also fences the log: appends
check the journal register ``author=<author in base 32>``, which a new author
replaces, so a zombie recorder's appends fail.
"""

from __future__ import annotations

import secrets

from gazette.broker.protocol import protocol_pb2 as pb

__all__ = ["AUTHOR_LABEL", "author_fence", "format_author", "new_author"]

AUTHOR_LABEL = "author"
_DIGITS = "0123456789abcdefghijklmnopqrstuv"


def new_author() -> int:
    """A random author in [1, 2**32 - 1] (zero means "no author")."""
    return secrets.randbelow(0xFFFFFFFF) + 1


def format_author(author: int) -> str:
    """`author` in lower-case base 32, as Go's ``strconv.FormatUint(author, 32)``."""
    if not 0 <= author <= 0xFFFFFFFF:
        raise ValueError(f"author {author} is not a uint32")
    out = []
    while True:
        author, digit = divmod(author, 32)
        out.append(_DIGITS[digit])
        if not author:
            return "".join(reversed(out))


def author_fence(author: int) -> pb.LabelSet:
    """The journal register which fences appends to `author`'s."""
    return pb.LabelSet(labels=[pb.Label(name=AUTHOR_LABEL, value=format_author(author))])
