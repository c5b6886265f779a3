"""The package build: the `gazette` package is the src/ folder, so that the repository keeps
its folders (src/broker/, src/consumer/, ...) while installing one namespace."""

from setuptools import find_packages, setup

setup(
    package_dir={"gazette": "src"},
    packages=["gazette", *(f"gazette.{p}" for p in find_packages("src"))],
)
