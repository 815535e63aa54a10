"""``bertblocks embed``: sentence embeddings for a corpus (arguments, a file or stdin) into ``.npy`` or ``.jsonl``;
with ``--head splade|colbert|bge_m3``, sparse and multi-vector embeddings into ``.jsonl`` or ``.safetensors``.

Texts are batched by length (longest first, so a batch pads little and the slowest batches come first), and
the embeddings are written in input order. A progress bar (tqdm) shows on a terminal and stays quiet
otherwise (pipes, CI, files).

Example::

    bertblocks embed --input corpus.txt --output corpus.npy --batch-size 64
    cat corpus.jsonl | bertblocks embed --input - --input-format jsonl --output corpus.jsonl
    bertblocks embed --model naver/splade-v3 --head splade --input corpus.txt --output corpus.safetensors
    bertblocks embed --model my-colbert/ --head colbert --colbert document -i docs.txt -o docs.safetensors

The retrieval formats (``docs/how-to/task-heads.md``, "Retrieval heads", shows how to read them back):

* ``.jsonl``, one object per text: ``text``; dense ``embedding`` ``[H]``; sparse ``indices`` (token ids,
  ascending) and ``values`` (their weights, the non-zero ones only); multi-vector ``vectors`` (one ``[d]`` list per
  real token). ``bge_m3`` writes all three.
* ``.safetensors``: dense ``dense`` ``[n, H]``; sparse in SciPy's CSR layout, ``sparse_indptr [n + 1]``,
  ``sparse_indices [nnz]``, ``sparse_values [nnz]`` (text ``i``'s entries are ``indptr[i]:indptr[i + 1]``; the
  vocabulary size is the metadata ``sparse_width``); multi-vector ``multivector [n, L, d]`` (zeros past each
  text's tokens) and ``multivector_mask [n, L]`` (1 = a real token's vector). Float tensors are float32.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
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
OUTPUT_FORMATS = (".npy", ".jsonl", ".safetensors")
#: ``--head``: ``mean`` (the backbone's masked mean, L2-normalised) or a retrieval head
HEADS = ("mean", "splade", "colbert", "bge_m3")
#: which suffixes each kind of output takes
HEAD_FORMATS = {"mean": (".npy", ".jsonl"), "splade": (".jsonl", ".safetensors")}
HEAD_FORMATS["colbert"] = HEAD_FORMATS["bge_m3"] = HEAD_FORMATS["splade"]


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


@dataclass
class RetrievalEmbeddings:
    """What a retrieval head gives for a corpus, in input order; a kind the head does not produce is ``None``.

    Attributes:
        dense: ``[n, H]`` float32.
        sparse: per text, ``(indices, values)``: the non-zero vocabulary entries, ascending ids.
        sparse_width: the vocabulary size (the sparse vectors' length).
        multivector: per text, ``[tokens, d]`` float32, its real tokens only.
    """

    dense: torch.Tensor | None = None
    sparse: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    sparse_width: int = 0
    multivector: list[torch.Tensor] | None = None


#: the output fields each retrieval head fills: (dense, sparse, multi-vector, multi-vector mask)
RETRIEVAL_FIELDS = {
    "splade": (None, "sparse_embedding", None, None),
    "colbert": (None, None, "token_embeddings", "token_mask"),
    "bge_m3": ("dense_embedding", "sparse_embedding", "colbert_embedding", "colbert_mask"),
}


@torch.no_grad()
def embed_retrieval(
    model: torch.nn.Module,
    tokenizer: BertTokenizer,
    texts: Sequence[str],
    head: str,
    batch_size: int = 32,
    max_length: int | None = None,
    progress: bool = False,
    colbert: str | None = None,
) -> RetrievalEmbeddings:
    """A retrieval head's outputs (:data:`RETRIEVAL_FIELDS`) for ``texts``, batched longest first, in input order.

    ``colbert`` (``"query"`` or ``"document"``, head ``colbert`` only): embed the texts with ColBERT's input
    convention (:func:`bertblocks.sentence.encode_colbert`: markers, the head's lengths, query augmentation,
    punctuation); ``None``: each text's tokens as the tokenizer gives them.

    Raises:
        ValueError: ``batch_size`` below 1.
    """
    if batch_size < 1:
        raise InputError(f"batch_size must be at least 1, got {batch_size}")
    dense_field, sparse_field, multi_field, mask_field = RETRIEVAL_FIELDS[head]
    lengths = [len(encoding.ids) for encoding in tokenizer.backend.encode_batch(list(texts))]
    order = sorted(range(len(texts)), key=lambda i: -lengths[i])
    device = next(model.parameters()).device
    dense: list[torch.Tensor | None] = [None] * len(texts)
    sparse: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(texts)
    multi: list[torch.Tensor | None] = [None] * len(texts)
    width = 0
    bar = _progress(len(texts), progress)
    for start in range(0, len(order), batch_size):
        index = order[start : start + batch_size]
        chunk = [texts[i] for i in index]
        if colbert is not None:
            from ..sentence import encode_colbert

            vectors, keep = encode_colbert(model, tokenizer, chunk, is_query=colbert == "query", batch_size=len(chunk))
            out = {"token_embeddings": vectors, "token_mask": keep}
        else:
            batch = tokenizer(chunk, padding=True, truncation=True, max_length=max_length)
            out = model(**{k: v.to(device) for k, v in batch.items()})
        for row, i in enumerate(index):
            if dense_field:
                dense[i] = out[dense_field][row].float().cpu()
            if sparse_field:
                vector = out[sparse_field][row].float().cpu()
                width = vector.shape[0]
                ids = vector.nonzero().flatten()
                sparse[i] = (ids, vector[ids])
            if multi_field:
                keep = out[mask_field][row].bool().cpu()
                multi[i] = out[multi_field][row].float().cpu()[keep]
        bar.update(len(index))
    bar.close()
    return RetrievalEmbeddings(
        dense=torch.stack(dense) if dense_field and texts else None,  # type: ignore[arg-type]
        sparse=sparse if sparse_field else None,  # type: ignore[arg-type]
        sparse_width=width,
        multivector=multi if multi_field else None,  # type: ignore[arg-type]
    )


def write_retrieval(path: Path, texts: Sequence[str], embeddings: RetrievalEmbeddings) -> None:
    """Write ``embeddings`` in the format of ``path``'s suffix (``.jsonl`` or ``.safetensors``; see the module
    docstring), replacing the file atomically (:func:`bertblocks.atomic.write_file`)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import save

        tensors: dict[str, torch.Tensor] = {}
        metadata = {"format": "bertblocks-embed"}
        if embeddings.dense is not None:
            tensors["dense"] = embeddings.dense.contiguous()
        if embeddings.sparse is not None:
            counts = torch.tensor([0, *(len(ids) for ids, _ in embeddings.sparse)], dtype=torch.long)
            tensors["sparse_indptr"] = counts.cumsum(0)
            tensors["sparse_indices"] = torch.cat([ids for ids, _ in embeddings.sparse] or [torch.zeros(0)]).long()
            tensors["sparse_values"] = torch.cat([v for _, v in embeddings.sparse] or [torch.zeros(0)]).float()
            metadata["sparse_width"] = str(embeddings.sparse_width)
        if embeddings.multivector is not None:
            vectors = embeddings.multivector
            longest = max((len(v) for v in vectors), default=0)
            dim = vectors[0].shape[-1] if vectors else 0
            padded = torch.zeros(len(vectors), longest, dim)
            mask = torch.zeros(len(vectors), longest, dtype=torch.long)
            for i, v in enumerate(vectors):
                padded[i, : len(v)] = v
                mask[i, : len(v)] = 1
            tensors["multivector"], tensors["multivector_mask"] = padded, mask
        data = save(tensors, metadata=metadata)
        write_file(path, lambda f: f.write(data))
        return

    def lines(f: IO[bytes]) -> None:
        for i, text in enumerate(texts):
            record: dict[str, Any] = {"text": text}
            if embeddings.dense is not None:
                record["embedding"] = embeddings.dense[i].tolist()
            if embeddings.sparse is not None:
                ids, values = embeddings.sparse[i]
                record["indices"], record["values"] = ids.tolist(), values.tolist()
            if embeddings.multivector is not None:
                record["vectors"] = embeddings.multivector[i].tolist()
            f.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))

    write_file(path, lines)


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
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write the embeddings to FILE (.npy or .jsonl; a retrieval head: .jsonl or .safetensors)",
    )
    parser.add_argument(
        "--head",
        choices=HEADS,
        default="mean",
        help="mean: the masked mean, L2-normalised (default); splade: sparse vocabulary weights; colbert: one "
        "vector per token; bge_m3: dense, sparse and per-token (its colbert_linear/sparse_linear files are loaded "
        "from the checkpoint folder)",
    )
    parser.add_argument(
        "--colbert",
        choices=("query", "document"),
        help="with --head colbert: embed the texts as ColBERT queries or documents (the [Q]/[D] marker, the head's "
        "query_length/document_length, queries padded with [MASK], no vectors for a document's punctuation; set "
        "them with --set head.OPTION=VALUE); default: each text's tokens as the tokenizer gives them",
    )
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
    if output is not None and output.suffix not in HEAD_FORMATS[args.head]:
        raise CLIError(f"--output {output}: --head {args.head} writes {' or '.join(HEAD_FORMATS[args.head])}")
    if output is not None:
        check_output(output, args.input)
    if args.colbert is not None and args.head != "colbert":
        raise CLIError(f"--colbert {args.colbert} needs --head colbert (got --head {args.head})")
    if args.colbert is not None and args.max_length is not None:
        raise CLIError(
            "--colbert takes its lengths from the head's options: use --set head.query_length=N or "
            "head.document_length=N, not --max-length"
        )
    texts = _texts(args)
    source = args.model or str(minilm_path())
    if args.head != "mean":
        return _run_retrieval(args, source, texts, output)
    # the weights first, then the tokenizer: a damaged weight file is named before a missing tokenizer
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


