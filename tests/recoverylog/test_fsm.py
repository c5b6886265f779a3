"""The recovery-log FSM: sequencing, checksums, hinted authors, and every op kind.

These scenarios follow upstream's fsm_test.go. To keep them independent of the
op encoding, each applied op is "framed" as the decimal text of a counter the
driver advances per op (and which also serves as the op's log offsets), so the
checksum a test expects is a CRC-32C over those short strings. The constants
below are those CRCs, as pinned by upstream; `test_checksum_constants` derives
them independently.
"""

from __future__ import annotations

import pytest

from gazette.recoverylog import recoverylog_pb2 as rpb
from gazette.recoverylog.fsm import (
    FSM,
    ExpectedHintedFnode,
    FnodeNotTracked,
    FnodeState,
    FSMError,
    LinkExists,
    NoSuchLink,
    NotHintedAuthor,
    PropertyExists,
    WrongChecksum,
    WrongSeqNo,
)
from gazette.recoverylog.segments import InconsistentSegments, InvalidHints

LOG = "a/recovery/log"


def bitwise_crc32c(crc: int, data: bytes) -> int:
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


# Checksums of a chain seeded with 0xfeedbeef and fed the frames "1", "2", "3",
# "4", then (in test_link, where rejected ops use up frames "5" to "7") "8".
SEEDED = [0xFEEDBEEF, 0x2D28E063, 0xF11E2261, 0xE292E757, 0x2009A120, 0xC8DAC550]


def test_checksum_constants() -> None:
    crc = 0xFEEDBEEF
    for expect, frame in zip(SEEDED, [b"1", b"2", b"3", b"4", b"8", b""], strict=True):
        assert crc == expect
        crc = bitwise_crc32c(crc, frame)
    assert bitwise_crc32c(bitwise_crc32c(0, b"1"), b"2") == 0x7355C460


class Driver:
    """Applies ops to an FSM, each with a unique frame and offsets."""

    def __init__(self, fsm: FSM) -> None:
        self.fsm = fsm
        self.offset = 0

    def apply(self, op: rpb.RecordedOp) -> FSMError | None:
        self.offset += 1
        op.first_offset = self.offset
        op.last_offset = self.offset + 1
        op.log = LOG
        try:
            self.fsm.apply(op, str(self.offset).encode())
        except FSMError as err:
            return err
        return None

    def create(self, seq: int, crc: int, author: int, path: str) -> FSMError | None:
        return self.apply(
            rpb.RecordedOp(
                seq_no=seq, checksum=crc, author=author, create=rpb.RecordedOp.Create(path=path)
            )
        )

    def link(self, seq: int, crc: int, author: int, fnode: int, path: str) -> FSMError | None:
        return self.apply(
            rpb.RecordedOp(
                seq_no=seq,
                checksum=crc,
                author=author,
                link=rpb.RecordedOp.Link(fnode=fnode, path=path),
            )
        )

    def unlink(self, seq: int, crc: int, author: int, fnode: int, path: str) -> FSMError | None:
        return self.apply(
            rpb.RecordedOp(
                seq_no=seq,
                checksum=crc,
                author=author,
                unlink=rpb.RecordedOp.Link(fnode=fnode, path=path),
            )
        )

    def write(self, seq: int, crc: int, author: int, fnode: int) -> FSMError | None:
        return self.apply(
            rpb.RecordedOp(
                seq_no=seq, checksum=crc, author=author, write=rpb.RecordedOp.Write(fnode=fnode)
            )
        )

    def prop(self, seq: int, crc: int, author: int, path: str, content: str) -> FSMError | None:
        return self.apply(
            rpb.RecordedOp(
                seq_no=seq,
                checksum=crc,
                author=author,
                property=rpb.Property(path=path, content=content),
            )
        )

    def noop(self, seq: int, crc: int, author: int) -> FSMError | None:
        return self.apply(rpb.RecordedOp(seq_no=seq, checksum=crc, author=author))


def seg(
    author: int,
    first_seq: int,
    last_seq: int,
    first_off: int,
    last_off: int,
    crc: int = 0,
    log: str = "",
) -> rpb.Segment:
    return rpb.Segment(
        author=author,
        first_seq_no=first_seq,
        last_seq_no=last_seq,
        first_offset=first_off,
        last_offset=last_off,
        first_checksum=crc,
        log=log,
    )


def node(fnode: int, *segments: rpb.Segment) -> rpb.FnodeSegments:
    return rpb.FnodeSegments(fnode=fnode, segments=list(segments))


