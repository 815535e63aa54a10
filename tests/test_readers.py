"""The one bounded reader per format (bertblocks/readers/): what each guarantees, and a structural test that
no module of the package parses a file format itself (shown to catch a planted one)."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest

import bertblocks
from bertblocks.readers import (
    MAX_CSV_FIELD,
    MAX_DEPTH,
    ReadError,
    ReadFileNotFoundError,
    parse_json,
    read_bytes,
    read_csv,
    read_json,
    read_jsonl,
    read_lines,
    read_text,
    read_yaml,
)

PACKAGE = Path(bertblocks.__file__).parent
#: the modules allowed to parse formats: the readers, the YAML loader they build on, and the safetensors
#: header parser (whose JSON goes through bertblocks.readers.parse_json)
READER_MODULES = {"readers/__init__.py", "readers/bounded_yaml.py", "hf/weight_files.py"}

#: module → attributes whose use parses a file format (reading, not writing)
FORBIDDEN_ATTRIBUTES = {
    "json": {"load", "loads"},
    "csv": {"reader", "DictReader"},
    "yaml": {"load", "safe_load", "full_load", "unsafe_load", "load_all", "safe_load_all", "full_load_all"},
    "safetensors": {"safe_open", "load_file", "load", "load_model"},
    "torch": set(),
}
FORBIDDEN_NAMES = {"load_yaml", "safe_open", "load_file", "load_model"}


def offenders(source: str, filename: str = "<planted>") -> list[str]:
    """Every place in ``source`` that parses JSON, CSV, YAML or a safetensors file other than through
    bertblocks.readers, as ``file:line: what``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Attribute):
            root = node.value
            while isinstance(root, ast.Attribute):  # safetensors.torch.load_file
                root = root.value
            if isinstance(root, ast.Name) and node.attr in FORBIDDEN_ATTRIBUTES.get(root.id, set()):
                found.append(f"{filename}:{node.lineno}: {root.id}….{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            top = node.module.split(".")[0]
            for alias in node.names:
                if alias.name in FORBIDDEN_ATTRIBUTES.get(top, set()) | (FORBIDDEN_NAMES - {"load_yaml"}):
                    found.append(f"{filename}:{node.lineno}: from {node.module} import {alias.name}")
                if alias.name == "load_yaml":
                    found.append(f"{filename}:{node.lineno}: imports load_yaml (use bertblocks.readers)")
        elif isinstance(node, ast.Import):
            found += [
                f"{filename}:{node.lineno}: import {a.name}" for a in node.names if a.name.startswith("safetensors")
            ]
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            found.append(f"{filename}:{node.lineno}: {node.id}")
    return found


def test_no_module_parses_a_file_format_outside_the_readers():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative not in READER_MODULES:
            found += offenders(path.read_text(encoding="utf-8"), relative)
    assert not found, "parse files through bertblocks.readers, not:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "planted",
    [
        "import json\ndata = json.loads(path.read_text())",
        "import json\nwith open(p) as f:\n    data = json.load(f)",
        "from json import loads",
        "import csv\nrows = list(csv.DictReader(open(p)))",
        "import csv\nrows = list(csv.reader(text.splitlines()))",
        "import yaml\nconfig = yaml.safe_load(text)",
        "from bertblocks.readers.bounded_yaml import load_yaml",
        "from safetensors.torch import load_file",
        "from safetensors import safe_open",
        "import safetensors.torch\nstate = safetensors.torch.load_file(p)",
    ],
)
def test_the_structural_check_catches_a_planted_reader(planted):
    assert offenders(planted), planted
    # and it would fail the package test: plant it in a copy of a real module
    module = (PACKAGE / "hf" / "hub.py").read_text(encoding="utf-8")
    assert not offenders(module)
    assert offenders(module + "\n" + planted)


def test_writers_and_docstrings_are_not_offenders():
    assert not offenders('"""json.loads in a docstring"""\nimport json\ntext = json.dumps({})')
    assert not offenders("from safetensors.torch import save_file")


# ------------------------------------------------------------------------------------------------ the reader
def test_missing_folder_and_oversized_files_are_named(tmp_path):
    with pytest.raises(ReadFileNotFoundError) as missing:
        read_text(tmp_path / "nope.json")
    assert isinstance(missing.value, FileNotFoundError)
    assert missing.value.filename == str(tmp_path / "nope.json")
    (tmp_path / "t.csv").mkdir()
    with pytest.raises(ReadError, match=r"t\.csv: is a folder, not a file"):
        read_csv(tmp_path / "t.csv")
    os.mkfifo(tmp_path / "fifo.json")  # opening it would wait for a writer: refused before it is opened
    with pytest.raises(ReadError, match=r"fifo\.json: is not a regular file"):
        read_json(tmp_path / "fifo.json")
    big = tmp_path / "big.json"
    big.write_text("[" + "0," * 600 + "0]")
    with pytest.raises(ReadError, match=r"big\.json: is larger than the 1,000-byte limit"):
        read_bytes(big, limit=1000)
    assert read_json(big, limit=2000) == [0] * 601