def _run_retrieval(args: argparse.Namespace, source: str, texts: list[str], output: Path | None) -> int:
    import bertblocks

    # a head's files of its own (BGE-M3's colbert_linear / sparse_linear) are read by from_pretrained
    model, info = bertblocks.from_pretrained(source, args.overrides, head=args.head, output_loading_info=True)
    missing = [key for key in info.missing_keys if not key.startswith(f"{model.base_model_prefix}.")]
    if missing:
        raise CLIError(
            f"{source} holds no weights for the {args.head} head ({', '.join(missing)}): embeddings from a "
            "randomly initialised head mean nothing. Use a checkpoint trained with it"
        )
    tokenizer = _load_tokenizer(source)
    result = embed_retrieval(
        model.eval(),
        tokenizer,
        texts,
        args.head,
        args.batch_size,
        args.max_length,
        progress=sys.stderr.isatty() and len(texts) > 1,
        colbert=args.colbert,
    )
    parts = [t for t in (result.dense, *(result.multivector or [])) if t is not None]
    parts += [values for _, values in result.sparse or []]
    if parts and not all(bool(torch.isfinite(t).all()) for t in parts):
        raise CLIError(
            "the model gave non-finite embeddings (NaN or inf); nothing was written. Check the checkpoint's "
            "weights and the dtype (float16 overflows)"
        )
    kinds = [
        k
        for k, v in (("dense", result.dense), ("sparse", result.sparse), ("multi-vector", result.multivector))
        if v is not None
    ]
    summary = f"{len(texts)} text{'s' if len(texts) != 1 else ''} embedded by the {args.head} head ({', '.join(kinds)})"
    if output is None:
        output_text = summary + "; give --output FILE (.jsonl or .safetensors) to write them"
        emit(args, output_text, {"texts": len(texts), "head": args.head, "kinds": kinds})
        return EXIT_OK
    write_retrieval(output, texts, result)
    emit(args, f"{summary} → {output}", {"texts": len(texts), "head": args.head, "kinds": kinds, "output": str(output)})
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


__all__ = [
    "RetrievalEmbeddings",
    "check_output",
    "configure",
    "embed_corpus",
    "embed_retrieval",
    "read_texts",
    "run",
    "write_embeddings",
    "write_retrieval",
]
