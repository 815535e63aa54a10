"""The ``bertblocks`` command line: build, inspect and check models assembled from configs.

Run ``bertblocks --help`` for the commands, ``bertblocks CMD --help`` for one; ``docs/reference/cli.md`` lists
them all (generated from this parser).

Exit codes (scripts may rely on them):

====  ================================================================================================
0     success
1     invalid input, i.e. any :class:`~bertblocks.errors.BertBlocksError`: a missing file, malformed YAML/JSON,
      an invalid config (every error is printed), an unknown preset or component, weights that do not fit, a
      plugin that failed to load (``plugins``)
2     usage error (argparse: unknown command or option, missing argument)
3     a feature this installation lacks (a part of bertblocks or an optional dependency is missing)
4     any other exception: an unexpected internal error (a bug: please report it with the output of ``--debug``)
130   interrupted by Ctrl-C (SIGINT); ``bertblocks ablate`` says how to resume
141   stdout was closed before the output was written (``bertblocks presets | head -1``): nothing more is
      printed, no error message; the status a shell gives a Unix tool ended by SIGPIPE
143   stopped by SIGTERM (``bertblocks ablate``: the finished runs are recorded; it says how to resume)
====  ================================================================================================

Exit 4 means a bug in bertblocks and nothing else: every error bertblocks raises for a refused input is a
:class:`~bertblocks.errors.BertBlocksError` (``tests/test_errors.py`` checks every ``raise`` in the package).

Errors are one clear message on stderr; ``--debug`` adds the traceback. ``--json`` (before or after the
command) prints machine-readable output on stdout instead of tables.

Adding a command:
    A plugin returns :class:`~bertblocks.core.component.Command` objects from its ``bertblocks_register_commands``
    hook (datasette's ``register_commands``); the built-in commands (:mod:`bertblocks.cli.commands`) and
    ``bertblocks ablate`` (:mod:`bertblocks.ablation.plugin`) register through the same hook. ``configure`` and
    ``run`` may be ``"module:function"`` strings, imported only when the command runs, so that
    ``bertblocks --help`` stays fast::

        def bertblocks_register_commands():
            return [Command("hello", "say hello", configure="my_plugin.cli:configure", run="my_plugin.cli:run")]

    ``configure`` adds the command's arguments; :func:`add_config_argument` adds the usual ``CONFIG`` and
    ``--set`` options and :func:`config_from_args` reads them. ``run`` prints with :func:`emit` (which honours
    ``--json``) and returns the exit code; raising :class:`CLIError` (exit 1) or any of the library's errors
    gives a clean one-message failure. Two plugins registering the same name is an error naming both.
    :func:`register_subcommand` adds a command in-process (an embedding application, a test).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import select
import sys
import traceback
from collections.abc import Callable, Collection, Iterator, MutableMapping, Sequence
from typing import Any

from ..core.component import Command
from ..errors import BertBlocksError, InputError, MissingKeyError
from ..progress import line as progress_line

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_INTERNAL = 4
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a program Ctrl-C stopped
EXIT_CLOSED_STDOUT = 141  # 128 + SIGPIPE, what a shell reports for `yes | head -1`'s yes
EXIT_TERMINATED = 143  # 128 + SIGTERM

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success",
    EXIT_INVALID: "invalid input: missing file, malformed or invalid config, unknown preset/component, bad weights",
    EXIT_USAGE: "usage error (unknown command or option, missing argument)",
    EXIT_UNAVAILABLE: "a feature this installation lacks",
    EXIT_INTERNAL: "unexpected internal error (a bug, and nothing else; rerun with --debug)",
    EXIT_INTERRUPTED: "interrupted by Ctrl-C (SIGINT); `ablate` records the finished runs and says how to resume",
    EXIT_CLOSED_STDOUT: "stdout was closed early (`| head`): the rest is dropped quietly, as Unix tools do",
    EXIT_TERMINATED: "stopped by SIGTERM; `ablate` records the finished runs and says how to resume",
}


class CLIError(BertBlocksError):
    """A failure to report as one message with an exit code (default 1, invalid input)."""

    def __init__(self, message: str, code: int = EXIT_INVALID) -> None:
        super().__init__(message)
        self.code = code


class UnavailableError(CLIError):
    """A command needs a part of bertblocks (or a package) that this installation does not have."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_UNAVAILABLE)


Configure = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


#: a command (the name this module has always used for :class:`~bertblocks.core.component.Command`)
Subcommand = Command

#: the command plugins bertblocks ships; registered into the registry through the same hook a third party uses
DEFAULT_COMMAND_PLUGINS = ("bertblocks.cli.commands", "bertblocks.ablation.plugin")


def plugin_commands() -> dict[str, Command]:
    """The commands every plugin registers (``bertblocks_register_commands``), shipped ones included.

    Raises:
        DuplicateCommandError: two plugins registered one name (the message names both).
    """
    from .. import __version__
    from ..registry import get_registry

    registry = get_registry()
    for module in DEFAULT_COMMAND_PLUGINS:
        if not registry.has_plugin(module):
            registry.register(importlib.import_module(module), module, distribution="bertblocks", version=__version__)
    return registry.commands()


