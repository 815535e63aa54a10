"""The ``bertblocks`` command line: build, inspect and check models assembled from configs.

Run ``bertblocks --help`` for the commands, ``bertblocks CMD --help`` for one; ``docs/reference/cli.md`` lists
them all (generated from this parser).

Exit codes (scripts may rely on them):

====  ================================================================================================
0     success
1     invalid input: a missing file, malformed YAML/JSON, an invalid config (every error is printed), an
      unknown preset or component, weights that do not fit, a plugin that failed to load (``plugins``)
2     usage error (argparse: unknown command or option, missing argument)
3     a feature this installation lacks (a part of bertblocks or an optional dependency is missing)
4     an unexpected internal error (a bug: please report it with the output of ``--debug``)
====  ================================================================================================

Errors are one clear message on stderr; ``--debug`` adds the traceback. ``--json`` (before or after the
command) prints machine-readable output on stdout instead of tables.

Adding a command:
    Every command is a :class:`Subcommand` in :data:`SUBCOMMANDS`, a table keyed by name. Add one with
    :func:`register_subcommand`, giving either callables or ``"module:function"`` strings (imported only when
    the command runs, so ``bertblocks --help`` stays fast)::

        register_subcommand(
            "ablate",
            "run an ablation grid over config overrides",
            configure="bertblocks.ablation:configure_parser",  # (parser: ArgumentParser) -> None
            run="bertblocks.ablation:run",                     # (args: Namespace) -> int (exit code)
        )

    ``configure`` adds the command's arguments; :func:`add_config_argument` adds the usual ``CONFIG`` and
    ``--set`` options and :func:`config_from_args` reads them. ``run`` prints with :func:`emit` (which honours
    ``--json``) and returns the exit code; raising :class:`CLIError` (exit 1) or any of the library's errors
    gives a clean one-message failure. The registration line belongs in this module, in the table at the
    bottom, so that the command exists without importing anything else.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_INTERNAL = 4

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success",
    EXIT_INVALID: "invalid input: missing file, malformed or invalid config, unknown preset/component, bad weights",
    EXIT_USAGE: "usage error (unknown command or option, missing argument)",
    EXIT_UNAVAILABLE: "a feature this installation lacks",
    EXIT_INTERNAL: "unexpected internal error (a bug; rerun with --debug)",
}


class CLIError(Exception):
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


@dataclass(frozen=True)
class Subcommand:
    """One ``bertblocks`` command.

    Attributes:
        name: what users type.
        help: one line for ``bertblocks --help``.
        configure: adds the command's arguments to its parser; a callable or ``"module:function"``.
        run: does the work and returns the exit code; a callable or ``"module:function"``.
        description: longer text for ``bertblocks NAME --help`` (defaults to ``help``).
    """

    name: str
    help: str
    configure: Configure | str
    run: Run | str
    description: str = ""


SUBCOMMANDS: dict[str, Subcommand] = {}


def register_subcommand(
    name: str, help: str, configure: Configure | str, run: Run | str, description: str = ""
) -> Subcommand:
    """Add a command to :data:`SUBCOMMANDS`; a name already taken is an error (no silent replacement)."""
    if name in SUBCOMMANDS:
        raise ValueError(f"bertblocks subcommand {name!r} is already registered")
    command = Subcommand(name, help, configure, run, description)
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


def add_set_argument(parser: argparse.ArgumentParser) -> None:
    """The repeatable ``--set dotted.key=value`` override option."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field (dotted path, value parsed as YAML); repeatable, "
        "e.g. --set encoder.attention.backend=eager",
    )


def config_from_args(args: argparse.Namespace) -> Any:
    """The validated :class:`~bertblocks.BertConfig` named by ``args.config`` with ``args.overrides`` applied."""
    return load_config_source(args.config, args.overrides)


def load_config_source(source: str, overrides: Sequence[str] = ()) -> Any:
    """Load a config from a file, a checkpoint directory or a preset name (overrides applied, validated).

    Raises:
        FileNotFoundError: a path that does not exist.
        bertblocks.UnknownPresetError: a bare name that is no preset (the message names the closest).
        bertblocks.ConfigError: the config is malformed or invalid (every problem, with dotted paths).
    """
    import bertblocks

    return bertblocks.load_config(source, overrides)


