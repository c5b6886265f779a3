"""A randomized workload of file operations on a real directory, each recorded as it
happens: what the Recorder -> Player and pruning tests record and play back."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

from gazette.recoverylog.recorder import Recorder


class Workload:
    """Random file operations on a real directory, each recorded as it happens."""

    def __init__(self, rec: Recorder, root: Path, seed: int) -> None:
        self.rec = rec
        self.root = root
        self.rnd = random.Random(seed)
        self.paths: list[str] = []  # Live paths (relative).
        self.counter = 0

    def _new_path(self) -> str:
        self.counter += 1
        return f"d{self.rnd.randrange(20)}/f{self.counter}"

    def _data(self, big: bool = False) -> bytes:
        n = self.rnd.choice((1, 100, 4096, 30_000)) if not big else self.rnd.randrange(1 << 20)
        return self.rnd.randbytes(n)

    def create(self, path: str | None = None) -> str:
        path = path or self._new_path()
        full = self.root / path
        full.parent.mkdir(parents=True, exist_ok=True)
        with open(full, "wb"):  # O_CREAT|O_TRUNC.
            pass
        self.rec.record_create(path)
        if path not in self.paths:
            self.paths.append(path)
        return path

    def write(self, path: str, big: bool = False) -> None:
        full = self.root / path
        size = full.stat().st_size
        offset = self.rnd.choice((0, size, size + self.rnd.randrange(5000), size // 2))
        data = self._data(big)
        fd = os.open(full, os.O_WRONLY)
        try:
            os.pwrite(fd, data, offset)
        finally:
            os.close(fd)
        fnode = self.rec.fnode(path)
        assert fnode is not None
        self.rec.record_write(fnode, offset, data)

    def pick(self) -> str:
        return self.rnd.choice(self.paths)

    def step(self) -> None:
        r = self.rnd.random()
        if r < 0.32 or len(self.paths) < 10:
            self.write(self.create(), big=self.rnd.random() < 0.01)
        elif r < 0.58:
            self.write(self.pick(), big=self.rnd.random() < 0.005)
        elif r < 0.66:  # Rename, often over an existing file.
            src = self.pick()
            dst = self.pick() if self.rnd.random() < 0.5 else self._new_path()
            if src == dst:
                return
            (self.root / dst).parent.mkdir(parents=True, exist_ok=True)
            os.rename(self.root / src, self.root / dst)
            self.rec.record_rename(src, dst)
            self.paths.remove(src)
            if dst not in self.paths:
                self.paths.append(dst)
        elif r < 0.73:  # A hard link.
            src, dst = self.pick(), self._new_path()
            (self.root / dst).parent.mkdir(parents=True, exist_ok=True)
            os.link(self.root / src, self.root / dst)
            fnode = self.rec.fnode(src)
            assert fnode is not None
            self.rec.record_link(fnode, dst)
            self.paths.append(dst)
        elif r < 0.83:
            path = self.pick()
            os.unlink(self.root / path)
            self.rec.record_unlink(path)
            self.paths.remove(path)
        else:  # A truncating re-create, of a file with no other links (which would share it).
            path = self.pick()
            if (self.root / path).stat().st_nlink == 1:
                self.write(self.create(path))

    def set_identity(self, content: str) -> None:
        tmp = self.root / "IDENTITY.tmp"
        tmp.write_text(content)
        self.rec.record_create("IDENTITY.tmp")
        fnode = self.rec.fnode("IDENTITY.tmp")
        assert fnode is not None
        self.rec.record_write(fnode, 0, content.encode())
        os.rename(tmp, self.root / "IDENTITY")
        self.rec.record_rename("IDENTITY.tmp", "IDENTITY")


async def run_workload(w: Workload, steps: int) -> None:
    for i in range(steps):
        w.step()
        if i % 200 == 0:
            await w.rec.throttle(8 << 20)
            await asyncio.sleep(0)