class CommandTable(MutableMapping[str, Command]):
    """Every ``bertblocks`` command by name: the plugins' (read when used, never at import), plus commands set
    here in-process (:func:`register_subcommand`, or ``SUBCOMMANDS[name] = …`` to replace one)."""

    def __init__(self) -> None:
        self._added: dict[str, Command] = {}
        self._removed: set[str] = set()

    def _all(self) -> dict[str, Command]:
        commands = {name: c for name, c in plugin_commands().items() if name not in self._removed}
        commands.update(self._added)
        return commands

    def __getitem__(self, name: str) -> Command:
        return self._all()[name]

    def __setitem__(self, name: str, command: Command) -> None:
        self._added[name] = command
        self._removed.discard(name)

    def __delitem__(self, name: str) -> None:
        if name in self._added:
            del self._added[name]
        elif name in plugin_commands() and name not in self._removed:
            self._removed.add(name)
        else:
            raise MissingKeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


SUBCOMMANDS: MutableMapping[str, Command] = CommandTable()


def register_subcommand(
    name: str, help: str, configure: Configure | str, run: Run | str, description: str = ""
) -> Command:
    """Add a command in-process; a name already taken (by a plugin or in-process) is an error."""
    if name in SUBCOMMANDS:
        provider = SUBCOMMANDS[name].provider or "(in-process)"
        raise InputError(f"bertblocks subcommand {name!r} is already registered (by {provider})")
    command = Command(name, help, configure, run, description, provider="(in-process)")
    SUBCOMMANDS[name] = command
    return command


def _resolve(target: Callable[..., Any] | str) -> Callable[..., Any]:
    if callable(target):
        return target
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise UnavailableError(f"{target} is not available in this installation ({e})") from None


# ------------------------------------------------------------------------------------- helpers for commands
def add_config_argument(parser: argparse.ArgumentParser, metavar: str = "CONFIG") -> None:
    """``CONFIG`` (a YAML/JSON file, a checkpoint directory or a preset name) and repeatable ``--set``."""
    parser.add_argument(
        "config", metavar=metavar, help="YAML/JSON config file, HF checkpoint directory, or preset name"
    )
    add_set_argument(parser)


