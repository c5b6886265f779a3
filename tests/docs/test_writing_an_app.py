"""docs/writing-an-app.md, run as a user would: every block of the page, in order.

The page's fenced blocks say what they are in their info strings (the markup comment at the
top of the page): files are written into a new directory, `run` blocks run there with bash
and the real programs of this virtualenv (``gazette-dev`` in the background), the `paste`
block takes its values from what ``gazette-dev`` printed, and `output` blocks are compared
exactly. The install block is the only one skipped. The page's own test (its ``pytest``
block) must pass, every test of the file it names. Beside the outputs shown, the test checks
what the page claims, computed from the events its publish block appends: each key's count
queried through both consumers (a shard's primary is on one of them, so the other forwards),
each shard read its partition through, every update published once and read committed, and
the exported rows.

The Spark export runs here, on ``local[1]``, rather than being left to an opt-in mark: the
whole test took 173 s on this 2-core machine while it was loaded (load average 6-11), the
page's pytest 19-44 s of it (load 5-14: two consumers start, one is killed), and the export
alone 74-130 s by hand (load 9), most of it Spark's start and planning.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest

from gazette.message import fnv1a_32

PAGE = Path(__file__).resolve().parents[2] / "docs" / "writing-an-app.md"
BIN = Path(sys.executable).parent
READY = "gazette-dev ready"
PARTITIONS = 2
"""Input partitions (and shards) in the page's journals.yaml."""
UUID_LENGTH = 36
START_TIMEOUT = 240.0
RUN_TIMEOUT = 120.0
EXPORT_TIMEOUT = 420.0
PYTEST_TIMEOUT = 300.0
POLL_TIMEOUT = 60.0
ROLES = ("file", "run", "paste", "output", "example", "skip")


@dataclass
class Block:
    """A fenced block of the page: its language, role (`ROLES`), flags and text."""

    line: int
    lang: str
    role: str
    text: str
    path: str = ""
    flags: set[str] = field(default_factory=set)


def parse_blocks(markdown: str) -> list[Block]:
    """The fenced blocks of `markdown`; a block whose info string names no role is an error."""
    blocks: list[Block] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*(.*)$", lines[i])
        if m is None:
            i += 1
            continue
        start, lang, words = i + 1, m.group(1), m.group(2).split()
        end = next((j for j in range(i + 1, len(lines)) if lines[j] == "```"), None)
        assert end is not None, f"line {start}: unclosed block"
        text = "\n".join(lines[i + 1 : end]) + "\n"
        role, path, flags = "", "", set()
        for w in words:
            if w.startswith("file="):
                role, path = "file", w[len("file=") :]
            elif w in ROLES:
                assert not role, f"line {start}: two roles in {words}"
                role = w
            else:
                flags.add(w)
        assert role, f"line {start}: a block without a role ({', '.join(ROLES)}): {lang!r}"
        blocks.append(Block(start, lang, role, text, path, flags))
        i = end + 1
    return blocks


class Background:
    """A `run background` block: started, its output collected, stopped by SIGINT."""

    def __init__(self, block: Block, cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            ["bash", "-c", "exec " + block.text.strip()],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not any(line.startswith(READY) for line in self.lines):
            assert self.proc.poll() is None, f"exited with {self.proc.returncode}:\n{self.output}"
            assert time.monotonic() < deadline, f"not ready in {START_TIMEOUT}s:\n{self.output}"
            time.sleep(0.2)

    def interrupt(self) -> int:
        """Ctrl-C, as the page says; its exit status."""
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout=120)
        self._reader.join(timeout=10)
        return code

    def stop(self) -> None:
        """After a failure: Ctrl-C, which stops the processes it started (each runs in a
        session of its own, so killing its group would leave them running); SIGKILL only if
        it does not exit."""
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def run(block: Block, cwd: Path, env: dict[str, str], timeout: float = RUN_TIMEOUT) -> str:
    """Run `block` with bash; its standard output (it must succeed)."""
    proc = subprocess.run(
        ["bash", "-c", block.text],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"line {block.line}: exit {proc.returncode}\n{block.text}\n{proc.stdout}\n{proc.stderr}"
    )
    return proc.stdout


