"""The examples' packages are not installed: put their directories on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WORD_COUNT = EXAMPLES / "word-count"
if str(WORD_COUNT) not in sys.path:
    sys.path.insert(0, str(WORD_COUNT))
