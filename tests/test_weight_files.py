"""Untrusted weight files: safetensors headers validated before any tensor is made (errors name the file and
the tensor), legacy (torch < 1.6) ``.bin`` files loaded with ``weights_only`` as transformers does, and
pickles that want to run code refused as a user error (CLI exit 1) that never advises ``weights_only=False``."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

import bertblocks
from bertblocks.cli import main
from bertblocks.hf.weight_files import WeightFileError, read_safetensors, read_torch_bin
from bertblocks.hf.weights import CheckpointError, map_safetensors
from tests.tolerances import assert_close


def raw_safetensors(path: Path, header: Any, data: bytes, header_size: int | None = None) -> Path:
    """A safetensors file written by hand: 8-byte length, the header (any JSON, or raw bytes), the data."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    size = len(text) if header_size is None else header_size
    path.write_bytes(struct.pack("<Q", size) + text + data)
    return path


F32_12 = bytes(48)  # twelve float32 zeros
GOOD = {"a": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]}}


@pytest.mark.parametrize(
    ("header", "data", "tensor", "problem"),
    [
        (["a", "b"], b"", None, "the header is a JSON list, not an object"),
        (b"{not json", b"", None, "the header is not JSON"),
        (b"\xff\xfe", b"", None, "the header is not JSON"),
        (b'{"a": 1, "a": 2}', b"", None, "the key 'a' is named twice"),
        ({"a": {"shape": [3, 4], "data_offsets": [0, 48]}}, F32_12, "a", "its header entry lacks dtype"),
        ({"a": {**GOOD["a"], "extra": 1}}, F32_12, "a", "has unknown keys extra"),
        ({"a": [1, 2]}, F32_12, "a", "its header entry is a JSON list"),
        ({"a": {**GOOD["a"], "dtype": "F128"}}, F32_12, "a", "unknown dtype 'F128'; known: F64, F32"),
        ({"a": {**GOOD["a"], "shape": [3, 5]}}, F32_12, "a", "shape [3, 5] of F32 needs 60 bytes but"),
        ({"a": {**GOOD["a"], "shape": [3, -4]}}, F32_12, "a", "is not a list of non-negative integers"),
        ({"a": {**GOOD["a"], "shape": [True, 12]}}, F32_12, "a", "is not a list of non-negative integers"),
        ({"a": {**GOOD["a"], "data_offsets": [48, 0]}}, F32_12, "a", "end before they begin"),
        ({"a": {**GOOD["a"], "data_offsets": [0]}}, F32_12, "a", "is not [begin, end]"),
        ({"a": {**GOOD["a"], "data_offsets": [0, 96]}}, F32_12, "a", "go past the end of the data (48 bytes"),
        (GOOD, F32_12[:40], "a", "go past the end of the data (40 bytes; truncated file?)"),
        (GOOD, F32_12 + b"xx", None, "the tensors cover 48 bytes of data but the file holds 50"),
        ({"__metadata__": ["x"], **GOOD}, F32_12, None, "__metadata__ is not an object"),
        (
            {**GOOD, "b": {"dtype": "F32", "shape": [4], "data_offsets": [32, 48]}},
            F32_12,
            "b",
            "its bytes overlap those of 'a'",
        ),
        (
            {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {**GOOD["a"], "data_offsets": [16, 64]}},
            bytes(64),
            "b",
            "bytes 8-16 before it belong to no tensor",
        ),
    ],
)
def test_a_malformed_safetensors_header_names_the_file_and_the_tensor(tmp_path, header, data, tensor, problem):
    path = raw_safetensors(tmp_path / "model.safetensors", header, data)
    with pytest.raises(WeightFileError) as info:
        read_safetensors(path)
    assert info.value.path == path
    assert info.value.tensor == tensor
    assert problem in str(info.value)
    where = f"{path}: tensor {tensor!r}: " if tensor else f"{path}: "
    assert str(info.value).startswith(where + "not a valid safetensors file")
    with pytest.raises(CheckpointError, match="not a valid safetensors file"):  # through the loading path
        map_safetensors(path)


@pytest.mark.parametrize(
    ("header_size", "problem"),
    [(2**63, "more than the file holds"), (10**9, "more than the file holds"), (3, "not JSON")],
)
def test_a_header_length_that_lies_is_refused_before_reading(tmp_path, header_size, problem):
    path = raw_safetensors(tmp_path / "m.safetensors", GOOD, F32_12, header_size=header_size)
    with pytest.raises(WeightFileError, match=problem):
        read_safetensors(path)