def test_text_is_utf8_with_a_bom_accepted_and_nul_bytes_refused(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"\xef\xbb\xbfalpha\nbeta\n")
    assert read_lines(path) == [(1, "alpha"), (2, "beta")]
    path.write_bytes(b"alpha\nbe\xfft\n")
    with pytest.raises(ReadError, match=r"a\.txt, line 2: not UTF-8 text \(byte 0xff at column 3\)"):
        read_text(path)
    path.write_bytes(b"alpha\nbeta\n\x00gamma\n")
    with pytest.raises(ReadError, match=r"a\.txt, line 3: holds a NUL byte at column 1"):
        read_lines(path)


def test_json_depth_is_bounded_before_parsing_and_duplicate_keys_are_refused(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)  # a RecursionError for json.loads
    with pytest.raises(ReadError, match=rf"deep\.json: JSON nested more than {MAX_DEPTH} deep"):
        read_json(deep)
    assert parse_json("[" * MAX_DEPTH + "]" * MAX_DEPTH, "x") is not None
    with pytest.raises(ReadError, match=rf"x: JSON nested more than {MAX_DEPTH} deep"):
        parse_json("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "x")
    # an unterminated string or a run of escaped quotes is one linear scan (no regex that backtracks)
    for text in ('"' + "a" * 100_000, '"' + '\\"' * 100_000, '["' + "a" * 100_000 + "]"):
        with pytest.raises(ReadError, match="not JSON"):
            parse_json(text, "x")
    assert parse_json('{"a": "[[[[[[[[", "b": {"c": "}}}"}}', "x", max_depth=2) == {"a": "[[[[[[[[", "b": {"c": "}}}"}}
    with pytest.raises(ReadError, match=r"x, line 2: the key 'a' is named twice in one object"):
        parse_json('{"b": {"a": 1,\n"a": 2}}', "x", line=2)
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "a": 1,\n  "b" 2\n}')
    with pytest.raises(ReadError, match=r"bad\.json, line 3: not JSON \(Expecting ':' delimiter at column 7\)"):
        read_json(bad)


def test_jsonl_errors_name_the_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2\n')
    with pytest.raises(ReadError, match=r"t\.jsonl, line 3: not JSON"):
        read_jsonl(path)
    path.write_text('{"a": 1}\n\n[2]\n')
    assert read_jsonl(path) == [(1, {"a": 1}), (3, [2])]


def test_yaml_nesting_is_bounded_and_errors_name_the_line(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("a: " + "[" * 100_000 + "]" * 100_000 + "\n")  # a RecursionError for yaml.safe_load
    with pytest.raises(ReadError, match=rf"deep\.yaml, line 1, column \d+: refused YAML: nested more than {MAX_DEPTH}"):
        read_yaml(path)
    path.write_text("a: 1\nb: [2\n")
    with pytest.raises(ReadError, match=r"deep\.yaml, line 3, column 1: malformed YAML"):
        read_yaml(path)
    path.write_bytes(b"\xef\xbb\xbfa: 1\n")
    assert read_yaml(path) == {"a": 1}


def test_csv_limits_quotes_and_bom(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"\xef\xbb\xbfsentence,label\nthe cat runs,1\n")  # Excel's "CSV UTF-8"
    assert read_csv(path) == (["sentence", "label"], [(2, {"sentence": "the cat runs", "label": "1"})])
    path.write_text("sentence,label\nfine,0\n" + "x" * (MAX_CSV_FIELD + 1) + ",1\n")
    with pytest.raises(ReadError, match=r"t\.csv, line 3: not valid CSV: a field longer than 131,072 bytes"):
        read_csv(path)
    path.write_text('sentence,label\n"quoted,0\nnext,1\nlast,0\n')
    with pytest.raises(ReadError, match=r"t\.csv, line 2: not valid CSV: an unclosed quote"):
        read_csv(path)
    path.write_text('sentence,label\nfine,0\n"a quote left open,1\nnext,1\n"late quote",0\nafter,1\n')
    with pytest.raises(ReadError, match=r"t\.csv, line 3: not valid CSV: ',' expected after '\"'"):
        read_csv(path)
    # a quote that closes rows later, where a field may end: the rows between would be one text
    path.write_text('sentence,label\nfine,0\n"a quote left open,1\nnext,1\nlast,0",1\nafter,1\n')
    with pytest.raises(ReadError, match=r"t\.csv, line 3: a field holds a line break \(an unclosed quote\?\)"):
        read_csv(path)
    path.write_text("sentence,label\nfine,0,extra\n")
    with pytest.raises(ReadError, match=r"t\.csv, line 2: 3 fields, but the header names 2 columns"):
        read_csv(path)
    path.write_text("a\tb\n1\t2\n")
    assert read_csv(path, delimiter="\t")[1] == [(2, {"a": "1", "b": "2"})]


def test_safetensors_headers_use_the_one_json_parser(tmp_path):
    import struct

    from bertblocks.hf.weight_files import WeightFileError, read_safetensors

    header = ("[" * 100_000 + "]" * 100_000).encode()
    path = tmp_path / "deep.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(WeightFileError, match=rf"the header is not JSON \(JSON nested more than {MAX_DEPTH} deep\)"):
        read_safetensors(path)
    header = json.dumps({"__metadata__": {"format": "pt"}}).encode().replace(b"}}", b', "format": "x"}}')
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(WeightFileError, match=r"the key 'format' is named twice"):
        read_safetensors(path)