def emit(args: argparse.Namespace, text: str, data: Any) -> None:
    """Print ``data`` as JSON with ``--json``, else ``text``."""
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, default=str))
    else:
        print(text)


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """A plain left-aligned text table."""
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- validate
def _configure_validate(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--show", action="store_true", help="print the validated config with every value")


def _run_validate(args: argparse.Namespace) -> int:
    import bertblocks

    try:
        cfg = config_from_args(args)
    except bertblocks.ConfigError as e:
        issues = [{"loc": i.loc, "msg": i.msg} for i in e.issues]
        if args.json:
            emit(args, "", {"valid": False, "source": e.source or args.config, "errors": issues})
            return EXIT_INVALID
        raise
    summary = _summary(cfg)
    text = f"ok: {args.config} is a valid config ({summary})"
    if args.show:
        text += "\n" + bertblocks.dump_yaml(cfg).rstrip()
    emit(args, text, {"valid": True, "source": args.config, "summary": summary, "config": cfg.model_dump(mode="json")})
    return EXIT_OK


def _summary(cfg: Any) -> str:
    enc = cfg.encoder
    parts = [
        f"{enc.num_layers} layers",
        f"hidden {cfg.hidden_size}",
        f"{enc.attention.num_heads} heads",
        f"feed-forward {enc.feedforward.intermediate_size} {enc.feedforward.activation}",
        f"position {cfg.position.name}",
        f"backend {enc.attention.backend.name}",
        f"vocab {cfg.vocab_size}",
    ]
    if enc.overrides:
        parts.append(f"{len(enc.overrides)} per-layer override{'s' if len(enc.overrides) > 1 else ''}")
    if cfg.head is not None:
        parts.append(f"head {cfg.head.name}")
    return ", ".join(parts)


# ------------------------------------------------------------------------------------------------- build
def _configure_build(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser, "CONFIG|PRESET")
    parser.add_argument("--head", metavar="NAME", help="add a task head (masked_lm, sequence_classification, …)")
    parser.add_argument(
        "--depth", type=int, default=None, help="deepest module level listed (default: each layer's sub-layers)"
    )


def _build_model(cfg: Any, head: str | None, device: str = "meta") -> Any:
    """Assemble ``cfg`` (with ``head``) without weights; on the meta device only shapes are made (no memory).

    A head (``--head`` or the config's ``head``) gives a task model (``BertForMaskedLM``, …), else a backbone.
    """
    import torch

    import bertblocks

    from ..models.task_models import BertTaskModel

    with torch.device(device):
        if head is None and cfg.head is None:
            return bertblocks.build_model(cfg)
        return BertTaskModel.from_config(cfg, head=head)


def _run_build(args: argparse.Namespace) -> int:
    from .. import introspect

    cfg = config_from_args(args)
    model = _build_model(cfg, args.head)
    depth = args.depth if args.depth is not None else introspect.default_trace_depth(model) - 1
    rows = introspect.module_tree(model, max_depth=depth)
    counts = introspect.count_parameters(model)
    title = f"{args.config}: {_summary(model.config)}"
    emit(
        args,
        introspect.format_tree(rows, counts, title),
        {
            "source": args.config,
            "model": type(model).__name__,
            "parameters": {"per_module": counts.per_module, "unique": counts.unique, "trainable": counts.trainable},
            "modules": [
                {
                    "path": r.path,
                    "name": r.name,
                    "type": r.type,
                    "depth": r.depth,
                    "params": r.params,
                    "repeat": r.repeat,
                }
                for r in rows
            ],
            "config": model.config.model_dump(mode="json"),
        },
    )
    return EXIT_OK


# ------------------------------------------------------------------------------------ plugins, components
def _configure_plugins(parser: argparse.ArgumentParser) -> None:
    del parser  # no arguments


def _run_plugins(args: argparse.Namespace) -> int:
    import bertblocks

    registry = bertblocks.get_registry()
    registry.components()  # calls every plugin's hook, so that broken ones are known
    if hasattr(registry, "presets"):
        registry.presets()
    plugins = registry.plugins()
    errors = registry.load_errors
    rows = [
        (p.name, p.distribution, p.version, ", ".join(h.removeprefix("bertblocks_") for h in p.hooks)) for p in plugins
    ]
    text = table(rows, ("plugin", "distribution", "version", "hooks"))
    for error in errors:
        text += f"\nFAILED  {error.summary()}" + (f"\n{error.detail}" if args.debug else "")
    emit(
        args,
        text,
        {
            "plugins": [
                {"name": p.name, "distribution": p.distribution, "version": p.version, "hooks": list(p.hooks)}
                for p in plugins
            ],
            "errors": [{"plugin": e.plugin, "distribution": e.distribution, "detail": e.detail} for e in errors],
        },
    )
    return EXIT_INVALID if errors else EXIT_OK


def _configure_components(parser: argparse.ArgumentParser) -> None:
    from ..core.component import KINDS

    parser.add_argument("kind", nargs="?", choices=KINDS, help="list only this kind")
    parser.add_argument("-v", "--verbose", action="store_true", help="also list each component's options")


def _options_of(component: Any) -> list[dict[str, Any]]:
    out = []
    for name, info in component.options.model_fields.items():
        default = None if info.is_required() else info.get_default(call_default_factory=True)
        annotation = getattr(info.annotation, "__name__", None) or str(info.annotation)
        out.append(
            {
                "name": name,
                "type": annotation.replace("typing.", ""),
                "default": default,
                "required": info.is_required(),
                "description": info.description or "",
            }
        )
    return out


def _run_components(args: argparse.Namespace) -> int:
    import bertblocks

    registry = bertblocks.get_registry()
    components = registry.components(args.kind)
    plugins = {p.name: p for p in registry.plugins()}

    def origin(component: Any) -> tuple[str, str, str]:
        """(plugin, distribution, version) of the plugin that registered ``component``."""
        name = component.provider.split(" (", 1)[0]
        info = plugins.get(name)
        return (name, info.distribution, info.version) if info else (name, "?", "")

    rows = [(c.kind, c.name, *origin(c)[1:], c.description) for c in components]
    text = table(rows, ("kind", "name", "distribution", "version", "description"))
    if args.verbose:
        for c in components:
            for opt in _options_of(c):
                text += f"\n  {c.kind} {c.name}: {opt['name']} ({opt['type']}, default {opt['default']!r})"
    emit(
        args,
        text,
        [
            {
                "kind": c.kind,
                "name": c.name,
                "provider": c.provider,
                "plugin": origin(c)[0],
                "distribution": origin(c)[1],
                "version": origin(c)[2],
                "description": c.description,
                "options": _options_of(c),
            }
            for c in components
        ],
    )
    return EXIT_OK


# ------------------------------------------------------------------------------------------------ presets
def _configure_presets(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pattern", nargs="?", default="*", help="shell-style wildcard, e.g. 'bert-*-cased'")


def _run_presets(args: argparse.Namespace) -> int:
    import bertblocks

    registry = bertblocks.get_registry()
    if not hasattr(registry, "presets"):
        raise UnavailableError("this installation has no presets")
    presets = [p for p in registry.presets() if fnmatchcase(p.name, args.pattern)]
    if not presets:
        raise CLIError(f"no preset matches {args.pattern!r}; `bertblocks presets` lists them all")
    rows = [(p.name, p.provider, p.description) for p in presets]
    emit(
        args,
        table(rows, ("preset", "provider", "description")),
        [{"name": p.name, "provider": p.provider, "description": p.description} for p in presets],
    )
    return EXIT_OK


# ------------------------------------------------------------------------------------------ trace, diagram
def _configure_trace(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser, "CONFIG|CHECKPOINT")
    parser.add_argument("--text", required=True, help="the input sentence")
    parser.add_argument("--pair", help="a second sentence (token type 1), as for next-sentence prediction")
    parser.add_argument("--head", metavar="NAME", help="add a task head (random weights)")
    parser.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="tokenizer directory (default: the checkpoint's, else the packaged all-MiniLM-L6-v2 vocabulary)",
    )
    parser.add_argument("--depth", type=int, default=None, help="deepest module level traced")


def _load_tokenizer(directory: str | Path) -> Any:
    from ..hf.tokenizer import BertTokenizer

    return BertTokenizer.from_pretrained(directory)


def _default_tokenizer_dir() -> Path:
    from ..sentence import minilm_path

    return minilm_path()


def _is_checkpoint(source: str) -> bool:
    return Path(source).is_dir() and (Path(source) / "config.json").is_file()


def _run_trace(args: argparse.Namespace) -> int:
    import torch

    import bertblocks

    from .. import introspect

    if _is_checkpoint(args.config):
        # the checkpoint's own head (its config.json `architectures`) unless --head names another
        model = bertblocks.from_pretrained(args.config, args.overrides, head=args.head or "auto")
        tok_dir = args.tokenizer or args.config
    else:
        cfg = config_from_args(args)
        torch.manual_seed(0)
        model = _build_model(cfg, args.head, device="cpu")
        tok_dir = args.tokenizer or _default_tokenizer_dir()
    model.eval()
    tokenizer = _load_tokenizer(tok_dir)
    cfg = model.config
    if args.pair is not None:
        batch = tokenizer([args.text], [args.pair], return_tensors="pt")
    else:
        batch = tokenizer([args.text], return_tensors="pt")
    batch = {k: v for k, v in dict(batch).items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    ids = batch["input_ids"]
    tokens = _tokens(tokenizer, ids[0].tolist())
    length = min(ids.shape[1], cfg.max_position_embeddings)
    batch = {k: v[:, :length] for k, v in batch.items()}
    notes = []
    if length < ids.shape[1]:
        notes.append(f"truncated to max_position_embeddings={cfg.max_position_embeddings}")
    if int(batch["input_ids"].max()) >= cfg.vocab_size:
        # A config with a smaller vocabulary than the tokenizer's still gets a real input of the same shape.
        batch["input_ids"] = batch["input_ids"] % cfg.vocab_size
        notes.append(f"token ids taken modulo vocab_size={cfg.vocab_size}")
    if "token_type_ids" in batch:
        batch["token_type_ids"] = batch["token_type_ids"] % cfg.type_vocab_size
    if cfg.head is not None and cfg.head.name == "multiple_choice":
        batch = {k: v[:, None] for k, v in batch.items()}  # [b, choices, q]: one choice
    steps = introspect.trace(model, batch, max_depth=args.depth)
    text = introspect.format_trace(steps, tokens[:length])
    if notes:
        text = "\n".join(f"note: {n}" for n in notes) + "\n" + text
    emit(
        args,
        text,
        {
            "tokens": tokens[:length],
            "input_ids": batch["input_ids"][0].tolist(),
            "notes": notes,
            "steps": [
                {"path": s.path, "type": s.type, "inputs": s.inputs, "outputs": s.outputs, "note": s.note}
                for s in steps
            ],
        },
    )
    return EXIT_OK


def _tokens(tokenizer: Any, ids: list[int]) -> list[str]:
    backend = tokenizer.backend  # the `tokenizers.Tokenizer` under bertblocks' BertTokenizer
    return [backend.id_to_token(i) or f"<{i}>" for i in ids]


def _configure_diagram(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser, "CONFIG|PRESET")
    parser.add_argument("--head", metavar="NAME", help="add a task head")
    parser.add_argument("--markdown", action="store_true", help="wrap the diagram in a ```mermaid fence")


def _run_diagram(args: argparse.Namespace) -> int:
    from .. import introspect

    cfg = config_from_args(args)
    model = _build_model(cfg, args.head)  # assembled, so the diagram shows what builds, not just what parses
    text = introspect.mermaid(model.config, introspect.count_parameters(model))
    if args.markdown:
        text = f"```mermaid\n{text}\n```"
    emit(args, text, {"mermaid": text})
    return EXIT_OK


# ---------------------------------------------------------------------------------------- embed, similarity
def _configure_sentences(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        metavar="PATH_OR_ID",
        help="checkpoint directory or hub id (default: the packaged all-MiniLM-L6-v2)",
    )
    parser.add_argument("texts", nargs="+", metavar="TEXT", help="sentences")
    add_set_argument(parser)


def _encode(args: argparse.Namespace) -> Any:
    import bertblocks

    from .. import sentence

    source = args.model or str(sentence.minilm_path())
    model = bertblocks.from_pretrained(source, args.overrides)
    model.eval()
    tokenizer = _load_tokenizer(source)
    return sentence.encode(model, tokenizer, list(args.texts)), sentence


def _run_embed(args: argparse.Namespace) -> int:
    embeddings, _ = _encode(args)
    n, dim = embeddings.shape
    lines = [f"{n} embedding{'s' if n != 1 else ''} of dimension {dim} (mean-pooled, L2-normalised)"]
    for text, row in zip(args.texts, embeddings, strict=True):
        head = ", ".join(f"{v:+.4f}" for v in row[:6].tolist())
        lines.append(f"{_clip(text)}: [{head}, …]")
    emit(
        args,
        "\n".join(lines),
        {
            "shape": [n, dim],
            "embeddings": [{"text": t, "vector": r.tolist()} for t, r in zip(args.texts, embeddings, strict=True)],
        },
    )
    return EXIT_OK


def _run_similarity(args: argparse.Namespace) -> int:
    embeddings, sentence = _encode(args)
    scores = sentence.similarity(embeddings, embeddings)
    names = [f"[{i}]" for i in range(len(args.texts))]
    rows = [(name, *(f"{v:.3f}" for v in row.tolist())) for name, row in zip(names, scores, strict=True)]
    text = "\n".join(f"{name} {text}" for name, text in zip(names, args.texts, strict=True))
    text += "\n\ncosine similarity\n" + table(rows, ("", *names))
    emit(args, text, {"texts": list(args.texts), "similarity": scores.tolist()})
    return EXIT_OK


def _clip(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


# ---------------------------------------------------------------------------------------- convert, schema
def _configure_convert(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", metavar="IN", help="YAML config, HF config.json (or its directory), or preset")
    parser.add_argument("output", metavar="OUT", help="*.json writes HF config.json format, *.yaml/*.yml ours")
    parser.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    add_set_argument(parser)


def _run_convert(args: argparse.Namespace) -> int:
    import bertblocks

    out = Path(args.output)
    if out.suffix not in {".json", ".yaml", ".yml"}:
        raise CLIError(f"{out}: cannot tell the format from the extension; use .json (HF) or .yaml/.yml")
    if out.exists() and not args.force:
        raise CLIError(f"{out} exists; pass --force to overwrite it")
    cfg = load_config_source(args.input, args.overrides)
    bertblocks.save_config(cfg, out)
    fmt = "HF config.json" if out.suffix == ".json" else "YAML"
    emit(args, f"wrote {out} ({fmt})", {"input": args.input, "output": str(out), "format": fmt})
    return EXIT_OK


def _configure_schema(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", metavar="FILE", help="write the schema here instead of stdout")


def _run_schema(args: argparse.Namespace) -> int:
    from ..core.config import BertConfig

    text = json.dumps(BertConfig.model_json_schema(), indent=2)
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text)  # always JSON: a JSON Schema is already machine-readable
    return EXIT_OK


# ------------------------------------------------------------------------------------------------ parser
def build_parser() -> argparse.ArgumentParser:
    """The full parser (every registered subcommand); ``docs/reference/cli.md`` is generated from it."""
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
    for command in SUBCOMMANDS.values():
        p = sub.add_parser(
            command.name,
            help=command.help,
            description=command.description or command.help,
            parents=[common],
        )
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
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as e:  # argparse: --help/--version (0) or a usage error (2)
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
    try:
        return int(_resolve(args._run)(args))
    except Exception as e:
        code = _exit_code(e)
        message = _message(e)
        print(f"bertblocks {args.command}: error: {message}", file=sys.stderr)
        if args.debug:
            traceback.print_exc()
        elif code == EXIT_INTERNAL:
            print("(this is a bug; rerun with --debug for the traceback)", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        return 130


def _exit_code(error: Exception) -> int:
    from ..core.config import ConfigError
    from ..hf.weights import CheckpointError
    from ..registry import RegistryError

    if isinstance(error, CLIError):
        return error.code
    if isinstance(error, ConfigError | RegistryError | CheckpointError | FileNotFoundError | NotADirectoryError):
        return EXIT_INVALID
    if isinstance(error, ImportError):
        return EXIT_UNAVAILABLE
    if isinstance(error, OSError | ValueError):  # unreadable files, inputs the model rejects
        return EXIT_INVALID
    return EXIT_INTERNAL


def _message(error: Exception) -> str:
    if isinstance(error, FileNotFoundError) and error.filename:
        return f"no such file or directory: {error.filename}"
    text = str(error) or type(error).__name__
    if _exit_code(error) == EXIT_INTERNAL:
        return f"{type(error).__name__}: {text}"
    return text


# ------------------------------------------------------------------------------------------- the commands
register_subcommand(
    "build",
    "validate and assemble a model; print its module tree with parameter counts",
    _configure_build,
    _run_build,
)
register_subcommand(
    "validate", "check a config and print every error with its dotted path", _configure_validate, _run_validate
)
register_subcommand(
    "plugins", "list registered plugins with their distribution, version and hooks", _configure_plugins, _run_plugins
)
register_subcommand(
    "components",
    "list registered components (of one kind) and who provides them",
    _configure_components,
    _run_components,
)
register_subcommand("presets", "list the named architectures (the zoo)", _configure_presets, _run_presets)
register_subcommand(
    "trace",
    "run one real input through a model and print the tensor shapes at every step",
    _configure_trace,
    _run_trace,
)
register_subcommand("diagram", "print a Mermaid flowchart of the assembled model", _configure_diagram, _run_diagram)
register_subcommand("embed", "sentence embeddings (mean-pooled, L2-normalised)", _configure_sentences, _run_embed)
register_subcommand(
    "similarity", "cosine-similarity table of sentence embeddings", _configure_sentences, _run_similarity
)
register_subcommand(
    "convert", "convert a config between HF config.json and bertblocks YAML", _configure_convert, _run_convert
)
register_subcommand("schema", "print the JSON Schema of the config format", _configure_schema, _run_schema)
register_subcommand(
    "ablate",
    "run an ablation study: vary components, measure cost and quality per variant",
    "bertblocks.ablation.cli:configure_parser",
    "bertblocks.ablation.cli:run",
)