def poll(what: Callable[[], str], check: Callable[[str], None]) -> str:
    """`what()` until `check` passes on it (the consumers work asynchronously)."""
    deadline = time.monotonic() + POLL_TIMEOUT
    while True:
        out = what()
        try:
            check(out)
            return out
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)


@dataclass(frozen=True)
class Published:
    """What the page's publish block appends: keys in order, each a CSV record `uuid,key`."""

    keys: list[str]

    @staticmethod
    def of(block: Block) -> Published:
        m = re.search(r"printf '([^']*)'", block.text)
        assert m is not None, f"line {block.line}: no printf of the events"
        return Published(m.group(1).encode().decode("unicode_escape").split())

    def counts(self) -> Counter[str]:
        return Counter(self.keys)

    @staticmethod
    def shard(key: str) -> str:
        return f"counter-{fnv1a_32(key) % PARTITIONS:03d}"

    def partition_bytes(self) -> dict[str, int]:
        """Bytes appended to each input partition, by the shard reading it."""
        out = dict.fromkeys((f"counter-{i:03d}" for i in range(PARTITIONS)), 0)
        for k in self.keys:
            out[self.shard(k)] += UUID_LENGTH + 1 + len(k) + 1
        return out


def check_query(block: Block, published: Published, expected: str) -> Callable[[str], None]:
    counts = published.counts()
    for line in expected.splitlines():
        answer = json.loads(line)
        key = answer["key"]
        assert answer == {"key": key, "n": counts[key], "shard": published.shard(key)}, (
            f"line {block.line}: the page's answer {line} is not what its events make"
        )

    def check(out: str) -> None:
        assert out == expected, f"line {block.line}: answered\n{out}"

    return check


def check_shards(published: Published) -> Callable[[str], None]:
    def check(out: str) -> None:
        lines = out.splitlines(keepends=True)
        at = [i for i, line in enumerate(lines) if line.startswith("ID ")]
        assert len(at) == 2, out  # The list's table, then the stat's.
        listed, stat = "".join(lines[: at[1]]), "".join(lines[at[1] :])
        for i in range(PARTITIONS):
            assert re.search(rf"counter-{i:03d}\s+PRIMARY\s+\S+\*:PRIMARY", listed), listed
        for shard, n in published.partition_bytes().items():
            journal = f"counter/input/part-{shard[-3:]}"
            assert re.search(rf"^{shard}\s+OK\s.*\s{journal}:{n}\s", stat, re.M), stat

    return check


def check_committed(published: Published) -> Callable[[str], None]:
    def check(out: str) -> None:
        updates = [(m["key"], m["n"]) for m in map(json.loads, out.splitlines())]
        assert len(set(updates)) == len(updates), f"an update read twice: {out}"
        assert sorted(updates) == sorted(
            (k, n) for k, count in published.counts().items() for n in range(1, count + 1)
        ), out

    return check


def expected_export(published: Published) -> str:
    rows = [
        {"shard": published.shard(k), "key": k, "n": n}
        for k, n in sorted(published.counts().items())
    ]
    return f"{rows}\n"


def check_pytest(block: Block, project: Path, out: str, example: Block | None) -> None:
    """`pytest` of the page ran every test of the file it names, and all passed, as the
    example after it shows (but for the seconds and the padding)."""
    files = [w for w in shlex.split(block.text) if w.endswith(".py")]
    assert len(files) == 1, f"line {block.line}: name the test file: {block.text}"
    tests = re.findall(r"^(?:async )?def test_", (project / files[0]).read_text(), re.M)
    assert tests, f"line {block.line}: no test in {files[0]}"
    summary = out.strip().splitlines()[-1]
    assert re.fullmatch(rf"{len(tests)} passed in [\d.]+s(?: \([\d:]+\))?", summary), out

    def shape(line: str) -> str:
        return re.sub(r"\s+", " ", re.sub(r"[\d.]+s\b", "Ns", line)).strip()

    assert example is not None, f"line {block.line}: show what pytest prints"
    shapes = {shape(line) for line in out.splitlines()}
    for line in example.text.splitlines():
        assert shape(line) in shapes, f"line {example.line}: {line!r} not in\n{out}"