def at(seq_no: int, checksum: int, log: str = LOG) -> Driver:
    """A driver whose (plain) FSM expects `seq_no` and `checksum` next."""
    fsm = FSM(log)
    fsm.next_seq_no, fsm.next_checksum = seq_no, checksum
    return Driver(fsm)


def test_fresh_fsm_starts_at_one_and_zero() -> None:
    d = Driver(FSM.from_hints(rpb.FSMHints(log=LOG)))
    assert (d.fsm.next_seq_no, d.fsm.next_checksum) == (1, 0)
    assert d.create(1, 0, 100, "/path/A") is None
    assert d.link(2, 0x90F599E3, 100, 1, "/path/B") is None
    assert d.fsm.next_seq_no == 3
    assert d.fsm.next_checksum == 0x7355C460
    assert d.fsm.last_log == LOG
    assert not d.fsm.has_remaining_hints()


def test_hints_without_log_are_rejected() -> None:
    with pytest.raises(InvalidHints, match="hinted log not provided"):
        FSM.from_hints(rpb.FSMHints())


def test_from_hints_starts_at_first_hinted_segment() -> None:
    hints = rpb.FSMHints(
        log=LOG,
        live_nodes=[
            # first_offset is a lower bound: the create is actually read at 1236.
            node(42, seg(100, 42, 43, 1234, 0, crc=0xFEEDBEEF))
        ],
        properties=[rpb.Property(path="/IDENTITY", content="foo-bar-baz")],
    )
    d = Driver(FSM.from_hints(hints))
    assert d.fsm.next_hinted_segment == seg(100, 42, 43, 1234, 0, crc=0xFEEDBEEF, log=LOG)
    assert (d.fsm.next_seq_no, d.fsm.next_checksum) == (42, 0xFEEDBEEF)
    assert d.fsm.last_log == LOG
    assert d.fsm.properties == {"/IDENTITY": "foo-bar-baz"}
    d.offset = 1234

    err = d.create(41, 0xFEEDBEEF, 100, "/path/A")
    assert isinstance(err, WrongSeqNo) and err.behind and err.expected == 42
    assert d.create(42, 0xFEEDBEEF, 100, "/path/A") is None
    assert d.link(43, 0xC132D1D7, 100, 42, "/path/B") is None
    assert not d.fsm.has_remaining_hints()

    # Rebuilt hints match the input, with the offsets actually observed.
    expect = rpb.FSMHints()
    expect.CopyFrom(hints)
    expect.live_nodes[0].segments[0].first_offset = 1236
    expect.live_nodes[0].segments[0].last_offset = 1238
    assert d.fsm.build_hints(LOG) == expect


def test_sequencing_errors_leave_state_unchanged() -> None:
    d = at(42, 0xFEEDBEEF)
    err = d.create(43, 0xFEEDBEEF, 100, "/a")
    assert isinstance(err, WrongSeqNo) and not err.behind and not err.transitioned
    err = d.create(42, 0x12345678, 100, "/a")
    assert isinstance(err, WrongChecksum)
    assert (err.checksum, err.expected) == (0x12345678, 0xFEEDBEEF)
    assert (d.fsm.next_seq_no, d.fsm.next_checksum) == (42, 0xFEEDBEEF)
    assert d.fsm.links == {} and d.fsm.live_nodes == {}
    assert d.create(42, 0xFEEDBEEF, 100, "/a") is None


def test_seq_no_is_checked_before_checksum() -> None:
    d = at(42, 0xFEEDBEEF)
    assert isinstance(d.create(40, 0x0BAD, 100, "/a"), WrongSeqNo)


def test_noop_steps_the_fsm() -> None:
    d = at(42, 0xFEEDBEEF)
    assert d.noop(42, 0xFEEDBEEF, 100) is None
    assert (d.fsm.next_seq_no, d.fsm.next_checksum) == (43, SEEDED[1])
    assert d.fsm.live_nodes == {} and d.fsm.build_hints(LOG) == rpb.FSMHints(log=LOG)


def test_create() -> None:
    d = at(42, 0xFEEDBEEF)
    d.fsm.properties["/property/path"] = "content"

    assert d.create(42, SEEDED[0], 100, "/path/A") is None
    assert d.create(43, SEEDED[1], 100, "/another/path") is None
    # Creating an existing link or property fails, without a transition.
    assert isinstance(d.create(44, SEEDED[2], 100, "/path/A"), LinkExists)
    assert isinstance(d.create(44, SEEDED[2], 100, "/property/path"), PropertyExists)
    assert d.create(44, SEEDED[2], 100, "/path/B") is None

    # Fnodes are named by their create's seq_no.
    assert d.fsm.links == {"/path/A": 42, "/another/path": 43, "/path/B": 44}
    assert d.fsm.live_nodes == {
        42: FnodeState({"/path/A"}, [seg(100, 42, 42, 1, 2, SEEDED[0], LOG)]),
        43: FnodeState({"/another/path"}, [seg(100, 43, 43, 2, 3, SEEDED[1], LOG)]),
        44: FnodeState({"/path/B"}, [seg(100, 44, 44, 5, 6, SEEDED[2], LOG)]),
    }


