"""The FSM: validates the sequence of RecordedOps of a recovery log.

Every op carries the seq_no and checksum the FSM expects next. Applying an op
steps the FSM to seq_no + 1 and checksum = CRC-32C(checksum, op bytes), where
the op bytes are its marshaled RecordedOp as framed in the log (neither the
8-byte frame header nor a Write's payload). An op that does not continue that
chain (a duplicate, or an op of a concurrent "zombie" recorder) is rejected,
which is how readers of a log agree on a single linear history.

The FSM tracks Fnodes (files across their links, identified by the seq_no of
the op which created them), the links (paths) of each, small "property" files,
and the log Segments holding each live Fnode's ops, from which it builds
FSMHints. An FSM built from hints accepts only the hinted authors' ops until
the hinted segments are consumed, and tracks only the hinted Fnodes, so that
dead branches of the log's history and files deleted later are skipped.

The FSM does no I/O; it is fed ops by a Recorder (its own ops) or a Player (the
ops it reads). It is not thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from gazette.recoverylog import _crc32c
from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.segments import InvalidHints, copy_segment, live_log_segments

__all__ = [
    "FSM",
    "ChecksumMismatch",
    "ExpectedHintedFnode",
    "FSMError",
    "FnodeNotTracked",
    "FnodeState",
    "LinkExists",
    "NoSuchLink",
    "NotHintedAuthor",
    "PropertyExists",
    "WrongChecksum",
    "WrongSeqNo",
]


class FSMError(Exception):
    """An op which the FSM did not apply as a tracked state transition.

    `transitioned` tells whether the FSM nevertheless stepped to the next
    seq_no and checksum: True only for `FnodeNotTracked`, where the op is a
    consistent part of the log's history but concerns a file the hints say is
    deleted later (callers skip the op's local effects). For every other error
    the FSM is unchanged.
    """

    transitioned: ClassVar[bool] = False

    def __init__(self, message: str, seq_no: int) -> None:
        super().__init__(f"{message} (seq_no {seq_no})")
        self.seq_no = seq_no


class NotHintedAuthor(FSMError):
    """Hints remain, and the op's author is not the next hinted author.

    The op may be sequenced correctly, but it is of a branch of history which
    the hints (built from the history that won) did not keep.
    """

    def __init__(self, seq_no: int, author: int, hinted: int) -> None:
        super().__init__(
            f"op author {author:#010x} does not match the next hinted author {hinted:#010x}",
            seq_no,
        )
        self.author = author
        self.hinted = hinted


class WrongSeqNo(FSMError):
    """The op's seq_no is not the next expected one.

    An op `behind` the expected seq_no is already covered: a duplicate, or read
    from before the hinted first offset (which is a lower bound), or skipped by
    hints. An op ahead of it means ops are missing from what was read.
    """

    def __init__(self, seq_no: int, expected: int) -> None:
        super().__init__(f"wrong sequence number, expected {expected}", seq_no)
        self.expected = expected

    @property
    def behind(self) -> bool:
        return self.seq_no < self.expected


class WrongChecksum(FSMError):
    """The op's checksum is not the FSM's: it continues another history."""

    def __init__(self, seq_no: int, checksum: int, expected: int) -> None:
        super().__init__(f"checksum mismatch: {checksum:#010x} != {expected:#010x}", seq_no)
        self.checksum = checksum
        self.expected = expected


ChecksumMismatch = WrongChecksum  # Upstream's name.


class ExpectedHintedFnode(FSMError):
    """Hints say a file is created at this seq_no, but the op is not a create."""

    def __init__(self, seq_no: int) -> None:
        super().__init__("op is not create, and an Fnode was hinted", seq_no)


class FnodeNotTracked(FSMError):
    """The op concerns an Fnode the FSM does not track.

    Raised *after* the FSM stepped past the op (see `FSMError.transitioned`):
    either the Fnode is not live, or (with hints) the create is of a file the
    hints don't list, because it's deleted before the hints were built.
    """

    transitioned: ClassVar[bool] = True

    def __init__(self, seq_no: int, fnode: int) -> None:
        super().__init__(f"fnode {fnode} not tracked", seq_no)
        self.fnode = fnode


class LinkExists(FSMError):
    """A create, link or property names a path which is already a link."""

    def __init__(self, seq_no: int, path: str) -> None:
        super().__init__(f"link exists: {path!r}", seq_no)
        self.path = path


class NoSuchLink(FSMError):
    """An unlink names a path which is not a link of the Fnode."""

    def __init__(self, seq_no: int, fnode: int, path: str) -> None:
        super().__init__(f"fnode {fnode} has no such link: {path!r}", seq_no)
        self.fnode = fnode
        self.path = path


class PropertyExists(FSMError):
    """A create or link names a path which is a property."""

    def __init__(self, seq_no: int, path: str) -> None:
        super().__init__(f"property exists: {path!r}", seq_no)
        self.path = path


@dataclass(slots=True, eq=True)
class FnodeState:
    """A live Fnode: its current links, and the Segments holding its ops."""

    links: set[str] = field(default_factory=set)
    segments: list[rpb.Segment] = field(default_factory=list)


class FSM:
    """A finite state machine over RecordedOps (see the module docstring).

    Public state, to be read and not modified except through `apply`:

    - `next_seq_no`, `next_checksum`: what the next op must carry.
    - `last_log`: the log of the last applied op (or of the hints).
    - `properties`: path -> content of property files.
    - `live_nodes`: Fnode -> `FnodeState`.
    - `links`: path -> Fnode of every live link.
    """

    __slots__ = (
        "next_seq_no",
        "next_checksum",
        "last_log",
        "properties",
        "live_nodes",
        "links",
        "_hinted_segments",
        "_hinted_fnodes",
    )

    def __init__(self, log: str = "") -> None:
        """An FSM expecting the first op of a log (seq_no 1, checksum 0)."""
        self.next_seq_no = 1
        self.next_checksum = 0
        self.last_log = log
        self.properties: dict[str, str] = {}
        self.live_nodes: dict[int, FnodeState] = {}
        self.links: dict[str, int] = {}
        # Remaining hints, consumed from the end (so both are stored reversed).
        self._hinted_segments: list[rpb.Segment] = []
        self._hinted_fnodes: list[int] = []

    @classmethod
    def from_hints(cls, hints: rpb.FSMHints) -> FSM:
        """An FSM which rebuilds the state `hints` were built from.

        It expects first the first op of the first hinted segment, accepts only
        hinted authors while hinted segments remain, and tracks only hinted
        Fnodes while hinted Fnodes remain. Raises `InvalidHints` (or a segment
        error) for hints which are not consistent.
        """
        if not hints.log:
            raise InvalidHints("hinted log not provided")
        fnodes, segments = live_log_segments(hints)
        fsm = cls(hints.log)
        fsm._hinted_fnodes = fnodes[::-1]
        if len(segments):
            fsm._hinted_segments = [copy_segment(s) for s in reversed(segments)]
            fsm.next_seq_no = segments[0].first_seq_no
            fsm.next_checksum = segments[0].first_checksum
        for p in hints.properties:
            fsm.properties[p.path] = p.content
        return fsm

    @property
    def hinted_segments(self) -> list[rpb.Segment]:
        """The hinted segments not yet fully applied, in log order (copies)."""
        return [copy_segment(s) for s in reversed(self._hinted_segments)]

    @property
    def next_hinted_segment(self) -> rpb.Segment | None:
        """The hinted segment being applied (a Player seeks to its first_offset)."""
        return copy_segment(self._hinted_segments[-1]) if self._hinted_segments else None

    def has_remaining_hints(self) -> bool:
        """Whether hinted segments or hinted Fnodes remain to be applied."""
        return bool(self._hinted_segments or self._hinted_fnodes)

    def apply(self, op: rpb.RecordedOp, frame: bytes | bytearray | memoryview) -> None:
        """Step the FSM by `op`, whose marshaled bytes (as read from the log) are `frame`.

        Checks, in order: the hinted author (while hints remain), seq_no,
        checksum, then the rules of the op's kind. Raises an `FSMError`
        subclass if the op is not applied; the FSM is then unchanged, except
        for `FnodeNotTracked` (see `FSMError.transitioned`). The op's meta-fields
        `log`, `first_offset` and `last_offset` locate it for the Segments it
        extends.
        """
        seq_no = op.seq_no
        hinted = self._hinted_segments
        if hinted and hinted[-1].author != op.author:
            raise NotHintedAuthor(seq_no, op.author, hinted[-1].author)
        if seq_no != self.next_seq_no:
            raise WrongSeqNo(seq_no, self.next_seq_no)
        if op.checksum != self.next_checksum:
            raise WrongChecksum(seq_no, op.checksum, self.next_checksum)

        # Each _apply_* leaves the FSM unchanged when it raises, unless what it
        # raises is FnodeNotTracked.
        not_tracked: FnodeNotTracked | None = None
        try:
            if op.HasField("create"):
                self._apply_create(op)
            elif self._hinted_fnodes and self._hinted_fnodes[-1] == seq_no:
                raise ExpectedHintedFnode(seq_no)
            elif op.HasField("link"):
                self._apply_link(op)
            elif op.HasField("unlink"):
                self._apply_unlink(op)
            elif op.HasField("write"):
                self._apply_write(op)
            elif op.HasField("property"):
                self._apply_property(op)
        except FnodeNotTracked as err:
            not_tracked = err

        self.next_seq_no = seq_no + 1
        self.next_checksum = _crc32c.update(self.next_checksum, frame)
        self.last_log = op.log

        # A consumed hinted segment hands over to the next, which may resume
        # further along the log (skipping ops the hints don't need).
        if hinted and hinted[-1].last_seq_no < self.next_seq_no:
            hinted.pop()
            if hinted:
                self.next_seq_no = hinted[-1].first_seq_no
                self.next_checksum = hinted[-1].first_checksum

        if not_tracked is not None:
            raise not_tracked

    def _apply_create(self, op: rpb.RecordedOp) -> None:
        path = op.create.path
        seq_no = op.seq_no
        if path in self.links:
            raise LinkExists(seq_no, path)
        if path in self.properties:
            raise PropertyExists(seq_no, path)
        fnode = seq_no  # An Fnode is named by the seq_no which created it.
        hinted = self._hinted_fnodes
        if hinted:
            if hinted[-1] != fnode:
                raise FnodeNotTracked(seq_no, fnode)
            hinted.pop()
        node = FnodeState(links={path})
        self._extend_segments(node.segments, op)
        self.live_nodes[fnode] = node
        self.links[path] = fnode

    def _apply_link(self, op: rpb.RecordedOp) -> None:
        path, fnode = op.link.path, op.link.fnode
        if path in self.links:
            raise LinkExists(op.seq_no, path)
        if path in self.properties:
            raise PropertyExists(op.seq_no, path)
        node = self.live_nodes.get(fnode)
        if node is None:
            raise FnodeNotTracked(op.seq_no, fnode)
        node.links.add(path)
        self.links[path] = fnode
        self._extend_segments(node.segments, op)

    def _apply_unlink(self, op: rpb.RecordedOp) -> None:
        path, fnode = op.unlink.path, op.unlink.fnode
        node = self.live_nodes.get(fnode)
        if node is None:
            raise FnodeNotTracked(op.seq_no, fnode)
        if path not in node.links:
            raise NoSuchLink(op.seq_no, fnode, path)
        del self.links[path]
        node.links.remove(path)
        self._extend_segments(node.segments, op)
        if not node.links:
            del self.live_nodes[fnode]  # The last link is gone: so is the file.

    def _apply_write(self, op: rpb.RecordedOp) -> None:
        fnode = op.write.fnode
        node = self.live_nodes.get(fnode)
        if node is None:
            raise FnodeNotTracked(op.seq_no, fnode)
        self._extend_segments(node.segments, op)

    def _apply_property(self, op: rpb.RecordedOp) -> None:
        path = op.property.path
        if path in self.links:
            raise LinkExists(op.seq_no, path)
        self.properties[path] = op.property.content

    @staticmethod
    def _extend_segments(segments: list[rpb.Segment], op: rpb.RecordedOp) -> None:
        if segments:
            last = segments[-1]
            if last.author == op.author and last.log == op.log:
                last.last_seq_no = op.seq_no
                last.last_offset = op.last_offset
                return
        segments.append(
            rpb.Segment(
                author=op.author,
                first_seq_no=op.seq_no,
                first_offset=op.first_offset,
                first_checksum=op.checksum,
                last_seq_no=op.seq_no,
                last_offset=op.last_offset,
                log=op.log,
            )
        )

    def build_hints(self, log: str) -> rpb.FSMHints:
        """FSMHints from which `FSM.from_hints` rebuilds this FSM's state.

        Live nodes are ordered by Fnode (their order in the log), properties by
        path. Segments of `log` leave their `log` empty, as it's implied.
        """
        hints = rpb.FSMHints(log=log)
        for fnode in sorted(self.live_nodes):
            node = hints.live_nodes.add(fnode=fnode)
            for seg in self.live_nodes[fnode].segments:
                out = node.segments.add()
                out.CopyFrom(seg)
                if out.log == log:
                    out.ClearField("log")
        for path in sorted(self.properties):
            hints.properties.add(path=path, content=self.properties[path])
        return hints
