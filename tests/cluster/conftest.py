"""The cluster runner's modules are scripts in tools/cluster, not a package: put their folder
on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "tools" / "cluster"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))
