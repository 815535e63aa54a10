"""``bertblocks export``: a checkpoint (backbone or task model) to ONNX or a ``torch.export`` program.

Example::

    bertblocks export path/to/checkpoint model.onnx                 # ONNX, dynamic batch and sequence
    bertblocks export path/to/checkpoint model.pt2 --head none      # torch.export program of the backbone

The file is replaced atomically: a kill or a full disk never truncates an earlier export. A full disk, a
read-only folder or a directory as the target is one line on stderr and exit 1.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import EXIT_OK, CLIError, add_checkpoint_head_argument, add_set_argument, check_output_file, emit, progress

#: output suffix → format
FORMATS = {".onnx": "onnx", ".pt2": "torch.export"}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", metavar="PATH_OR_ID", help="checkpoint directory or hub id")
    parser.add_argument("output", metavar="FILE", help="model.onnx (ONNX, dynamo exporter) or model.pt2 (torch.export)")
    add_checkpoint_head_argument(parser)
    parser.add_argument(
        "--inputs",
        default=None,
        metavar="NAMES",
        help="comma-separated graph inputs (default: the model's: input_ids,attention_mask and, where the model "
        "has token types, token_type_ids, then its family's own, such as LayoutLM's bbox or X-MOD's lang_ids)",
    )
    parser.add_argument("--opset", type=int, metavar="N", help="ONNX opset version (default: the exporter's)")
    add_set_argument(parser)


def run(args: argparse.Namespace) -> int:
    import bertblocks

    from ..models.export import export_onnx, export_program, save_program

    output = Path(args.output)
    fmt = FORMATS.get(output.suffix)
    if fmt is None:
        raise CLIError(f"{output}: the suffix must be one of {', '.join(FORMATS)} (the format follows from it)")
    check_output_file(output, "FILE")  # before the (slow) export
    head = None if args.head == "none" else args.head
    progress(args, f"loading {args.checkpoint}")
    model = bertblocks.from_pretrained(args.checkpoint, args.overrides, head=head).eval()
    from ..models.export import model_inputs  # the model's own inputs when --inputs is not given

    names = [name.strip() for name in (args.inputs or "").split(",") if name.strip()] or list(model_inputs(model))
    progress(args, f"exporting {type(model).__name__} as {fmt} (tracing the model: seconds to a minute)")
    try:
        if fmt == "onnx":
            export_onnx(model, output, input_names=names, opset_version=args.opset)
        else:
            save_program(export_program(model, input_names=names), output)
    except ValueError as e:
        raise CLIError(f"cannot export {args.checkpoint}: {e}") from None
    kind = type(model).__name__
    emit(
        args,
        f"exported {kind} ({fmt}; inputs {', '.join(names)}; dynamic batch and sequence) → {output}",
        {"model": kind, "format": fmt, "inputs": names, "output": str(output)},
    )
    return EXIT_OK


__all__ = ["FORMATS", "configure", "run"]
