"""``bertblocks embed``: sentence embeddings for a corpus (arguments, a file or stdin) into ``.npy`` or ``.jsonl``.

Texts are batched by length (longest first, so a batch pads little and the slowest batches come first), and
the embeddings are written in input order. A progress bar (tqdm) shows on a terminal and stays quiet
otherwise (pipes, CI, files).

Example::

    bertblocks embed --input corpus.txt --output corpus.npy --batch-size 64
    cat corpus.jsonl | bertblocks embed --input - --input-format jsonl --output corpus.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import torch
import torch.nn.functional as F

from ..atomic import write_file
from ..errors import InputError
from ..hf.tokenizer import BertTokenizer
from ..plugins.poolers import masked_mean
from ..readers import parse_json, read_lines
from . import EXIT_OK, CLIError, add_set_argument, check_output_file, emit
from .commands import _clip, _load_tokenizer

#: output file suffixes ``--output`` writes
OUTPUT_FORMATS = (".npy", ".jsonl")


# ------------------------------------------------------------------------------------------------- reading
def read_texts(stream: Iterable[str], fmt: str, field: str, where: str) -> list[str]:
    """One text per line (``lines``; empty lines skipped) or one JSON object per line (``jsonl``, text in ``field``).

    Raises:
        CLIError: a JSONL line that is not an object with a string ``field`` (with the line number).
        ReadError: a JSONL line that is not JSON (with the line number).
    """
    texts = []
    for number, line in enumerate(stream, start=1):
        line = line.rstrip("\n").rstrip("\r")
        if not line.strip():
            continue
        if fmt == "lines":
            texts.append(line)
            continue
        record = parse_json(line, where, line=number)  # a ReadError naming the line
        if not isinstance(record, dict) or not isinstance(record.get(field), str):
            raise CLIError(f"{where}, line {number}: expected an object with a string {field!r} field")
        texts.append(record[field])
    return texts


def decoded_lines(raw: IO[bytes], where: str) -> Iterator[str]:
    """The lines of a byte stream as UTF-8 text.

    Raises:
        CLIError: a line that is not UTF-8, with the file, the line number and the byte.
    """
    for number, line in enumerate(raw, start=1):
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CLIError(
                f"{where}, line {number}: not UTF-8 text (byte 0x{line[e.start]:02x} at column {e.start + 1}); "
                "convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
            ) from None


def _input_format(path: str, given: str | None) -> str:
    if given:
        return given
    return "jsonl" if Path(path).suffix in (".jsonl", ".ndjson") else "lines"


# ----------------------------------------------------------------------------------------------- embedding
@torch.no_grad()
def embed_corpus(
    model: torch.nn.Module,
    tokenizer: BertTokenizer,
    texts: Sequence[str],
    batch_size: int = 32,
    max_length: int | None = None,
    progress: bool = False,
) -> torch.Tensor:
    """Mean-pooled, L2-normalised embeddings ``[len(texts), hidden]`` in input order, computed in batches of
    similar length (what :func:`bertblocks.sentence.encode` computes, with less padding).

    Raises:
        ValueError: ``batch_size`` below 1.
    """
    if batch_size < 1:
        raise InputError(f"batch_size must be at least 1, got {batch_size}")
    if not texts:
        return torch.empty(0, int(model.config.hidden_size))
    lengths = [len(encoding.ids) for encoding in tokenizer.backend.encode_batch(list(texts))]
    order = sorted(range(len(texts)), key=lambda i: -lengths[i])  # stable: equal lengths keep input order
    device = next(model.parameters()).device
    out = torch.empty(len(texts), int(model.config.hidden_size))
    bar = _progress(len(texts), progress)
    for start in range(0, len(order), batch_size):
        index = order[start : start + batch_size]
        batch = tokenizer([texts[i] for i in index], padding=True, truncation=True, max_length=max_length)
        batch = {k: v.to(device) for k, v in batch.items()}
        hidden = model(**batch).last_hidden_state
        out[torch.tensor(index)] = F.normalize(masked_mean(hidden, batch["attention_mask"]), p=2, dim=-1).float().cpu()
        bar.update(len(index))
    bar.close()
    return out


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, show: bool) -> Any:
    """A tqdm bar on stderr when ``show`` (a terminal) and tqdm is installed; else nothing."""
    if not show:
        return _NoProgress()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoProgress()
    return tqdm(total=total, unit="text", desc="embedding", file=sys.stderr, dynamic_ncols=True)


# ------------------------------------------------------------------------------------------------- writing
def write_embeddings(path: Path, texts: Sequence[str], embeddings: torch.Tensor) -> None:
    """``.npy``: one float32 array ``[n, hidden]``; ``.jsonl``: ``{"text": …, "embedding": […]}`` per line.

    The file is replaced atomically (:func:`bertblocks.atomic.write_file`): an earlier file is never truncated.
    """
    if path.suffix == ".npy":
        import numpy as np

        array = embeddings.numpy().astype("float32")
        write_file(path, lambda f: np.save(f, array))
        return

    def lines(f: IO[bytes]) -> None:
        for text, row in zip(texts, embeddings.tolist(), strict=True):
            f.write((json.dumps({"text": text, "embedding": row}, ensure_ascii=False) + "\n").encode("utf-8"))

    write_file(path, lines)


def check_output(output: Path, input_path: str | None) -> None:
    """Refuse, before anything is read, an ``--output`` that would overwrite the ``--input`` (the same path,
    or another name of the same file: a symbolic or hard link) or that is a directory.

    Raises:
        CLIError: naming both paths.
    """
    check_output_file(output, "--output")
    if not input_path or input_path == "-":
        return
    source = Path(input_path)
    same = output.resolve() == source.resolve()
    if not same and output.exists() and source.exists():
        try:
            same = os.path.samefile(output, source)
        except OSError:
            same = False
    if same:
        raise CLIError(f"--output {output} is the --input file {source}; refusing to overwrite the input")


# ----------------------------------------------------------------------------------------------------- CLI
def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", metavar="PATH_OR_ID", help="checkpoint directory or hub id (default: the packaged all-MiniLM-L6-v2)"
    )
    parser.add_argument("texts", nargs="*", metavar="TEXT", help="sentences (or use --input)")
    parser.add_argument(
        "-i", "--input", metavar="FILE", help="read texts from FILE ('-' for stdin): one per line, or JSONL"
    )
    parser.add_argument(
        "--input-format",
        choices=("lines", "jsonl"),
        help="how to read --input (default: jsonl for .jsonl/.ndjson files, else one text per line)",
    )
    parser.add_argument("--text-field", default="text", metavar="KEY", help="the JSONL field holding the text")
    parser.add_argument("-o", "--output", metavar="FILE", help="write the embeddings to FILE (.npy or .jsonl)")
    parser.add_argument("--batch-size", type=int, default=32, metavar="N", help="texts per forward pass (32)")
    parser.add_argument("--max-length", type=int, metavar="N", help="truncate texts to N tokens")
    add_set_argument(parser)


def _texts(args: argparse.Namespace) -> list[str]:
    if args.input and args.texts:
        raise CLIError("give texts as arguments or --input, not both")
    if args.input == "-" or (not args.input and not args.texts and not sys.stdin.isatty()):
        raw = getattr(sys.stdin, "buffer", None)  # bytes, so a bad line is reported with its number
        lines = sys.stdin if raw is None else decoded_lines(raw, "stdin")
        return read_texts(lines, args.input_format or "lines", args.text_field, "stdin")
    if args.input:
        path = Path(args.input)
        if not path.is_file():
            raise CLIError(f"input file not found: {path}")
        fmt = _input_format(args.input, args.input_format)
        lines = (line for _, line in read_lines(path))  # bounded, UTF-8 and NUL checked, naming the line
        return read_texts(lines, fmt, args.text_field, str(path))
    if not args.texts:
        raise CLIError("no texts: give them as arguments, with --input FILE, or on stdin")
    return list(args.texts)


def run(args: argparse.Namespace) -> int:
    import bertblocks

    from ..sentence import minilm_path

    if args.batch_size < 1:
        raise CLIError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.max_length is not None and args.max_length < 1:
        raise CLIError(f"--max-length must be at least 1 token, got {args.max_length} (leave it out for the model's)")
    output = Path(args.output) if args.output else None
    if output is not None and output.suffix not in OUTPUT_FORMATS:
        raise CLIError(f"--output {output}: the suffix must be one of {', '.join(OUTPUT_FORMATS)}")
    if output is not None:
        check_output(output, args.input)
    texts = _texts(args)
    source = args.model or str(minilm_path())
    model = bertblocks.from_pretrained(source, args.overrides).eval()
    tokenizer = _load_tokenizer(source)
    embeddings = embed_corpus(
        model, tokenizer, texts, args.batch_size, args.max_length, progress=sys.stderr.isatty() and len(texts) > 1
    )
    _check_finite(texts, embeddings)
    n, dim = embeddings.shape
    summary = f"{n} embedding{'s' if n != 1 else ''} of dimension {dim} (mean-pooled, L2-normalised)"
    if output is not None:
        write_embeddings(output, texts, embeddings)
        emit(args, f"{summary} → {output}", {"shape": [n, dim], "output": str(output)})
        return EXIT_OK
    lines = [summary, *(_line(text, row) for text, row in zip(texts, embeddings, strict=True))]
    emit(args, "\n".join(lines), {"shape": [n, dim], "embeddings": list(_records(texts, embeddings))})
    return EXIT_OK


def _check_finite(texts: Sequence[str], embeddings: torch.Tensor) -> None:
    """Refuse to write NaN or infinite vectors (a damaged checkpoint, float16 overflow): they would poison
    every search or clustering run over them."""
    bad = (~torch.isfinite(embeddings).all(dim=-1)).nonzero().flatten().tolist()
    if bad:
        first = bad[0]
        raise CLIError(
            f"the model gave non-finite embeddings (NaN or inf) for {len(bad)} of {len(texts)} texts (first: text "
            f"{first + 1}, {_clip(texts[first])!r}); nothing was written. Check the checkpoint's weights (loading "
            "warns about non-finite tensors) and the dtype (float16 overflows)"
        )


def _line(text: str, row: torch.Tensor) -> str:
    head = ", ".join(f"{v:+.4f}" for v in row[:6].tolist())
    return f"{_clip(text)}: [{head}, …]"


def _records(texts: Sequence[str], embeddings: torch.Tensor) -> Iterable[dict[str, Any]]:
    for text, row in zip(texts, embeddings, strict=True):
        yield {"text": text, "vector": row.tolist()}


__all__ = ["check_output", "configure", "embed_corpus", "read_texts", "run", "write_embeddings"]
