"""Commands come from plugins through ``bertblocks_register_commands``: a third party's appears in ``--help``
and runs, the shipped ones register the same way, a clash of names is an error naming both plugins, and
``--help`` imports no command's module."""

from __future__ import annotations

import argparse
import sys
import types

import pytest

from bertblocks import cli
from bertblocks.core.component import Command
from bertblocks.registry import DuplicateCommandError, Registry, set_registry

MISSING = "bertblocks_no_such_module"


@pytest.fixture
def registry():
    reg = Registry(load_entry_points=False)
    set_registry(reg)
    yield reg
    set_registry(None)


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("who")


def _run(args: argparse.Namespace) -> int:
    cli.emit(args, f"hello, {args.who}", {"greeting": args.who})
    return 0


greeter = types.SimpleNamespace(bertblocks_register_commands=lambda: [Command("hello", "say hello", _configure, _run)])


def test_a_third_party_command_appears_in_help_and_runs(registry, capsys):
    registry.register(greeter, "greeter-plugin")
    assert cli.main(["--help"]) == 0
    assert "say hello" in capsys.readouterr().out
    assert cli.main(["hello", "world"]) == 0
    assert capsys.readouterr().out.strip() == "hello, world"
    assert cli.main(["--json", "hello", "you"]) == 0
    assert '"greeting": "you"' in capsys.readouterr().out
    assert cli.SUBCOMMANDS["hello"].provider == "greeter-plugin"


def test_the_shipped_commands_register_through_the_hook(registry):
    commands = registry_commands = cli.plugin_commands()
    assert commands["ablate"].provider == "bertblocks.ablation.plugin (bertblocks)"
    assert commands["build"].provider == "bertblocks.cli.commands (bertblocks)"
    assert list(registry_commands)[-1] == "ablate"  # listed after the built-in commands
    hooks = {p.name: p.hooks for p in registry.plugins()}
    assert hooks["bertblocks.ablation.plugin"] == ("bertblocks_register_commands",)


def test_a_duplicate_command_name_is_an_error_naming_both_plugins(registry, capsys):
    clash = types.SimpleNamespace(bertblocks_register_commands=lambda: [Command("build", "mine", _configure, _run)])
    registry.register(clash, "clashing-plugin")
    with pytest.raises(DuplicateCommandError, match="command 'build' is registered twice") as raised:
        cli.plugin_commands()
    assert "bertblocks.cli.commands (bertblocks)" in str(raised.value)
    assert "clashing-plugin" in str(raised.value)
    assert cli.main(["--help"]) == 1
    err = capsys.readouterr().err
    assert "command 'build' is registered twice" in err
    assert "bertblocks.cli.commands (bertblocks)" in err
    assert "clashing-plugin" in err


def test_help_imports_no_commands_module(registry, capsys):
    lazy = types.SimpleNamespace(
        bertblocks_register_commands=lambda: [
            Command(
                "later", "imported when run", "bertblocks_no_such_module:configure", "bertblocks_no_such_module:run"
            )
        ]
    )
    registry.register(lazy, "lazy-plugin")
    assert cli.main(["--help"]) == 0  # the missing module is not needed to list the command
    assert "imported when run" in capsys.readouterr().out
    assert MISSING not in sys.modules
    assert cli.main(["later"]) == 3  # and running it says what is missing
    assert "bertblocks_no_such_module:configure is not available" in capsys.readouterr().err


def test_a_hook_returning_something_else_is_reported_as_that_plugins_failure(registry):
    broken = types.SimpleNamespace(bertblocks_register_commands=lambda: ["hello"])
    registry.register(broken, "broken-plugin")
    commands = cli.plugin_commands()
    assert "build" in commands  # the others keep working
    assert any("broken-plugin" in e.plugin and "not a Command" in e.detail for e in registry.load_errors)
