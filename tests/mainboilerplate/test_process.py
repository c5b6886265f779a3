"""mainboilerplate.process: the life cycle every member process shares, driven with a
process whose parts record what they are asked."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest

from gazette.allocator.session import LeaseLostError
from gazette.mainboilerplate import process

log = logging.getLogger("test")


class Recorded:
    """A `MemberProcess` that records its calls; `loops` is what its background does."""

    def __init__(self, loops: BaseException | None = None, fail_start: bool = False) -> None:
        self.calls: list[str] = []
        self.loops = loops
        self.fail_start = fail_start
        self.running = asyncio.Event()

    async def start(self) -> None:
        self.calls.append("start")
        if self.fail_start:
            raise process.StartupError("port in use")

    def ready(self) -> str:
        self.calls.append("ready")
        return "test ready id=z#s"

    async def run(self) -> None:
        self.running.set()
        if self.loops is not None:
            # Runs a moment before its background fails.
            await asyncio.sleep(0.01)
            raise self.loops
        await asyncio.Event().wait()

    def stopping(self) -> None:
        self.calls.append("stopping")

    async def drain(self, timeout: float) -> None:
        self.calls.append(f"drain {timeout}")

    async def stop_serving(self) -> None:
        self.calls.append("stop_serving")

    async def shutdown(self) -> None:
        self.calls.append("shutdown")

    async def close(self) -> None:
        self.calls.append("close")


async def signal_when_running(proc: Recorded, sig: int) -> None:
    await proc.running.wait()
    os.kill(os.getpid(), sig)


@pytest.mark.parametrize(
    ("sig", "drain_timeout", "drained"),
    [(signal.SIGTERM, 5.0, True), (signal.SIGINT, 5.0, True), (signal.SIGTERM, 0.0, False)],
)
async def test_a_signal_drains_then_stops_in_order(
    capsys: pytest.CaptureFixture[str], sig: int, drain_timeout: float, drained: bool
) -> None:
    proc = Recorded()
    kill = asyncio.create_task(signal_when_running(proc, sig))
    await process.serve(proc, drain_timeout, log, fenced=LeaseLostError)
    await kill
    want = ["start", "ready", "stopping", "stop_serving", "shutdown", "close"]
    if drained:
        want.insert(3, f"drain {drain_timeout}")
    assert proc.calls == want
    assert capsys.readouterr().out == "test ready id=z#s\n"


async def test_a_lost_lease_stops_without_draining_then_raises() -> None:
    lost = LeaseLostError("lease 1 lost")
    proc = Recorded(loops=ExceptionGroup("loops", [lost]))
    with pytest.raises(LeaseLostError) as raised:
        await process.serve(proc, 5.0, log, fenced=LeaseLostError)
    assert raised.value is lost
    # The member is still shut down (not left to the event loop's teardown).
    assert proc.calls == ["start", "ready", "stopping", "stop_serving", "shutdown", "close"]


async def test_another_failure_of_the_loops_is_raised_as_it_is() -> None:
    proc = Recorded(loops=RuntimeError("bug"))
    with pytest.raises(RuntimeError, match="bug"):
        await process.serve(proc, 5.0, log, fenced=LeaseLostError)
    assert proc.calls[-2:] == ["shutdown", "close"]


async def test_a_failed_start_closes_and_is_not_ready() -> None:
    proc = Recorded(fail_start=True)
    with pytest.raises(process.StartupError):
        await process.serve(proc, 5.0, log, fenced=LeaseLostError)
    assert proc.calls == ["start", "close"]


@pytest.mark.parametrize(
    ("raised", "status", "stderr"),
    [
        (
            process.StartupError("cannot listen on x"),
            process.EXIT_STARTUP,
            "prog: cannot listen on x\n",
        ),
        (LeaseLostError("gone"), process.EXIT_LEASE_LOST, ""),
    ],
)
def test_run_main_exit_statuses(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    raised: BaseException,
    status: int,
    stderr: str,
) -> None:
    monkeypatch.setattr(os, "umask", lambda mask: 0o022)
    told: list[str] = []

    async def main(cfg: str) -> None:
        raise raised

    with pytest.raises(SystemExit) as exit:
        process.run_main(
            "prog",
            lambda: "cfg",
            lambda cfg: "info",
            main,
            fenced=LeaseLostError,
            on_fenced=lambda cfg, err: told.append(str(err)),
        )
    assert exit.value.code == status
    assert capsys.readouterr().err == stderr
    assert told == (["gone"] if isinstance(raised, LeaseLostError) else [])
