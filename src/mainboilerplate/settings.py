"""An application's own typed settings: a dataclass whose fields a process fills from its
command line, its environment and a file.

A field ``top_n: int = 10`` of the dataclass is set by the flag ``--{prefix}top-n``, by the
environment variable ``{ENV_PREFIX}TOP_N``, or by the key ``top_n`` of a YAML (or JSON) file
of one mapping; a flag wins over the environment, which wins over the file, which wins over
the field's default. A field without a default must be given by one of them.

Field types: ``str``, ``int``, ``float``, ``bool``, ``pathlib.Path``, ``X | None`` and
``list[X]`` / ``tuple[X, ...]`` of those scalars. On the command line and in the
environment a value is text: a bool is ``true``/``false`` (also ``1``/``0``, ``yes``/``no``,
``on``/``off``; a bare ``--{prefix}flag`` is true), a list is comma separated, and the empty
text is None for an optional field. In the file, values are YAML's own: an int field takes an
int, not ``"3"``; a key that names no field is an error, so a misspelt one is not ignored.
A field's ``metadata={"help": ...}`` is its ``--help`` text.

Every error is a `SettingsError` naming where the value came from (the flag, the variable,
the file and key) and what was expected.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["Settings", "SettingsError", "settings_class"]

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")
_SCALARS: tuple[type, ...] = (str, int, float, bool, Path)


class SettingsError(ValueError):
    """A value that does not fit its field, a key that names no field, a required field
    not given, or a settings file that cannot be read."""


def settings_class(obj: object) -> type | None:
    """The settings dataclass `obj` (an application class or instance) declares as its
    ``Config`` attribute, or None."""
    config = getattr(obj, "Config", None)
    if isinstance(config, type) and dataclasses.is_dataclass(config):
        return config
    return None


@dataclasses.dataclass(frozen=True)
class _Kind:
    """What a field holds: a scalar type, whether it may be None, and whether it is a list
    (or tuple) of that scalar."""

    scalar: type
    optional: bool = False
    sequence: type | None = None

    def describe(self) -> str:
        name = self.scalar.__name__
        if self.sequence is not None:
            name = f"{self.sequence.__name__} of {name}"
        return f"{name} or None" if self.optional else name


def _kind(annotation: Any) -> _Kind:
    optional = False
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) != len(typing.get_args(annotation)) - 1 or len(members) != 1:
            raise TypeError(f"unsupported type {annotation!r}")
        optional, annotation = True, members[0]
        origin = typing.get_origin(annotation)
    if origin in (list, tuple):
        args = typing.get_args(annotation)
        if origin is tuple and (len(args) != 2 or args[1] is not Ellipsis):
            raise TypeError(f"unsupported type {annotation!r} (a tuple must be tuple[X, ...])")
        if args[0] not in _SCALARS:
            raise TypeError(f"unsupported type {annotation!r}")
        return _Kind(args[0], optional, origin)
    if annotation not in _SCALARS:
        raise TypeError(f"unsupported type {annotation!r}")
    return _Kind(annotation, optional)


def _scalar_from_text(kind: _Kind, text: str) -> Any:
    if kind.scalar is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError(f"{text!r} is not true or false")
    if kind.scalar in (int, float):
        try:
            return kind.scalar(text)
        except ValueError:
            article = "an int" if kind.scalar is int else "a float"
            raise ValueError(f"{text!r} is not {article}") from None
    return kind.scalar(text)


def _from_text(kind: _Kind, text: str) -> Any:
    if kind.optional and text == "":
        return None
    if kind.sequence is not None:
        items = [item.strip() for item in text.split(",") if item.strip()]
        return kind.sequence(_scalar_from_text(kind, item) for item in items)
    return _scalar_from_text(kind, text)


def _scalar_from_file(kind: _Kind, value: Any) -> Any:
    want = kind.scalar
    if want is Path and isinstance(value, str):
        return Path(value)
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, want) and (want is bool or not isinstance(value, bool)):
        return value
    raise ValueError(f"{value!r} is not {kind.describe()}")


def _from_file(kind: _Kind, value: Any) -> Any:
    if value is None and kind.optional:
        return None
    if kind.sequence is not None:
        if not isinstance(value, list):
            raise ValueError(f"{value!r} is not {kind.describe()}")
        try:
            return kind.sequence(_scalar_from_file(kind, item) for item in value)
        except ValueError:
            raise ValueError(f"{value!r} is not {kind.describe()}") from None
    return _scalar_from_file(kind, value)


@dataclasses.dataclass(frozen=True)
class Settings:
    """The flags, environment variables and file of one settings dataclass `cls` (module
    docs): flags ``--{flag_prefix}{field}``, variables ``{env_prefix}{FIELD}``, the file
    named by ``--{file_flag}`` or the variable `file_env`."""

    cls: type
    flag_prefix: str
    env_prefix: str
    file_flag: str
    file_env: str

    def fields(self) -> dict[str, tuple[dataclasses.Field[Any], _Kind]]:
        """The settable fields, by name, with what each holds. Raises `SettingsError` if a
        field's type is not supported."""
        try:
            hints = typing.get_type_hints(self.cls)
        except Exception as err:  # noqa: BLE001 - whatever an annotation fails with
            raise SettingsError(
                f"{self.cls.__qualname__}: cannot resolve its types: {err}"
            ) from err
        out = {}
        for f in dataclasses.fields(self.cls):
            if not f.init:
                continue
            try:
                out[f.name] = (f, _kind(hints[f.name]))
            except TypeError as err:
                raise SettingsError(f"{self.cls.__qualname__}.{f.name}: {err}") from None
        return out

    def flag(self, name: str) -> str:
        return f"--{self.flag_prefix}{name.replace('_', '-')}"

    def variable(self, name: str) -> str:
        return f"{self.env_prefix}{name.upper()}"

    def add(self, parser: argparse.ArgumentParser) -> None:
        """Add the flags of the fields, and of the file, to `parser` as a group. Raises
        `SettingsError` if a field's type is not supported."""
        group = parser.add_argument_group(
            f"application settings ({self.cls.__qualname__}; a flag wins over its variable, "
            f"which wins over --{self.file_flag})"
        )
        group.add_argument(
            f"--{self.file_flag}",
            dest=f"{self.flag_prefix}__file__",
            metavar="FILE",
            help=f"YAML or JSON file of the settings, by field name [{self.file_env}]",
        )
        for name, (f, kind) in self.fields().items():
            default = _default_of(f)
            said = "required" if default is dataclasses.MISSING else f"default: {default!r}"
            text = f.metadata.get("help", "")
            bare: dict[str, Any] = {}
            if kind.scalar is bool and kind.sequence is None:
                bare = {"nargs": "?", "const": "true"}  # A bare flag is true.
            group.add_argument(
                self.flag(name),
                dest=f"{self.flag_prefix}{name}",
                metavar=kind.describe().upper().replace(" ", "_"),
                help=f"{text}{' ' if text else ''}[{self.variable(name)}] ({said})",
                **bare,
            )

    def build(self, args: argparse.Namespace, environ: Mapping[str, str]) -> Any:
        """An instance of `cls` from the flags in `args` (parsed with `add`'s), the
        `environ` variables and the file, over the defaults. Raises `SettingsError`."""
        fields = self.fields()
        path = getattr(args, f"{self.flag_prefix}__file__", None) or environ.get(self.file_env)
        from_file = self._read_file(Path(path), fields) if path else {}
        values: dict[str, Any] = {}
        for name, (_f, kind) in fields.items():
            given = getattr(args, f"{self.flag_prefix}{name}", None)
            variable = self.variable(name)
            if given is not None:
                values[name] = _convert(_from_text, kind, given, self.flag(name))
            elif variable in environ:
                values[name] = _convert(_from_text, kind, environ[variable], variable)
            elif name in from_file:
                values[name] = _convert(_from_file, kind, from_file[name], f"{path}: {name}")
        missing = [
            name
            for name, (f, _kind) in fields.items()
            if name not in values and _default_of(f) is dataclasses.MISSING
        ]
        if missing:
            said = [f"{self.flag(n)} ({self.variable(n)}, or {n} in the file)" for n in missing]
            raise SettingsError(f"required: {', '.join(said)}")
        try:
            return self.cls(**values)
        except (TypeError, ValueError) as err:  # The dataclass's own checks (__post_init__).
            raise SettingsError(f"{self.cls.__qualname__}: {err}") from err

    def _read_file(self, path: Path, fields: Mapping[str, Any]) -> dict[str, Any]:
        import yaml  # Here: only a process given a settings file pays for its import.

        try:
            loaded = yaml.safe_load(path.read_text())
        except OSError as err:
            raise SettingsError(f"{path}: {err.strerror or err}") from None
        except yaml.YAMLError as err:
            raise SettingsError(f"{path}: not YAML or JSON: {err}") from None
        if loaded is None:
            return {}
        if not isinstance(loaded, dict):
            raise SettingsError(f"{path}: expected a mapping of settings, not {loaded!r}")
        unknown = sorted(str(k) for k in loaded if k not in fields)
        if unknown:
            raise SettingsError(
                f"{path}: {', '.join(unknown)}: no such setting (settings: "
                f"{', '.join(fields) or 'none'})"
            )
        return loaded


def _default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _convert(convert: Callable[[_Kind, Any], Any], kind: _Kind, value: Any, source: str) -> Any:
    try:
        return convert(kind, value)
    except ValueError as err:
        raise SettingsError(f"{source}: {err}") from None
