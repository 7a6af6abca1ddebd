"""Service settings: a flag beats its TIDEMARK_* variable, which beats the default."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tidemark.config import (
    ServiceConfig,
    blob_url_setting,
    build_parser,
    consensus_url_setting,
    env_var,
    listen_setting,
    load_config,
    setting,
)


@dataclass(frozen=True)
class DemoConfig(ServiceConfig):
    listen: str = listen_setting("127.0.0.1:7001")
    consensus_url: str = consensus_url_setting("sqlite:///tmp/demo.db")
    blob_url: str = blob_url_setting("file:///tmp/demo-blobs")
    batch_limit: int = setting(1024, help="most calls per round trip")
    compact: bool = setting(True, help="merge small batches in the background")


def test_defaults_apply_when_neither_flag_nor_variable_is_given() -> None:
    config = load_config(DemoConfig, [], {})
    assert config == DemoConfig()
    assert (config.listen, config.batch_limit, config.compact) == ("127.0.0.1:7001", 1024, True)
    assert (config.log_format, config.log_level, config.shutdown_grace) == ("auto", "info", 10.0)


def test_a_variable_beats_the_default_and_a_flag_beats_the_variable() -> None:
    environ = {
        "TIDEMARK_LISTEN": "0.0.0.0:9000",
        "TIDEMARK_BATCH_LIMIT": "7",
        "TIDEMARK_CONSENSUS_URL": "etcd://etcd-0:2379,etcd-1:2379",
        "TIDEMARK_SHUTDOWN_GRACE": "2.5",
        "TIDEMARK_COMPACT": "off",
    }
    from_env = load_config(DemoConfig, [], environ)
    assert from_env.listen == "0.0.0.0:9000"
    assert from_env.batch_limit == 7
    assert from_env.consensus_url == "etcd://etcd-0:2379,etcd-1:2379"
    assert from_env.shutdown_grace == 2.5
    assert from_env.compact is False
    assert from_env.blob_url == "file:///tmp/demo-blobs"

    from_flags = load_config(
        DemoConfig, ["--listen", "[::]:9100", "--batch-limit", "9", "--compact"], environ
    )
    assert from_flags.listen == "[::]:9100"
    assert from_flags.batch_limit == 9
    assert from_flags.compact is True
    # Settings without a flag still come from the environment.
    assert from_flags.shutdown_grace == 2.5


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1", True), ("TRUE", True), ("yes", True), ("on", True), ("0", False), ("No", False)],
)
def test_boolean_variables_accept_the_usual_spellings(text: str, expected: bool) -> None:
    assert load_config(DemoConfig, [], {"TIDEMARK_COMPACT": text}).compact is expected


def test_no_flag_turns_a_boolean_off() -> None:
    assert load_config(DemoConfig, ["--no-compact"], {"TIDEMARK_COMPACT": "yes"}).compact is False


def test_a_bad_variable_exits_with_a_message_naming_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        load_config(DemoConfig, [], {"TIDEMARK_SHUTDOWN_GRACE": "soon"})
    assert exited.value.code == 2
    assert "TIDEMARK_SHUTDOWN_GRACE" in capsys.readouterr().err


def test_a_value_outside_the_choices_is_refused_from_flags_and_variables(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        load_config(DemoConfig, ["--log-format", "xml"], {})
    assert "'xml' is not one of auto, json, console" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        load_config(DemoConfig, [], {"TIDEMARK_LOG_LEVEL": "chatty"})
    assert "TIDEMARK_LOG_LEVEL" in capsys.readouterr().err


def test_help_lists_each_flag_with_its_variable_and_default() -> None:
    shown = " ".join(build_parser(DemoConfig, prog="demo").format_help().split())
    for name, default in [
        ("listen", "127.0.0.1:7001"),
        ("consensus_url", "sqlite:///tmp/demo.db"),
        ("blob_url", "file:///tmp/demo-blobs"),
        ("log_format", "auto"),
        ("log_level", "info"),
        ("shutdown_grace", "10.0"),
        ("batch_limit", "1024"),
    ]:
        assert f"--{name.replace('_', '-')}" in shown
        assert f"[env {env_var(name)}; default: {default}]" in shown
    assert "--compact, --no-compact" in shown


def test_every_field_must_be_declared_as_a_setting() -> None:
    @dataclass(frozen=True)
    class Sloppy(ServiceConfig):
        hidden: int = 3

    with pytest.raises(TypeError, match="hidden"):
        load_config(Sloppy, [], {})