def test_a_file_shorter_than_the_length_field(tmp_path):
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"\x01\x02")
    with pytest.raises(WeightFileError, match="2 bytes, shorter than the 8-byte header length"):
        read_safetensors(path)


def test_a_truncated_checkpoint_fails_loading_with_the_file_and_tensor(hf_checkpoint):
    directory = hf_checkpoint()
    path = directory / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=rf"{path}: tensor '.+': not a valid safetensors file: .*truncated"):
        bertblocks.from_pretrained(directory)


def test_a_valid_file_reads_every_dtype_and_an_unaligned_one_is_copied(tmp_path):
    tensors = {
        "f": torch.randn(3, 4),
        "h": torch.randn(5).half(),
        "i": torch.arange(3),
        "u": torch.tensor([1, 2, 3], dtype=torch.uint8),
    }
    path = tmp_path / "ok.safetensors"
    save_file(tensors, path)
    for name, tensor in read_safetensors(path).items():
        assert torch.equal(tensor, tensors[name])
    # a hand-made file whose float32 data start at an odd offset (the library pads; a crafted file may not)
    header = {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    text = json.dumps(header).encode()
    text += b" " * ((len(text) % 4) or 4) + (b"" if (8 + len(text)) % 4 else b" ")
    assert (8 + len(text)) % 4
    odd = raw_safetensors(tmp_path / "odd.safetensors", text, struct.pack("<2f", 1.5, -2.0))
    assert read_safetensors(odd)["x"].tolist() == [1.5, -2.0]


# ------------------------------------------------------------------------------------------------- .bin
def _as_legacy_bin(directory: Path) -> None:
    """Rewrite a checkpoint's weights as a torch < 1.6 (non-zip) pytorch_model.bin."""
    from safetensors.torch import load_file

    state = load_file(directory / "model.safetensors")
    (directory / "model.safetensors").unlink()
    torch.save(state, directory / "pytorch_model.bin", _use_new_zipfile_serialization=False)


def test_a_legacy_non_zip_bin_loads_and_matches_transformers(hf_checkpoint):
    import transformers

    directory = hf_checkpoint()
    reference = transformers.BertModel.from_pretrained(directory).eval()
    _as_legacy_bin(directory)
    import zipfile

    assert not zipfile.is_zipfile(directory / "pytorch_model.bin")
    model = bertblocks.from_pretrained(directory).eval()
    ids = torch.randint(0, 99, (2, 7))
    with torch.no_grad():
        assert_close(model(ids).last_hidden_state, reference(ids).last_hidden_state)


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("legacy", [False, True])
def test_a_pickle_that_runs_code_is_refused_naming_the_file(tmp_path, hf_checkpoint, legacy):
    directory = hf_checkpoint()
    (directory / "model.safetensors").unlink()
    marker = tmp_path / "code-ran"
    path = directory / "pytorch_model.bin"
    torch.save({"payload": _RunsCode(marker)}, path, _use_new_zipfile_serialization=not legacy)
    with pytest.raises(CheckpointError) as info:
        bertblocks.from_pretrained(directory)
    message = str(info.value)
    assert message.startswith(f"{path}: refused: the file asks to build objects other than tensors")
    assert "system" in message  # what it asked for
    assert "weights_only=False" not in message
    assert "weights_only` set to `False" not in message
    assert not marker.exists()


def test_cli_reports_a_refused_pickle_as_a_user_error(tmp_path, hf_checkpoint, capsys):
    directory = hf_checkpoint()
    (directory / "model.safetensors").unlink()
    marker = tmp_path / "code-ran"
    torch.save({"payload": _RunsCode(marker)}, directory / "pytorch_model.bin")
    assert main(["embed", "--model", str(directory), "hello"]) == 1
    err = capsys.readouterr().err
    assert f"{directory / 'pytorch_model.bin'}: refused" in err
    assert "bug" not in err
    assert "weights_only" not in err.replace("plain tensors only", "")
    assert not marker.exists()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (lambda p: p.write_bytes(b"PK\x03\x04 truncated zip"), "cannot be read as a PyTorch weight file"),
        (lambda p: torch.save([torch.ones(2)], p), "holds a list, not a mapping of names to tensors"),
        (lambda p: torch.save({"w": 3}, p), "tensor 'w': holds a int, not a tensor"),
    ],
)
def test_a_bin_that_is_no_state_dict_is_a_clear_error(tmp_path, content, problem):
    path = tmp_path / "pytorch_model.bin"
    content(path)
    with pytest.raises(WeightFileError, match=problem) as info:
        read_torch_bin(path)
    assert str(info.value).startswith(str(path))
