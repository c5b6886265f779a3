"""fusefs: a FUSE filesystem, in a process of its own, whose every mutation of a directory is
recorded into a recovery log (docs/fusefs.md).

`FuseMount` (asyncio, parent process) starts the fusefs process (`fusefs.server`: pyfuse3 on
trio, with the Recorder on an asyncio loop in a second thread) over a backing directory played
back from the log, and offers `barrier`, `stats` and `stop`. An ``fsync`` on the mount returns
once everything recorded so far is committed to the log.
"""

from gazette.fusefs.mount import (
    FuseMount,
    MountFailed,
    MountStopped,
    collect_killed,
    force_unmount,
    is_mounted,
    mounts_under,
    play_for_mount,
)

__all__ = [
    "FuseMount",
    "MountFailed",
    "MountStopped",
    "collect_killed",
    "force_unmount",
    "is_mounted",
    "mounts_under",
    "play_for_mount",
]
