"""Every error bertblocks raises on purpose derives from BertBlocksError, and the command line tells those (exit 1,
one line) from bugs (exit 4) by that base alone."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import bertblocks
from bertblocks import cli
from bertblocks.errors import BertBlocksError

#: exception classes that are not errors: control flow, never shown to a user as a failure
NOT_ERRORS = {"bertblocks.testing.subject.ConformanceSkip"}


def _exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in a bertblocks module (warnings are not errors), by qualified name."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(bertblocks.__path__, "bertblocks."):
        if info.name.endswith("__main__"):  # runs the command line on import
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and not issubclass(obj, Warning)
                and obj.__module__ == module.__name__
            ):
                found[f"{module.__name__}.{name}"] = obj
    return found


def test_every_error_class_of_the_package_derives_from_bertblocks_error():
    classes = _exception_classes()
    assert len(classes) > 20  # the walk found the package's errors (config, registry, checkpoints, CLI, ...)
    assert set(NOT_ERRORS) <= set(classes)  # the exemptions still exist
    outside = sorted(name for name, cls in classes.items() if not issubclass(cls, BertBlocksError))
    assert outside == sorted(NOT_ERRORS)


@pytest.mark.parametrize(
    "error",
    [
        type("SomeNewError", (BertBlocksError, ValueError), {})("what was refused, and where"),
        bertblocks.config.ConfigError([], "x.yaml"),
    ],
)
def test_the_cli_reports_any_bertblocks_error_as_invalid_input_in_one_line(error, capsys, monkeypatch):
    def refuse(args):
        raise error

    monkeypatch.setitem(cli.SUBCOMMANDS, "refuse", cli.Subcommand("refuse", "test", lambda p: None, refuse))
    assert cli.main(["refuse"]) == cli.EXIT_INVALID
    err = capsys.readouterr().err
    assert err.startswith(f"bertblocks refuse: error: {str(error).splitlines()[0]}")
    assert "bug" not in err
    assert "Traceback" not in err


@pytest.mark.parametrize("error", [ValueError("shape"), FileNotFoundError(2, "gone", "x"), KeyError("k")])
def test_the_cli_reports_any_other_exception_as_a_bug(error, capsys, monkeypatch):
    def crash(args):
        raise error

    monkeypatch.setitem(cli.SUBCOMMANDS, "crash", cli.Subcommand("crash", "test", lambda p: None, crash))
    assert cli.main(["crash"]) == cli.EXIT_INTERNAL
    assert "this is a bug" in capsys.readouterr().err
