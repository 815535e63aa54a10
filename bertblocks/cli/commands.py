"""The built-in ``bertblocks`` commands: build, validate, plugins, components, presets, trace, diagram, embed,
similarity, convert, schema, export, quantize (embed, export and quantize live in their own modules, imported when
they run).

This module is a plugin like any other: it hands its commands to the CLI through the
``bertblocks_register_commands`` hook (:func:`bertblocks_register_commands`). Heavy imports (torch, the model
classes) happen inside the commands, when they run.
"""

from __future__ import annotations

import argparse
import json
import sys
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from ..atomic import write_text
from ..core.component import Command
from . import (
    EXIT_INVALID,
    EXIT_OK,
    EXIT_USAGE,
    CLIError,
    UnavailableError,
    add_config_argument,
    add_set_argument,
    check_output_file,
    config_from_args,
    emit,
    load_config_source,
    table,
)


# ---------------------------------------------------------------------------------------------- validate
def _configure_validate(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--show", action="store_true", help="print the validated config with every value")


def _run_validate(args: argparse.Namespace) -> int:
    import bertblocks

    try:
        cfg = config_from_args(args)
    except bertblocks.config.ConfigError as e:
        issues = [{"loc": i.loc, "msg": i.msg} for i in e.issues]
        if args.json:
            emit(args, "", {"valid": False, "source": e.source or args.config, "errors": issues})
            return EXIT_INVALID
        raise
    summary = _summary(cfg)
    text = f"ok: {args.config} is a valid config ({summary})"
    if args.show:
        text += "\n" + bertblocks.config_files.dump_yaml(cfg).rstrip()
    emit(args, text, {"valid": True, "source": args.config, "summary": summary, "config": cfg.model_dump(mode="json")})
    return EXIT_OK


def _summary(cfg: Any) -> str:
    enc = cfg.encoder
    defaults = type(enc)()  # a component is named where it is not the schema's default (BERT's)
    attention = "" if enc.attention.name == defaults.attention.name else f" {enc.attention.name}"
    feedforward = "" if enc.feedforward.name == defaults.feedforward.name else f" {enc.feedforward.name}"
    parts = [
        f"{enc.num_layers} layers",
        f"hidden {cfg.hidden_size}",
        f"{enc.attention.num_heads} heads{attention}",
        f"feed-forward{feedforward} {enc.feedforward.intermediate_size} {enc.feedforward.activation}",
        f"position {cfg.position.name}",
        f"backend {enc.attention.backend.name}",
    ]
    if enc.layer.name != defaults.layer.name or enc.norm.name != defaults.norm.name:
        parts.append(f"layer {enc.layer.name} {enc.norm.name}")
    if enc.num_layer_groups is not None:
        parts.append(f"{enc.num_layer_groups} shared layer group{'s' if enc.num_layer_groups > 1 else ''}")
    parts.append(f"vocab {cfg.vocab_size}")
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


def _create_model(cfg: Any, head: str | None, device: str = "meta") -> Any:
    """Assemble ``cfg`` (with ``head``) without weights; on the meta device only shapes are made (no memory).

    A head (``--head`` or the config's ``head``) gives a task model (``BertForMaskedLM``, …), else a backbone.
    """
    import torch

    from ..zoo import create_model

    with torch.device(device):
        return create_model(cfg, head=head)


def _run_build(args: argparse.Namespace) -> int:
    from .. import introspect

    cfg = config_from_args(args)
    model = _create_model(cfg, args.head)
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

    registry = bertblocks.registry.get_registry()
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
    conflicts = getattr(registry, "conflicts", [])
    for conflict in conflicts:  # usable, except the clashing name itself
        text += f"\nCONFLICT  {conflict} (using this name is an error; the others work)"
    emit(
        args,
        text,
        {
            "plugins": [
                {"name": p.name, "distribution": p.distribution, "version": p.version, "hooks": list(p.hooks)}
                for p in plugins
            ],
            "errors": [{"plugin": e.plugin, "distribution": e.distribution, "detail": e.detail} for e in errors],
            "conflicts": list(conflicts),
        },
    )
    return EXIT_INVALID if errors else EXIT_OK


def _configure_components(parser: argparse.ArgumentParser) -> None:
    from ..core.component import KINDS

    parser.add_argument(
        "kind",
        nargs="?",
        metavar="KIND",
        help=f"list only this kind: {', '.join(KINDS)}, or a kind a plugin declares",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="also list each component's options")


def _options_of(component: Any) -> list[dict[str, Any]]:
    from .field_types import render_type  # `int ≥ 1 | null`, not `Optional[...]`

    out = []
    for name, info in component.options.model_fields.items():
        default = None if info.is_required() else info.get_default(call_default_factory=True)
        out.append(
            {
                "name": name,
                "type": render_type(info.annotation, list(info.metadata)),
                "default": default,
                "required": info.is_required(),
                "description": info.description or "",
            }
        )
    return out


def _run_components(args: argparse.Namespace) -> int:
    import bertblocks

    registry = bertblocks.registry.get_registry()
    if args.kind is not None and args.kind not in registry.kinds():  # plugins may declare kinds: checked here
        raise CLIError(
            f"argument KIND: invalid choice: {args.kind!r} (choose from {', '.join(registry.kinds())})", EXIT_USAGE
        )
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
                if opt["description"]:
                    text += f": {opt['description']}"
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

    registry = bertblocks.registry.get_registry()
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
        model = _create_model(cfg, args.head, device="cpu")
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
    if "token_type_ids" in batch and cfg.type_vocab_size > 0:  # 0: no table, the ids are ignored (DeBERTa-v3)
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
    model = _create_model(cfg, args.head)  # assembled, so the diagram shows what builds, not just what parses
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
    check_output_file(out, "OUT")
    cfg = load_config_source(args.input, args.overrides)
    bertblocks.save_config(cfg, out)
    fmt = "HF config.json" if out.suffix == ".json" else "YAML"
    emit(args, f"wrote {out} ({fmt})", {"input": args.input, "output": str(out), "format": fmt})
    return EXIT_OK


def _configure_schema(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", metavar="FILE", help="write the schema here instead of stdout")


def _run_schema(args: argparse.Namespace) -> int:
    from ..config import BertConfig

    if args.output:
        check_output_file(args.output, "--output")
    text = json.dumps(BertConfig.model_json_schema(), indent=2)
    if args.output:
        write_text(args.output, text + "\n")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text)  # always JSON: a JSON Schema is already machine-readable
    return EXIT_OK


def bertblocks_register_commands() -> list[Command]:
    """The built-in commands, in the order ``bertblocks --help`` lists them."""
    return [
        Command(
            "build",
            "validate and assemble a model; print its module tree with parameter counts",
            _configure_build,
            _run_build,
        ),
        Command(
            "validate", "check a config and print every error with its dotted path", _configure_validate, _run_validate
        ),
        Command(
            "plugins",
            "list registered plugins with their distribution, version and hooks",
            _configure_plugins,
            _run_plugins,
        ),
        Command(
            "components",
            "list registered components (of one kind) and who provides them",
            _configure_components,
            _run_components,
        ),
        Command("presets", "list the named architectures (the zoo)", _configure_presets, _run_presets),
        Command(
            "trace",
            "run one real input through a model and print the tensor shapes at every step",
            _configure_trace,
            _run_trace,
        ),
        Command("diagram", "print a Mermaid flowchart of the assembled model", _configure_diagram, _run_diagram),
        Command(
            "embed",
            "sentence embeddings (mean-pooled, L2-normalised) of texts, a file or stdin; to .npy or .jsonl",
            "bertblocks.cli.embed:configure",
            "bertblocks.cli.embed:run",
        ),
        Command("similarity", "cosine-similarity table of sentence embeddings", _configure_sentences, _run_similarity),
        Command(
            "convert", "convert a config between HF config.json and bertblocks YAML", _configure_convert, _run_convert
        ),
        Command("schema", "print the JSON Schema of the config format", _configure_schema, _run_schema),
        Command(
            "export",
            "export a checkpoint to ONNX or torch.export (dynamic batch and sequence, attention mask kept)",
            "bertblocks.cli.export:configure",
            "bertblocks.cli.export:run",
        ),
        Command(
            "quantize",
            "quantize a checkpoint to int8 with the kernel this CPU runs (prints it) and save the int8 model",
            "bertblocks.cli.quantize:configure",
            "bertblocks.cli.quantize:run",
        ),
    ]
