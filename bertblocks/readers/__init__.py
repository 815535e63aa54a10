"""One bounded reader per file format: every file bertblocks reads goes through this module.

A file someone sends you (a config, a task file, a corpus, a shard index, a quantization manifest) is read by
the one function for its format, which holds every check that format needs, so a new module that reads a file
gets them by calling it, and a test (``tests/test_readers.py``) fails if any module parses a format itself.

What every reader guarantees (each error a :class:`ReadError` naming the file and, where there is one, the
line):

* **size**: the file is not read past its limit (``limit`` bytes, per format below); a folder, a device or a
  missing file is refused before anything is read;
* **text**: UTF-8, a leading byte order mark (what Excel and Notepad write) accepted and dropped; a byte that
  is not UTF-8 is named with its line and column; a NUL byte is refused (no text format holds one, and a
  binary file given by mistake is named instead of parsed);
* **JSON** (:func:`read_json`, :func:`read_jsonl`, :func:`parse_json`): nesting at most :data:`MAX_DEPTH`
  deep (a file nested past the interpreter's recursion limit is the same error, not a ``RecursionError``),
  a key given twice in one object refused (JSON leaves it undefined; Python would keep the last silently);
* **YAML** (:func:`read_yaml`, :func:`parse_yaml`): ``safe_load`` with the alias bound of
  :mod:`bertblocks.readers.bounded_yaml` and the same depth bound;
* **CSV/TSV** (:func:`read_csv`): a header row, strict quoting, a field at most :data:`MAX_CSV_FIELD` bytes
  (the ``csv`` module's own limit, given as an error naming the line), a field holding a line break refused
  (an unclosed quote otherwise swallows the rest of the file into one field);
* **text corpora** (:func:`read_lines`): numbered lines, as above;
* **safetensors headers**: :func:`bertblocks.hf.weight_files.read_safetensors_header`, the one parser of
  that format, whose JSON is read by :func:`parse_json`.

Example:
    >>> data = read_json(Path("config.json"))          # Any; ReadError naming the file and line
    >>> header, rows = read_csv(Path("task.csv"))      # rows: [(line, {column: value}), ...]
"""

from __future__ import annotations

import csv
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from ..errors import BertBlocksError
from .bounded_yaml import YAMLLimitError, load_yaml

#: deepest nesting of a JSON or YAML document (serde_json's recursion limit, which the safetensors library uses)
MAX_DEPTH = 128
#: largest JSON or YAML file read (a tokenizer.json of a large multilingual vocabulary is ~20 MB)
MAX_DOCUMENT_BYTES = 256 * 2**20
#: largest CSV/TSV/JSONL task file or text corpus read whole into memory
MAX_TABLE_BYTES = 1024 * 2**20
#: largest CSV/TSV field (the ``csv`` module's default ``field_size_limit``, which is process-wide: never raised)
MAX_CSV_FIELD = 128 * 2**10

_BOM = b"\xef\xbb\xbf"


class ReadError(BertBlocksError, ValueError):
    """A file that cannot be read as its format: ``path``, ``line`` (or ``None``) and ``problem`` say what.

    Attributes:
        path: the file (or a description of where the text came from).
        line: the 1-based line of the problem, or ``None`` for the file as a whole.
        column: the 1-based column, where known.
        problem: what is wrong, without the location.
    """

    def __init__(self, path: Path | str, problem: str, line: int | None = None, column: int | None = None) -> None:
        self.path, self.problem, self.line, self.column = path, problem, line, column
        super().__init__(f"{path}{', ' + self.location if line is not None else ''}: {problem}")

    @property
    def location(self) -> str:
        """``line L`` or ``line L, column C``; empty for the file as a whole."""
        if self.line is None:
            return ""
        return f"line {self.line}" + (f", column {self.column}" if self.column is not None else "")


class ReadFileNotFoundError(BertBlocksError, FileNotFoundError):
    """A file to read that does not exist (a ``FileNotFoundError`` with ``filename`` set)."""

    def __init__(self, path: Path | str) -> None:
        super().__init__(2, "file not found", str(path))

    def __str__(self) -> str:
        return f"file not found: {self.filename}"