def add_checkpoint_head_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--head`` option of commands that load a checkpoint (``export``, ``quantize``)."""
    parser.add_argument(
        "--head",
        default="auto",
        metavar="NAME",
        help="'auto' (the head config.json's architectures names; default), 'none' (the backbone) or a head name",
    )


def add_set_argument(
    parser: argparse.ArgumentParser,
    target: str = "config",
    examples: Sequence[str] = ("encoder.attention.backend=eager",),
) -> None:
    """The repeatable ``--set dotted.key=value`` override option (into ``args.overrides``), for every command.

    Args:
        parser: the command's parser.
        target: what the dotted keys address (``config``; ``study`` for ``bertblocks ablate``), named in the help.
        examples: ``KEY=VALUE`` examples shown in the help.
    """
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a {target} field (dotted path, value parsed as YAML); repeatable, "
        f"e.g. {' '.join(f'--set {example}' for example in examples)}",
    )


def config_from_args(args: argparse.Namespace) -> Any:
    """The validated :class:`~bertblocks.BertConfig` named by ``args.config`` with ``args.overrides`` applied."""
    return load_config_source(args.config, args.overrides)


def load_config_source(source: str, overrides: Sequence[str] = ()) -> Any:
    """Load a config from a file, a checkpoint directory or a preset name (overrides applied, validated).

    Raises:
        FileNotFoundError: a path that does not exist.
        bertblocks.registry.UnknownPresetError: a bare name that is no preset (the message names the closest).
        bertblocks.config.ConfigError: the config is malformed or invalid (every problem, with dotted paths).
    """
    import bertblocks

    return bertblocks.load_config(source, overrides)


def check_output_file(path: str | os.PathLike[str], option: str) -> None:
    """Refuse, before any work, an output file that cannot be written: a directory, or one whose folder is
    missing or is a file. Every command that writes a file calls it, so a wrong path is exit 1 with its name,
    never an OSError from deep inside (exit 4, "a bug").

    Raises:
        CLIError: naming the option and the path.
    """
    from pathlib import Path

    out = Path(path)
    if out.is_dir():
        raise CLIError(f"{option} {out} is a directory; give the file to write")
    folder = out.parent
    if not folder.exists():
        raise CLIError(f"{option} {out}: the folder {folder} does not exist; create it first")
    if not folder.is_dir():
        raise CLIError(f"{option} {out}: {folder} is a file, not a folder")


def emit(args: argparse.Namespace, text: str, data: Any) -> None:
    """Print ``data`` as JSON with ``--json``, else ``text``."""
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, default=str))
    else:
        print(text)


def progress(args: argparse.Namespace, text: str) -> None:
    """One line on stderr saying what a slow step is doing, when a person watches (stderr is a terminal).

    Slow commands (``export``, a checkpoint load) otherwise sit silent for seconds to minutes; scripts and
    ``--json`` readers, whose stderr is not a terminal, get none of these lines.
    """
    progress_line(text, quiet=getattr(args, "json", False))  # the one rule and look, the library's too


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """A plain left-aligned text table."""
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ parser
def build_parser(configure: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every registered command; ``docs/reference/cli.md`` is generated from it.

    Args:
        configure: the commands whose arguments are added (their ``configure`` imported); ``None``: all.
            ``bertblocks --help`` configures none, so it imports no command's module.
    """
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: given after the command these override the main parser's; absent, they do not reset it.
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="tracebacks on errors")
    parser = argparse.ArgumentParser(
        prog="bertblocks",
        description="Build, inspect and check BERT models assembled from configs and plugins.",
        epilog="exit codes: " + "; ".join(f"{code} {text}" for code, text in EXIT_CODES.items()),
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output (JSON on stdout)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"bertblocks {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in list(SUBCOMMANDS.values()):
        p = sub.add_parser(
            command.name,
            help=command.help,
            description=command.description or command.help,
            parents=[common],
        )
        if configure is not None and command.name not in configure:
            continue
        try:
            _resolve(command.configure)(p)
        except UnavailableError as e:
            # One command whose module is missing must not take the others down: it reports itself when run.
            p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
            p.set_defaults(_run=_unavailable(str(e)))
            continue
        p.set_defaults(_run=command.run)
    return parser


def _unavailable(message: str) -> Run:
    def run(args: argparse.Namespace) -> int:
        raise UnavailableError(message)

    return run


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it).

    Example:
        >>> main(["validate", "examples/configs/minilm-relative-ablation.yaml"])
        0
    """
    try:
        code = _main(argv)
        if sys.stdout is not None:  # None when started with no stdout at all (`>&-`)
            sys.stdout.flush()  # a closed stdout shows here at the latest, not as a traceback at interpreter exit
        return code
    except BrokenPipeError:
        if not _stdout_closed():
            raise
        # the reader is gone (`| head`): say nothing, as Unix tools do; what Python still buffers for stdout
        # goes to /dev/null, so its flush at exit raises nothing either
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_CLOSED_STDOUT


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (a BrokenPipeError from elsewhere, e.g. a worker's pipe,
    is an error like any other)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by an object without a file (a test's capture)
        return False
    if not hasattr(select, "poll"):  # pragma: no cover - Windows: no poll; the broken pipe can only be stdout's
        return True
    poller = select.poll()
    poller.register(fd, 0)  # POLLERR is reported whatever the mask: a pipe's write end whose reader closed
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _main(argv: Sequence[str] | None) -> int:
    arguments = list(argv) if argv is not None else sys.argv[1:]
    chosen = next((a for a in arguments if not a.startswith("-")), None)
    try:
        parser = build_parser(configure={chosen} if chosen else set())
    except BertBlocksError as e:  # e.g. two plugins registering one command name: say which, exit 1
        print(f"bertblocks: error: {e}", file=sys.stderr)
        return EXIT_INVALID
    try:
        args = parser.parse_args(arguments)
    except SystemExit as e:  # argparse: --help/--version (0) or a usage error (2)
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
    try:
        return int(_resolve(args._run)(args))
    except Exception as e:
        if isinstance(e, BrokenPipeError) and _stdout_closed():
            raise  # main() ends quietly
        code = _exit_code(e)
        message = _message(e)
        print(f"bertblocks {args.command}: error: {message}", file=sys.stderr)
        if args.debug:
            traceback.print_exc()
        elif code == EXIT_INTERNAL:
            print("(this is a bug; rerun with --debug for the traceback)", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        print(f"bertblocks {args.command}: interrupted", file=sys.stderr)
        if args.debug:
            traceback.print_exc()
        return EXIT_INTERRUPTED


def _exit_code(error: Exception) -> int:
    """1 for what bertblocks refused (every such error is a :class:`BertBlocksError`), 3 for a missing part, 4 for
    anything else: an exception no one raised on purpose is a bug, and is reported as one."""
    if isinstance(error, CLIError):
        return error.code
    if isinstance(error, BertBlocksError):
        return EXIT_INVALID
    if isinstance(error, ImportError):
        return EXIT_UNAVAILABLE
    return EXIT_INTERNAL


def _message(error: Exception) -> str:
    if isinstance(error, FileNotFoundError) and error.filename:
        return f"no such file or directory: {error.filename}"
    text = str(error) or type(error).__name__
    if _exit_code(error) == EXIT_INTERNAL:
        return f"{type(error).__name__}: {text}"
    return text