def check_printed(example: Block, printed: str) -> None:
    """The lines the page shows of what `gazette-dev` prints are there, but for the ports
    and directories of this run."""

    def shape(line: str) -> str:
        return re.sub(r"\d+\.\d+\.\d+\.\d+:\d+|/\S*", "X", line)

    shapes = {shape(line) for line in printed.splitlines()}
    for line in example.text.splitlines():
        assert shape(line) in shapes, f"line {example.line}: {line!r} not in\n{printed}"


def pasted(block: Block, printed: str) -> dict[str, str]:
    """The variables the `paste` block sets, with the values `gazette-dev` printed: its
    ``export`` line, and ``HTTP``, a consumer's HTTP address."""
    names = [w.split("=")[0] for line in block.text.splitlines() for w in shlex.split(line)]
    m = re.search(r"^gazctl\s+export (.*)$", printed, re.M)
    assert m is not None, printed
    values = dict(w.split("=", 1) for w in shlex.split(m.group(1)))
    values["HTTP"] = re.findall(r"^consumer .* http (\S+) ", printed, re.M)[0]
    assert ["export", *sorted(values)] == [names[0], *sorted(names[1:])], (
        f"line {block.line}: the page pastes {names}, gazette-dev printed {sorted(values)}"
    )
    return values


@pytest.mark.timeout(900)
def test_writing_an_app(tmp_path: Path) -> None:
    blocks = parse_blocks(PAGE.read_text())
    skipped = [b for b in blocks if b.role == "skip"]
    assert len(skipped) == 1 and "pip install 'gazette-py[" in skipped[0].text, (
        "only the install block is skipped (the package is installed in this .venv)"
    )

    project = tmp_path / "counter"
    project.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ETCD_ADDRESS", "BROKER_ADDRESS", "CONSUMER_ADDRESS", "PYTHONPATH")
    }
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    background: Background | None = None
    consumers_http: list[str] = []
    published: Published | None = None
    try:
        for i, block in enumerate(blocks):
            following = blocks[i + 1] if i + 1 < len(blocks) else None
            expected = following.text if following and following.role == "output" else None
            if block.role == "file":
                (project / block.path).parent.mkdir(parents=True, exist_ok=True)
                (project / block.path).write_text(block.text)
            elif block.role == "run" and "background" in block.flags:
                assert background is None, "one background command"
                background = Background(block, project, env)
                background.wait_ready()
                if following is not None and following.role == "example":
                    check_printed(following, background.output)
            elif block.role == "paste":
                assert background is not None, "paste what the background command printed"
                env.update(pasted(block, background.output))
                consumers_http = re.findall(r"^consumer .* http (\S+) ", background.output, re.M)
                assert len(consumers_http) == 2, background.output
            elif block.role == "run":
                text = block.text
                if "gazctl journals append" in text:
                    published = Published.of(block)
                    out = run(block, project, env)
                elif "curl" in text:
                    assert published is not None and expected is not None
                    check = check_query(block, published, expected)
                    for http in consumers_http:  # Each consumer: one forwards to the other.
                        poll(partial(run, block, project, {**env, "HTTP": http}), check)
                    continue
                elif "gazctl shards stat" in text:
                    assert published is not None
                    out = poll(partial(run, block, project, env), check_shards(published))
                elif "--committed" in text:
                    assert published is not None
                    out = poll(partial(run, block, project, env), check_committed(published))
                elif text.startswith("pytest "):
                    out = run(block, project, env, timeout=PYTEST_TIMEOUT)
                    check_pytest(block, project, out, following)
                    continue
                elif "gazctl shards export" in text:
                    assert published is not None and expected is not None
                    assert expected == expected_export(published), (
                        f"line {following and following.line}: not what the events make"
                    )
                    out = run(block, project, env, timeout=EXPORT_TIMEOUT)
                else:
                    out = run(block, project, env)
                if expected is not None:
                    assert out == expected, f"line {block.line}: {block.text}"
        assert background is not None and published is not None
        code = background.interrupt()
        assert code == 0, background.output
        assert background.lines[-1].startswith("stopped; data and logs are in"), background.output
    finally:
        if background is not None:
            background.stop()
