"""Compile proto/*.proto into Python stubs beside the hand-written extensions.

Usage: python tools/gen_protos.py [--check]

Generated modules import each other as top-level modules (``import protocol_pb2``);
we rewrite those imports to their package paths so the stubs live inside
``src/<package>/.../`` like any other module. ``--check`` regenerates into a
temporary directory and exits non-zero when the committed stubs are stale.
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"

# proto file -> (output directory relative to src/, python package of that directory)
TARGETS: dict[str, tuple[str, str]] = {
    "protocol.proto": ("broker/protocol", "gazette.broker.protocol"),
    "recoverylog.proto": ("recoverylog", "gazette.recoverylog"),
    "consumer.proto": ("consumer/protocol", "gazette.consumer.protocol"),
}


def _bin(name: str) -> str:
    """Path of a protoc plugin installed beside the running interpreter."""
    path = Path(sys.executable).parent / name
    found = path if path.exists() else shutil.which(name)
    if not found:
        raise SystemExit(f"{name} not found: pip install mypy-protobuf")
    return str(found)


def _generate(out_root: Path) -> list[Path]:
    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    written: list[Path] = []
    for proto, (rel_dir, _pkg) in TARGETS.items():
        with tempfile.TemporaryDirectory() as tmp:
            args = [
                "protoc",
                f"-I{PROTO_DIR}",
                f"-I{include}",
                f"--python_out={tmp}",
                f"--grpc_python_out={tmp}",
                f"--plugin=protoc-gen-mypy={_bin('protoc-gen-mypy')}",
                f"--plugin=protoc-gen-mypy_grpc={_bin('protoc-gen-mypy_grpc')}",
                f"--mypy_out={tmp}",
                f"--mypy_grpc_out={tmp}",
                str(PROTO_DIR / proto),
            ]
            if protoc.main(args) != 0:
                raise SystemExit(f"protoc failed for {proto}")
            dest = out_root / rel_dir
            dest.mkdir(parents=True, exist_ok=True)
            for f in sorted(Path(tmp).iterdir()):
                text = _rewrite_imports(f.read_text())
                target = dest / f.name
                target.write_text(text)
                written.append(target)
    return written


def _rewrite_imports(text: str) -> str:
    for proto, (_rel, pkg) in TARGETS.items():
        mod = proto.removesuffix(".proto") + "_pb2"
        text = re.sub(rf"^import {mod} as ", f"from {pkg} import {mod} as ", text, flags=re.M)
        text = re.sub(rf"^import {mod}$", f"from {pkg} import {mod}", text, flags=re.M)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed stubs are stale")
    args = parser.parse_args()
    if not args.check:
        for path in _generate(ROOT / "src"):
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        stale = []
        for path in _generate(Path(tmp)):
            committed = ROOT / "src" / path.relative_to(tmp)
            if not committed.exists() or not filecmp.cmp(path, committed, shallow=False):
                stale.append(str(committed.relative_to(ROOT)))
        if stale:
            print("stale generated stubs (run `make protos`):", *stale, sep="\n  ")
            return 1
    print("generated stubs are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
