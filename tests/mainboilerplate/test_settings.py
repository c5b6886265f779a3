"""mainboilerplate.settings: an application's typed settings from flags, environment and a
file, each value checked against its field, errors naming where it came from."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gazette.mainboilerplate.settings import Settings, SettingsError, settings_class


@dataclasses.dataclass(frozen=True)
class Conf:
    name: str
    top_n: int = 10
    ratio: float = 0.5
    verbose: bool = False
    words: list[str] = dataclasses.field(default_factory=list)
    sizes: tuple[int, ...] = (1, 2)
    spill: Path | None = None
    limit: int | None = 3


SETTINGS = Settings(
    Conf, flag_prefix="app.", env_prefix="APP_", file_flag="app-config", file_env="T_FILE"
)


def build(argv: list[str], env: dict[str, str] | None = None, settings: Settings = SETTINGS) -> Any:
    p = argparse.ArgumentParser(prog="t")
    settings.add(p)
    return settings.build(p.parse_args(argv), env or {})


@pytest.mark.parametrize(
    ("argv", "env", "file", "want"),
    [
        (["--app.name", "a"], {}, None, {"name": "a", "top_n": 10, "spill": None}),
        # A flag wins over the environment, which wins over the file, over the default.
        (["--app.name", "flag"], {"APP_NAME": "env"}, "name: file", {"name": "flag"}),
        ([], {"APP_NAME": "env"}, "name: file", {"name": "env"}),
        ([], {}, "name: file\ntop_n: 7", {"name": "file", "top_n": 7}),
        # Types, as text (flags, environment).
        (
            ["--app.name=x", "--app.top-n", "3", "--app.ratio", "2", "--app.verbose"],
            {"APP_WORDS": "a, b,,c", "APP_SIZES": "4,5", "APP_SPILL": "/s", "APP_LIMIT": ""},
            None,
            {
                "top_n": 3,
                "ratio": 2.0,
                "verbose": True,
                "words": ["a", "b", "c"],
                "sizes": (4, 5),
                "spill": Path("/s"),
                "limit": None,
            },
        ),
        (["--app.name=x", "--app.verbose", "off"], {}, None, {"verbose": False}),
        ([], {"APP_NAME": "x", "APP_VERBOSE": "Yes"}, None, {"verbose": True}),
        # Types, as YAML (JSON is YAML too).
        (
            [],
            {},
            '{"name": "j", "ratio": 1, "words": ["w"], "sizes": [9], "spill": "/p", '
            '"limit": null, "verbose": true}',
            {
                "name": "j",
                "ratio": 1.0,
                "words": ["w"],
                "sizes": (9,),
                "spill": Path("/p"),
                "limit": None,
                "verbose": True,
            },
        ),
    ],
)
def test_flag_then_environment_then_file_then_default(
    tmp_path: Path,
    argv: list[str],
    env: dict[str, str],
    file: str | None,
    want: dict[str, Any],
) -> None:
    if file is not None:
        (tmp_path / "conf.yaml").write_text(file)
        argv = [*argv, "--app-config", str(tmp_path / "conf.yaml")]
    conf = build(argv, env)
    assert isinstance(conf, Conf)
    assert {k: getattr(conf, k) for k in want} == want


def test_the_file_may_be_named_by_its_variable(tmp_path: Path) -> None:
    (tmp_path / "c.json").write_text('{"name": "v"}')
    assert build([], {"T_FILE": str(tmp_path / "c.json")}).name == "v"


@pytest.mark.parametrize(
    ("argv", "env", "file", "error"),
    [
        ([], {}, None, "required: --app.name (APP_NAME, or name in the file)"),
        (["--app.name=x", "--app.top-n", "ten"], {}, None, "--app.top-n: 'ten' is not an int"),
        (["--app.name=x"], {"APP_RATIO": "half"}, None, "APP_RATIO: 'half' is not a float"),
        (["--app.name=x"], {"APP_VERBOSE": "maybe"}, None, "APP_VERBOSE: 'maybe' is not true"),
        (["--app.name=x"], {"APP_SIZES": "1,x"}, None, "APP_SIZES: 'x' is not an int"),
        ([], {}, "name: n\ntop_n: '3'", "conf.yaml: top_n: '3' is not int"),
        ([], {}, "name: n\nverbose: 1", "conf.yaml: verbose: 1 is not bool"),
        ([], {}, "name: n\ntop_n: true", "conf.yaml: top_n: True is not int"),
        ([], {}, "name: n\nwords: w", "conf.yaml: words: 'w' is not list of str"),
        ([], {}, "name: n\nlimit: null\nspill: 3", "conf.yaml: spill: 3 is not Path or None"),
        ([], {}, "name: n\ntopn: 3", "conf.yaml: topn: no such setting (settings: name, top_n"),
        ([], {}, "- name", "conf.yaml: expected a mapping of settings, not ['name']"),
        ([], {}, "name: [", "conf.yaml: not YAML or JSON"),
    ],
)
def test_errors_name_the_source_and_what_was_expected(
    tmp_path: Path, argv: list[str], env: dict[str, str], file: str | None, error: str
) -> None:
    if file is not None:
        (tmp_path / "conf.yaml").write_text(file)
        argv = [*argv, "--app-config", str(tmp_path / "conf.yaml")]
    with pytest.raises(SettingsError) as err:
        build(argv, env)
    assert error in str(err.value)


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="nope.yaml: No such file"):
        build(["--app.name=x", "--app-config", str(tmp_path / "nope.yaml")])


def test_the_dataclass_own_checks_are_settings_errors() -> None:
    @dataclasses.dataclass
    class Checked:
        n: int = 1

        def __post_init__(self) -> None:
            if self.n < 0:
                raise ValueError(f"n must be >= 0, not {self.n}")

    s = Settings(Checked, flag_prefix="", env_prefix="", file_flag="f", file_env="F")
    with pytest.raises(SettingsError, match="Checked: n must be >= 0, not -1"):
        build(["--n", "-1"], settings=s)


def test_an_unsupported_field_type_is_named() -> None:
    @dataclasses.dataclass
    class Odd:
        mapping: dict[str, int] = dataclasses.field(default_factory=dict)

    s = Settings(Odd, flag_prefix="", env_prefix="", file_flag="f", file_env="F")
    with pytest.raises(SettingsError, match=r"Odd.mapping: unsupported type dict\[str, int\]"):
        s.add(argparse.ArgumentParser())


def test_help_names_each_flag_its_variable_and_default() -> None:
    p = argparse.ArgumentParser(prog="t")
    SETTINGS.add(p)
    text = " ".join(p.format_help().split())
    assert "--app.name STR [APP_NAME] (required)" in text
    assert "--app.top-n INT [APP_TOP_N] (default: 10)" in text
    assert "--app.words LIST_OF_STR [APP_WORDS] (default: [])" in text
    assert "--app-config FILE YAML or JSON file of the settings, by field name [T_FILE]" in text


def test_settings_class_is_a_dataclass_config_attribute() -> None:
    class WithConfig:
        Config = Conf

    class NotADataclass:
        class Config:
            pass

    assert settings_class(WithConfig) is Conf
    assert settings_class(WithConfig()) is Conf
    assert settings_class(NotADataclass) is None
    assert settings_class(object) is None