def hinted_42_and_44() -> Driver:
    """A driver of an FSM whose hints name Fnodes 42 and 44 (created at seq_nos 42 and 44,
    live through 100), and not 43."""
    hints = rpb.FSMHints(
        log=LOG,
        live_nodes=[
            node(42, seg(100, 42, 100, 1234, 0, SEEDED[0])),
            node(44, seg(100, 44, 100, 1234, 0, SEEDED[2])),
        ],
    )
    return Driver(FSM.from_hints(hints))


def test_create_of_an_unhinted_fnode_is_not_tracked() -> None:
    d = hinted_42_and_44()
    assert d.create(42, SEEDED[0], 100, "/path/A") is None
    err = d.create(43, SEEDED[1], 100, "/another/path")
    # The op is part of the hinted history: the FSM stepped past it.
    assert isinstance(err, FnodeNotTracked) and err.transitioned and err.fnode == 43
    assert d.fsm.next_seq_no == 44
    assert d.create(44, SEEDED[2], 100, "/final/path") is None

    assert d.fsm.links == {"/path/A": 42, "/final/path": 44}
    assert d.fsm.live_nodes == {
        42: FnodeState({"/path/A"}, [seg(100, 42, 42, 1, 2, SEEDED[0], LOG)]),
        44: FnodeState({"/final/path"}, [seg(100, 44, 44, 3, 4, SEEDED[2], LOG)]),
    }


def test_hinted_fnode_must_be_created() -> None:
    d = hinted_42_and_44()
    assert d.create(42, SEEDED[0], 100, "/path/A") is None
    assert d.write(43, d.fsm.next_checksum, 100, 42) is None
    # Op 44 is correctly sequenced, but the hints say it creates an Fnode.
    before = (d.fsm.next_seq_no, d.fsm.next_checksum)
    crc = d.fsm.next_checksum
    for err in (
        d.write(44, crc, 100, 42),
        d.noop(44, crc, 100),
        d.prop(44, crc, 100, "/p", "c"),
    ):
        assert isinstance(err, ExpectedHintedFnode) and not err.transitioned
        assert (d.fsm.next_seq_no, d.fsm.next_checksum) == before


def test_link() -> None:
    d = at(42, 0xFEEDBEEF, log="empty/log")
    assert d.create(42, SEEDED[0], 100, "/existing/path") is None
    assert d.create(43, SEEDED[1], 100, "/source/path") is None
    assert d.link(44, SEEDED[2], 100, 42, "/target/one") is None
    assert d.prop(45, SEEDED[3], 100, "/property/path", "content") is None

    # Linking onto an existing link fails, whether or not the Fnode is known.
    assert isinstance(d.link(46, SEEDED[4], 100, 43, "/existing/path"), LinkExists)
    assert isinstance(d.link(46, SEEDED[4], 100, 15, "/existing/path"), LinkExists)
    assert isinstance(d.link(46, SEEDED[4], 100, 44, "/property/path"), PropertyExists)
    # Linking an unknown Fnode steps the FSM, but tracks nothing.
    err = d.link(46, SEEDED[4], 100, 15, "/target/two")
    assert isinstance(err, FnodeNotTracked) and err.transitioned
    # A new author starts a new segment of the Fnode.
    assert d.link(47, SEEDED[5], 200, 43, "/target/two") is None

    assert d.fsm.links == {
        "/existing/path": 42,
        "/source/path": 43,
        "/target/one": 42,
        "/target/two": 43,
    }
    assert d.fsm.live_nodes == {
        42: FnodeState(
            {"/existing/path", "/target/one"},
            [seg(100, 42, 44, 1, 4, SEEDED[0], LOG)],  # Extended by the link.
        ),
        43: FnodeState(
            {"/source/path", "/target/two"},
            [seg(100, 43, 43, 2, 3, SEEDED[1], LOG), seg(200, 47, 47, 9, 10, SEEDED[5], LOG)],
        ),
    }
    assert d.fsm.properties == {"/property/path": "content"}


