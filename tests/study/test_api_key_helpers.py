"""``--api-key`` and ``OPENAI_API_KEY`` live with the OpenAI client every engine-facing
study command shares (:mod:`gpugov.study.openai_client`), not in ``load``'s command
module, which ``profile`` imported them from."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

import gpugov.study.load_cli as load_cli
from gpugov.daemon.cli_support import UsageError
from gpugov.study.openai_client import (
    API_KEY_VARIABLE,
    add_api_key_argument,
    resolve_api_key,
)

STUDY = Path(load_cli.__file__).resolve().parent


def test_the_key_comes_from_the_flag_then_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_VARIABLE, "from-env")
    assert resolve_api_key("from-flag") == "from-flag"
    assert resolve_api_key(None) == "from-env"
    monkeypatch.setenv(API_KEY_VARIABLE, "")
    assert resolve_api_key(None) is None
    monkeypatch.setenv(API_KEY_VARIABLE, "two words")
    with pytest.raises(UsageError, match=f"^{API_KEY_VARIABLE}: an API key is") as raised:
        resolve_api_key(None)
    assert "two words" not in str(raised.value)  # never the key


def test_the_flag_is_added_by_the_shared_helper() -> None:
    parser = argparse.ArgumentParser()
    add_api_key_argument(parser)
    assert parser.parse_args(["--api-key", "k"]).api_key == "k"
    assert parser.parse_args([]).api_key is None


def test_no_study_command_takes_them_from_load_s_command_module() -> None:
    assert not hasattr(load_cli, "resolve_api_key")
    assert not hasattr(load_cli, "add_api_key_argument")
    for source in STUDY.rglob("*.py"):
        tree = ast.parse(source.read_text(), str(source))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "gpugov.study.load_cli":
                names = {alias.name for alias in node.names}
                assert not names & {"resolve_api_key", "add_api_key_argument"}, source
