"""``bertblocks quantize``: a checkpoint to an int8 model folder, with the kernel this CPU runs.

Example::

    bertblocks quantize path/to/checkpoint bert-int8/                  # prints the kernel chosen for this CPU
    bertblocks quantize path/to/checkpoint bert-int8/ --skip 'cls.*'   # keep the masked-LM head in fp32

The folder is what :func:`bertblocks.models.quantize.save_quantized` writes (``load_quantized`` reads it).
Where no int8 kernel beats fp32 on this CPU, nothing is written and the exit code is 3 (a feature this
machine lacks), unless ``--force``.
"""

from __future__ import annotations

import argparse
import warnings

from ..models.quantize import KERNELS
from . import EXIT_OK, EXIT_UNAVAILABLE, CLIError, add_checkpoint_head_argument, add_set_argument, emit


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", metavar="PATH_OR_ID", help="checkpoint directory or hub id (fp32 weights)")
    parser.add_argument("output", metavar="DIR", help="folder to write the int8 model to")
    add_checkpoint_head_argument(parser)
    parser.add_argument(
        "--skip", action="append", default=[], metavar="PATTERN", help="module names to keep in fp32 (fnmatch)"
    )
    parser.add_argument("--kernel", default="auto", choices=("auto", *KERNELS), help="int8 kernel (default: by CPU)")
    parser.add_argument("--force", action="store_true", help="quantize even where no int8 kernel beats fp32")
    add_set_argument(parser)


def run(args: argparse.Namespace) -> int:
    import bertblocks

    from ..models.quantize import QuantizationWarning, cpu_features, quantization_kernel, quantize, save_quantized

    head = None if args.head == "none" else args.head
    model = bertblocks.from_pretrained(args.checkpoint, args.overrides, head=head).eval()
    cpu = cpu_features().describe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", QuantizationWarning)  # said below, as the command's own error
        quantize(model, skip=args.skip, kernel=args.kernel, force=args.force)
    kernel = quantization_kernel(model)
    if kernel is None:
        raise CLIError(
            f"no int8 kernel is known to beat fp32 on this CPU ({cpu}); nothing written (--force quantizes anyway)",
            EXIT_UNAVAILABLE,
        )
    directory = save_quantized(model, args.output)
    kind = type(model).__name__
    emit(
        args,
        f"quantized {kind} with the {kernel} kernel (CPU: {cpu}) → {directory}",
        {"model": kind, "kernel": kernel, "cpu": cpu, "output": str(directory)},
    )
    return EXIT_OK


__all__ = ["configure", "run"]
