"""Loading a quantized folder trusts nothing in it: quantization.json is a strict, typed manifest read by the
bounded JSON reader; the weights go through the project's safetensors checks; no tensor is cast; scales are
finite. Each case was a raw error or a silently wrong model before."""

from __future__ import annotations

import json
import typing
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import TINY
from safetensors.torch import load_file, save_file

import bertblocks
from bertblocks.models.quantize import MANIFEST_FILE, WEIGHTS_FILE, QuantizationError, load_quantized, save_quantized
from bertblocks.models.quantize import quantize as quantize_model


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("int8")
    save_quantized(quantize_model(bertblocks.create_model(TINY).eval()), folder)
    return folder


@pytest.fixture
def folder(saved: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "int8"
    copy.mkdir()
    for file in saved.iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    return copy


def test_a_saved_folder_loads(folder: Path):
    assert bertblocks.models.quantize.is_quantized(load_quantized(folder))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", r"quantization\.json, line 1: not JSON"),
        (b"[1, 2]", r"quantization\.json holds a JSON list, not an object"),
        (b'{"class": "BertModel", "scheme": "int8-dynamic", "skip": []}\xff', r"line 1: not UTF-8 text"),
        (
            b'{"class": "BertModel", "scheme": "int8-dynamic", "skip": "cls.*"}',
            r"quantization\.json: skip: Input should be a valid list \(got 'cls\.\*'\)",
        ),
        (
            b'{"class": ["BertModel"], "scheme": "int8-dynamic", "skip": []}',
            r"quantization\.json: class: Input should be a valid string \(got \['BertModel'\]\)",
        ),
        (b'{"class": "BertModel", "skip": []}', r"quantization\.json: scheme: Field required"),
        (
            b'{"class": "BertModel", "scheme": "int8-dynamic", "skip": [], "bits": 4}',
            r"bits: Extra inputs are not permitted",
        ),
        (
            b'{"class": "BertModel", "scheme": "int4-awq", "skip": []}',
            r"names the scheme 'int4-awq', which this bertblocks cannot read \(it reads 'int8-dynamic'\)",
        ),
        (b'{"class": "BertModel", "class": "BertModel", "scheme": "int8-dynamic"}', r"'class' is named twice"),
        (
            b'{"class": "BertModel", "scheme": "int8-dynamic", "skip": [], "kernel": "avx512"}',
            r"kernel: Input should be 'int_mm' or 'fbgemm' \(got 'avx512'\)",
        ),
    ],
    ids=["not-json", "list", "not-utf8", "skip-str", "class-list", "no-scheme", "extra", "scheme", "twice", "kernel"],
)
def test_a_bad_manifest_is_refused_naming_the_file(folder: Path, content: bytes, message: str):
    (folder / MANIFEST_FILE).write_bytes(content)
    with pytest.raises(QuantizationError, match=message) as info:
        load_quantized(folder)
    assert str(folder / MANIFEST_FILE) in str(info.value)


def _rewrite(folder: Path, change: Callable[[dict[str, torch.Tensor]], None]) -> None:
    tensors = dict(load_file(folder / WEIGHTS_FILE))
    change(tensors)
    save_file(tensors, folder / WEIGHTS_FILE)


def _first(tensors: dict[str, torch.Tensor], suffix: str) -> str:
    return sorted(k for k in tensors if k.endswith(suffix))[0]


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_scales_are_refused_naming_the_tensor(folder: Path, value: float):
    name = ""

    def poison(tensors: dict[str, torch.Tensor]) -> None:
        nonlocal name
        name = _first(tensors, ".weight_scale")
        tensors[name] = tensors[name].clone()
        tensors[name][1] = value

    _rewrite(folder, poison)
    with pytest.raises(QuantizationError, match=rf"tensor '{name}' holds non-finite scales"):
        load_quantized(folder)


@pytest.mark.parametrize(
    ("suffix", "dtype", "held"),
    [(".weight", torch.float32, "torch.int8"), (".weight_scale", torch.int64, "torch.float32")],
)
def test_a_tensor_of_another_dtype_is_refused_not_cast(folder: Path, suffix: str, dtype: torch.dtype, held: str):
    name = ""

    def recast(tensors: dict[str, torch.Tensor]) -> None:
        nonlocal name
        name = _first(tensors, suffix) if suffix == ".weight_scale" else _first(tensors, "query.weight")
        tensors[name] = tensors[name].to(dtype)

    _rewrite(folder, recast)
    with pytest.raises(QuantizationError, match=rf"tensor '{name}' is {dtype}, but the model holds {held}"):
        load_quantized(folder)


def test_a_truncated_weight_file_gets_the_projects_header_checks(folder: Path):
    data = (folder / WEIGHTS_FILE).read_bytes()
    (folder / WEIGHTS_FILE).write_bytes(data[: len(data) - 100])
    with pytest.raises(QuantizationError, match=r"model\.int8\.safetensors: .*not a valid safetensors file"):
        load_quantized(folder)
    (folder / WEIGHTS_FILE).write_bytes(b"")
    with pytest.raises(QuantizationError, match=r"model\.int8\.safetensors: is empty"):
        load_quantized(folder)


def test_a_missing_or_extra_tensor_is_named(folder: Path):
    removed = ""

    def drop(tensors: dict[str, torch.Tensor]) -> None:
        nonlocal removed
        removed = _first(tensors, ".weight_scale")
        del tensors[removed]
        tensors["extra.weight"] = torch.zeros(2)

    _rewrite(folder, drop)
    with pytest.raises(QuantizationError, match=r"unexpected tensors \['extra\.weight'\]"):
        load_quantized(folder)
    _rewrite(folder, lambda tensors: tensors.pop("extra.weight"))
    with pytest.raises(QuantizationError, match=rf"missing tensors \['{removed}'\]"):
        load_quantized(folder)


def test_the_manifest_written_by_save_is_what_load_reads(saved: Path):
    manifest = json.loads((saved / MANIFEST_FILE).read_text())
    from bertblocks.models.quantize import KERNELS, Kernel, QuantizationManifest

    assert manifest.pop("kernel") in KERNELS  # this machine's kernel, recorded (int_mm or fbgemm)
    assert manifest == {"class": "BertModel", "scheme": "int8-dynamic", "skip": []}
    for kernel in KERNELS:  # the declaration takes every kernel save can write, and only those
        QuantizationManifest.model_validate({**manifest, "kernel": kernel})
    assert typing.get_args(QuantizationManifest.model_fields["kernel"].annotation) == (Kernel, type(None))
    assert typing.get_args(Kernel) == KERNELS
