"""The package build.

- The `gazette` package is the src/ folder, so that the repository keeps its folders (src/broker/,
  src/consumer/, ...) while installing one namespace.
- The stores' native helpers (the SQLite VFS, the RocksDB scanner) are compiled by `build_ext`
  into the package, in place for editable installs (`gazette.stores.cbuild`). One that cannot be
  built is reported and skipped: the install goes on.
"""

import importlib.util
from pathlib import Path

from setuptools import Distribution, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _cbuild():
    spec = importlib.util.spec_from_file_location("_gazette_cbuild", ROOT / "src/stores/cbuild.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildNatives(build_ext):
    def run(self):
        super().run()
        stores = ROOT / "src/stores" if self.inplace else Path(self.build_lib, "gazette/stores")
        _cbuild().build_natives(stores, lambda msg: self.warn(f"gazette native helper {msg}"))

    def get_outputs(self):
        return [*super().get_outputs(), *self._natives()]

    def _natives(self):
        if self.inplace:
            return []
        stores = Path(self.build_lib, "gazette/stores")
        found = [stores / "sqlite/_recvfs.so", stores / "rocksdb/rocksdb-scan"]
        return [str(p) for p in found if p.exists()]


class NativeDistribution(Distribution):
    """Holds compiled code: its wheels are tagged for a platform."""

    def has_ext_modules(self):
        return True


setup(
    package_dir={"gazette": "src"},
    packages=["gazette", *(f"gazette.{p}" for p in find_packages("src"))],
    cmdclass={"build_ext": BuildNatives},
    distclass=NativeDistribution,
)