# ------------------------------------------------------------------------------------------------ bytes/text
def read_bytes(path: Path | str, *, limit: int = MAX_DOCUMENT_BYTES) -> bytes:
    """The bytes of a regular file, at most ``limit`` of them.

    Raises:
        ReadFileNotFoundError: no such file.
        ReadError: a folder or other non-regular file, or a file larger than ``limit``.
    """
    path = Path(path)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # before open: opening a FIFO would wait for a writer
            raise ReadError(path, "is a folder, not a file" if path.is_dir() else "is not a regular file")
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise ReadError(path, "is not a regular file")
            if info.st_size > limit:
                raise ReadError(path, f"is larger than the {limit:,}-byte limit for this kind of file")
            # read what fstat says and one byte more (never a buffer of `limit` bytes for a small file); a
            # file that grew meanwhile is read on, up to the limit
            parts = [f.read(info.st_size + 1)]
            total = len(parts[0])
            while total > info.st_size and total <= limit and parts[-1]:
                parts.append(f.read(min(2**20, limit + 1 - total)))
                total += len(parts[-1])
            data = b"".join(parts)
    except FileNotFoundError:
        raise ReadFileNotFoundError(path) from None
    except IsADirectoryError:
        raise ReadError(path, "is a folder, not a file") from None
    except OSError as e:
        raise ReadError(path, f"cannot be read ({e.strerror or e})") from None
    if len(data) > limit:
        raise ReadError(path, f"is larger than the {limit:,}-byte limit for this kind of file")
    return data


def decode_text(data: bytes, path: Path | str) -> str:
    """``data`` as UTF-8 text: a leading byte order mark dropped, NUL bytes refused.

    Raises:
        ReadError: a byte that is not UTF-8 or a NUL byte, naming its line and column.
    """
    if data.startswith(_BOM):
        data = data[len(_BOM) :]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line, column = _position(data, e.start)
        raise ReadError(path, f"not UTF-8 text (byte 0x{data[e.start]:02x} at column {column})", line) from None
    nul = text.find("\0")
    if nul >= 0:
        line, column = _position(text, nul)
        raise ReadError(path, f"holds a NUL byte at column {column} (a binary file?)", line)
    return text


def _position(data: bytes | str, offset: int) -> tuple[int, int]:
    newline = b"\n" if isinstance(data, bytes) else "\n"
    line = data.count(newline, 0, offset) + 1  # type: ignore[arg-type]
    return line, offset - (data.rfind(newline, 0, offset) + 1) + 1  # type: ignore[arg-type]


def read_text(path: Path | str, *, limit: int = MAX_DOCUMENT_BYTES) -> str:
    """A UTF-8 text file (see :func:`decode_text`), at most ``limit`` bytes."""
    return decode_text(read_bytes(path, limit=limit), path)


def read_lines(path: Path | str, *, limit: int = MAX_TABLE_BYTES) -> list[tuple[int, str]]:
    """The lines of a UTF-8 text file with their numbers (from 1), ``\\n`` removed; a text corpus.

    Lines are split at ``\\n`` only, as editors count a file's lines (a ``\\r`` before it is kept: strip it if
    the format allows); no empty line stands for the end of a file that ends with ``\\n``.
    """
    text = read_text(path, limit=limit)
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return list(enumerate(lines, start=1))


# ------------------------------------------------------------------------------------------------------ JSON
def parse_json(text: str | bytes, source: Path | str, *, max_depth: int = MAX_DEPTH, line: int | None = None) -> Any:
    """One JSON document, nesting bounded and every key of an object given once.

    Args:
        text: the document (bytes are decoded as in :func:`decode_text`).
        source: the file (or a description) the errors name.
        max_depth: the deepest nesting accepted.
        line: the line of the file the document starts on (JSONL), for the errors.

    Raises:
        ReadError: not UTF-8, nested too deep, malformed, or a key given twice.
    """
    if isinstance(text, bytes):
        text = decode_text(text, source)
    too_deep = ReadError(source, f"JSON nested more than {max_depth} deep", line)
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys)
    except RecursionError:  # json's C scanner stops at the interpreter's recursion limit, cleanly
        raise too_deep from None
    except _DuplicateKeyError as e:
        raise ReadError(source, f"the key {e.key!r} is named twice in one object", line) from None
    except json.JSONDecodeError as e:
        where = line + e.lineno - 1 if line is not None else e.lineno
        raise ReadError(source, f"not JSON ({e.msg} at column {e.colno})", where) from None
    if json_depth(value) > max_depth:
        raise too_deep
    return value


class _DuplicateKeyError(BertBlocksError, ValueError):
    """Internal: raised inside json's object hook, turned into a :class:`ReadError` naming the file and line."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKeyError(key)
        out[key] = value
    return out


def json_depth(value: Any) -> int:
    """How deeply a parsed JSON value nests (``[]`` and ``{}`` count 1), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest


