"""One default configuration: the app opens on it and the CLI's run and explain use it without flags."""

from __future__ import annotations

import shlex

import pytest

from remat_lab.cli import build_parser
from remat_lab.cli.common import config_from
from remat_lab.config import APP_DEFAULT, RunConfig, flag_defaults
from remat_lab.present.reproduce import cli_command


@pytest.mark.parametrize("command", ["run", "explain"])
def test_the_cli_without_flags_is_the_apps_default(command):
    assert config_from(build_parser().parse_args([command])) == APP_DEFAULT


def test_the_app_opens_on_the_same_default():
    pytest.importorskip("streamlit")
    from pages import _sidebar, _url

    assert _url.DEFAULT is APP_DEFAULT and _sidebar.DEFAULT is APP_DEFAULT


def test_the_default_is_a_scanned_stack_and_flags_still_override_it():
    assert (APP_DEFAULT.model, APP_DEFAULT.depth, APP_DEFAULT.stack) == ("mlp", 8, "scan")
    assert {k: getattr(APP_DEFAULT, k) for k in flag_defaults()} == flag_defaults()
    assert all(getattr(RunConfig(), k) != v for k, v in flag_defaults().items())
    cfg = config_from(build_parser().parse_args(["run", "--width", "64", "--depth", "2", "--batch", "4"]))
    assert (cfg.width, cfg.depth, cfg.batch) == (64, 2, 4)
    # The app's "reproduce" command names every shape flag, so it means the same under any default.
    words = shlex.split(cli_command(APP_DEFAULT.replace(depth=1, batch=64)))[3:]
    assert config_from(build_parser().parse_args(words)) == APP_DEFAULT.replace(depth=1, batch=64)
