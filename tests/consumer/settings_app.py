"""The counter application (tests/consumer/counter_app.py) with settings of its own: a
``Config`` dataclass the consumer fills from ``--app.*`` flags, ``APP_*`` variables and an
``--app-config`` file, and hands to the constructor. ``GET /settings`` answers them.

Run by `gazette-consumer tests.consumer.settings_app:TunedCounter` in
tests/consumer/test_config.py."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from aiohttp import web

from gazette.consumer.runtime import ConsumerRuntime
from tests.consumer.counter_app import Counter

__all__ = ["TunedCounter"]


class TunedCounter(Counter):
    @dataclass(frozen=True)
    class Config:
        label: str
        """Required: no default."""
        top_n: int = 10
        ratio: float = 0.5
        verbose: bool = False
        keys: tuple[str, ...] = ()
        spill_dir: Path | None = None
        token: str = field(default="", repr=False, metadata={"help": "a secret"})

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config

    def register_http(self, app: web.Application, runtime: ConsumerRuntime) -> None:
        async def settings(_request: web.Request) -> web.Response:
            values = asdict(self.config)
            values["spill_dir"] = str(values["spill_dir"])
            values["keys"] = list(values["keys"])
            return web.json_response(values)

        app.router.add_get("/settings", settings)