def test_unlink() -> None:
    d = at(42, 0xFEEDBEEF, log="empty/log")
    assert d.create(42, SEEDED[0], 100, "/path/A") is None
    assert d.create(43, SEEDED[1], 100, "/another/path") is None
    assert d.link(44, SEEDED[2], 200, 43, "/link/one") is None
    assert len(d.fsm.links) == 3

    # A path which isn't a link of that Fnode: no transition.
    err = d.unlink(45, SEEDED[3], 200, 43, "/does/not/exist")
    assert isinstance(err, NoSuchLink) and not err.transitioned
    assert isinstance(d.unlink(45, SEEDED[3], 200, 42, "/another/path"), NoSuchLink)
    # An unknown Fnode: a transition, tracking nothing.
    assert isinstance(d.unlink(45, SEEDED[3], 200, 15, "/some/path"), FnodeNotTracked)

    assert d.unlink(46, 0xC132D1D7, 200, 43, "/another/path") is None
    assert d.fsm.links == {"/path/A": 42, "/link/one": 43}
    assert d.fsm.live_nodes[43].links == {"/link/one"}
    assert d.fsm.build_hints(LOG) == rpb.FSMHints(
        log=LOG,
        live_nodes=[
            node(42, seg(100, 42, 42, 1, 2, SEEDED[0])),
            node(
                43,
                seg(100, 43, 43, 2, 3, SEEDED[1]),
                seg(200, 44, 46, 3, 8, SEEDED[2]),  # Extended by the unlink.
            ),
        ],
    )

    # The last link goes, and so does the Fnode.
    assert d.unlink(47, 0xB18CC99A, 200, 43, "/link/one") is None
    assert d.fsm.links == {"/path/A": 42}
    assert list(d.fsm.live_nodes) == [42]
    assert d.fsm.build_hints(LOG) == rpb.FSMHints(
        log=LOG, live_nodes=[node(42, seg(100, 42, 42, 1, 2, SEEDED[0]))]
    )

    assert d.create(48, 0x11BC1AC9, 300, "/other/path") is None
    assert d.unlink(49, 0xA102803E, 300, 42, "/path/A") is None
    assert d.fsm.links == {"/other/path": 48}
    assert d.fsm.build_hints(LOG) == rpb.FSMHints(
        log=LOG, live_nodes=[node(48, seg(300, 48, 48, 9, 10, 0x11BC1AC9))]
    )

    assert d.unlink(50, 0xA40DAEE4, 400, 48, "/other/path") is None
    assert d.fsm.links == {} and d.fsm.live_nodes == {}
    assert d.fsm.build_hints(LOG) == rpb.FSMHints(log=LOG)


def test_property() -> None:
    d = at(42, 0xFEEDBEEF)
    d.fsm.properties["/a/property"] = "content"
    assert d.create(42, SEEDED[0], 100, "/a/path") is None
    assert d.prop(43, SEEDED[1], 100, "/another/property", "other-content") is None
    assert d.fsm.properties == {"/a/property": "content", "/another/property": "other-content"}
    # A property may not shadow a file, but may be replaced.
    err = d.prop(44, SEEDED[2], 100, "/a/path", "bad")
    assert isinstance(err, LinkExists) and not err.transitioned
    assert d.prop(44, SEEDED[2], 100, "/a/property", "update") is None
    assert d.fsm.properties == {"/a/property": "update", "/another/property": "other-content"}
    # Properties are not fnodes, and extend no segments.
    assert list(d.fsm.live_nodes) == [42]
    assert d.fsm.build_hints(LOG).properties == [
        rpb.Property(path="/a/property", content="update"),
        rpb.Property(path="/another/property", content="other-content"),
    ]


def test_write() -> None:
    d = at(42, 0xFEEDBEEF)
    assert d.create(42, SEEDED[0], 100, "/path/A") is None
    assert d.write(43, SEEDED[1], 100, 42) is None
    assert d.write(44, SEEDED[2], 100, 42) is None
    err = d.write(45, SEEDED[3], 100, 15)
    assert isinstance(err, FnodeNotTracked) and err.fnode == 15
    assert d.write(46, SEEDED[4], 100, 42) is None  # Sequenced after the untracked write.
    assert d.fsm.build_hints(LOG) == rpb.FSMHints(
        log=LOG, live_nodes=[node(42, seg(100, 42, 46, 1, 6, SEEDED[0]))]
    )