def read_json(path: Path | str, *, limit: int = MAX_DOCUMENT_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """A JSON file (see :func:`parse_json`), at most ``limit`` bytes."""
    return parse_json(read_text(path, limit=limit), path, max_depth=max_depth)


def read_jsonl(path: Path | str, *, limit: int = MAX_TABLE_BYTES) -> list[tuple[int, Any]]:
    """The JSON values of a JSONL file, one per non-empty line, with their line numbers."""
    return [
        (number, parse_json(line, path, line=number)) for number, line in read_lines(path, limit=limit) if line.strip()
    ]


# ------------------------------------------------------------------------------------------------------ YAML
def parse_yaml(text: str, source: Path | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """One YAML document: ``safe_load`` with aliases and nesting bounded.

    Raises:
        ReadError: malformed YAML (``problem`` starts ``malformed YAML``), or aliases or nesting past the bounds
            (``refused YAML``), naming the line and column.
    """
    try:
        return load_yaml(text, max_depth=max_depth)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        what = "refused YAML" if isinstance(e, YAMLLimitError) else "malformed YAML"
        line, column = (mark.line + 1, mark.column + 1) if mark is not None else (None, None)
        raise ReadError(source, f"{what}: {e.problem}", line, column) from None
    except yaml.YAMLError as e:
        raise ReadError(source, f"malformed YAML: {e}") from None


def read_yaml(path: Path | str, *, limit: int = MAX_DOCUMENT_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """A YAML file (see :func:`parse_yaml`), at most ``limit`` bytes."""
    return parse_yaml(read_text(path, limit=limit), path, max_depth=max_depth)


# ------------------------------------------------------------------------------------------------- CSV / TSV
def read_csv(
    path: Path | str, *, delimiter: str = ",", limit: int = MAX_TABLE_BYTES
) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    """A CSV (or, with ``delimiter="\\t"``, TSV) file with a header row: its columns and its rows.

    Returns:
        ``(columns, [(line, {column: value}), ...])``; empty rows are skipped. A row with fewer fields than
        the header is refused, as one with more.

    Raises:
        ReadError: not UTF-8, a NUL byte, a field over :data:`MAX_CSV_FIELD` bytes, a field holding a line
            break (an unclosed quote), malformed quoting, a repeated column name, or a row of the wrong
            width, naming the line.
    """
    text = read_text(path, limit=limit)
    reader = csv.reader(text.splitlines(keepends=True), delimiter=delimiter, strict=True)
    rows = _csv_rows(reader, path)
    try:
        start, header = next(rows)
    except StopIteration:
        raise ReadError(path, "is empty: expected a header row naming the columns") from None
    repeated = sorted({c for c in header if header.count(c) > 1})
    if repeated:
        raise ReadError(path, f"the header names column(s) {', '.join(map(repr, repeated))} more than once", start)
    out = []
    for line, fields in rows:
        if not any(fields):
            continue
        if len(fields) != len(header):
            raise ReadError(path, f"{len(fields)} fields, but the header names {len(header)} columns", line)
        out.append((line, dict(zip(header, fields, strict=True))))
    return header, out


def _csv_rows(reader: Any, path: Path | str) -> Iterator[tuple[int, list[str]]]:
    line = 1  # where the next row starts
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            reason = str(e)
            if "field larger than field limit" in reason:
                reason = f"a field longer than {MAX_CSV_FIELD:,} bytes (the CSV field limit)"
            elif "unexpected end of data" in reason:
                reason = "an unclosed quote: the field runs to the end of the file"
            raise ReadError(path, f"not valid CSV: {reason}", line) from None
        for field in fields:
            if "\n" in field or "\r" in field:
                raise ReadError(
                    path,
                    "a field holds a line break (an unclosed quote?); a field must fit on its line",
                    line,
                )
            if len(field) > MAX_CSV_FIELD:  # with a quote the csv module counts characters; refuse either way
                raise ReadError(path, f"not valid CSV: a field longer than {MAX_CSV_FIELD:,} bytes", line)
        yield line, fields
        line = reader.line_num + 1


__all__ = [
    "MAX_CSV_FIELD",
    "MAX_DEPTH",
    "MAX_DOCUMENT_BYTES",
    "MAX_TABLE_BYTES",
    "ReadError",
    "ReadFileNotFoundError",
    "decode_text",
    "json_depth",
    "parse_json",
    "parse_yaml",
    "read_bytes",
    "read_csv",
    "read_json",
    "read_jsonl",
    "read_lines",
    "read_text",
    "read_yaml",
]
