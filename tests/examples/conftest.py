"""The examples' packages are not installed: put their directories on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WORD_COUNT = EXAMPLES / "word-count"
STREAM_SUM = EXAMPLES / "stream-sum"
for _example in (WORD_COUNT, STREAM_SUM):
    if str(_example) not in sys.path:
        sys.path.insert(0, str(_example))