def test_hinted_authors_select_a_branch_of_history() -> None:
    hints = rpb.FSMHints(
        log=LOG,
        live_nodes=[
            node(42, seg(100, 42, 42, 2, 3), seg(200, 44, 44, 5, 6), seg(300, 45, 45, 8, 9)),
            node(46, seg(400, 46, 47, 11, 13)),
        ],
    )
    d = Driver(FSM.from_hints(hints))

    # Author 666 writes well-sequenced ops, on a branch the hints did not keep.
    err = d.create(42, 0, 666, "/evil/path")
    assert isinstance(err, NotHintedAuthor) and (err.author, err.hinted) == (666, 100)
    assert d.create(42, 0, 100, "/good/path") is None

    # 200 is hinted next: the author check precedes the seq_no check...
    assert isinstance(d.write(43, d.fsm.next_checksum, 100, 42), NotHintedAuthor)
    # ...and op 43 is in no hinted segment: the FSM skipped to 44.
    assert isinstance(d.write(43, d.fsm.next_checksum, 200, 15), WrongSeqNo)
    assert d.fsm.next_checksum == 0  # The hinted segment's first_checksum.
    assert d.write(44, 0, 200, 42) is None
    assert isinstance(d.write(45, d.fsm.next_checksum, 200, 42), NotHintedAuthor)

    assert isinstance(d.write(45, d.fsm.next_checksum, 666, 42), NotHintedAuthor)
    assert d.write(45, 0, 300, 42) is None
    assert isinstance(d.write(46, d.fsm.next_checksum, 300, 42), NotHintedAuthor)

    assert isinstance(d.write(46, d.fsm.next_checksum, 666, 42), NotHintedAuthor)
    assert d.create(46, 0, 400, "/another/path") is None
    assert d.fsm.has_remaining_hints()
    assert d.write(47, d.fsm.next_checksum, 400, 46) is None
    assert not d.fsm.has_remaining_hints()
    assert d.fsm.next_hinted_segment is None

    assert list(d.fsm.build_hints(LOG).live_nodes) == list(hints.live_nodes)

    # With hints consumed, any author may continue the history.
    assert d.unlink(48, d.fsm.next_checksum, 666, 42, "/good/path") is None
    crc = d.fsm.next_checksum
    assert crc == 0x1CAB6124
    assert d.write(49, crc, 666, 46) is None
    assert d.fsm.build_hints(LOG) == rpb.FSMHints(
        log=LOG,
        live_nodes=[node(46, seg(400, 46, 47, 11, 13), seg(666, 49, 49, 14, 15, crc))],
    )


def test_segments_split_on_log_change_and_build_hints_elides_the_hinted_log() -> None:
    d = at(1, 0)
    assert d.create(1, 0, 7, "/f") is None
    op = rpb.RecordedOp(
        seq_no=2, checksum=d.fsm.next_checksum, author=7, write=rpb.RecordedOp.Write(fnode=1)
    )
    op.first_offset, op.last_offset, op.log = 100, 120, "other/log"
    d.fsm.apply(op, b"frame")
    assert d.fsm.last_log == "other/log"
    segs = d.fsm.live_nodes[1].segments
    assert [s.log for s in segs] == [LOG, "other/log"]
    hints = d.fsm.build_hints("other/log")
    assert [s.log for s in hints.live_nodes[0].segments] == [LOG, ""]
    # And such hints restore: the second segment is read from the other log.
    fsm = FSM.from_hints(hints)
    assert [s.log for s in fsm.hinted_segments] == [LOG, "other/log"]


def test_recorder_segments_keep_unknown_last_offset() -> None:
    # A recorder knows only a lower bound of where its ops land.
    fsm = FSM(LOG)
    for seq, path in ((1, "/a"), (2, "/b")):
        op = rpb.RecordedOp(
            seq_no=seq,
            checksum=fsm.next_checksum,
            author=9,
            create=rpb.RecordedOp.Create(path=path),
        )
        op.first_offset, op.log = 10 * seq, LOG
        fsm.apply(op, op.SerializeToString())
    op = rpb.RecordedOp(
        seq_no=3, checksum=fsm.next_checksum, author=9, write=rpb.RecordedOp.Write(fnode=1)
    )
    op.first_offset, op.log = 30, LOG
    fsm.apply(op, op.SerializeToString())
    assert fsm.live_nodes[1].segments == [seg(9, 1, 3, 10, 0, 0, LOG)]


def test_inconsistent_hints_are_rejected() -> None:
    with pytest.raises(InconsistentSegments):
        FSM.from_hints(
            rpb.FSMHints(
                log=LOG,
                live_nodes=[node(2, seg(1, 2, 7, 200, 700)), node(4, seg(2, 4, 9, 400, 901))],
            )
        )
