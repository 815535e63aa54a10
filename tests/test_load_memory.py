"""Memory after ``from_pretrained``: the loaded weights *are* the checkpoint file's pages, never a second copy.

How it is checked, without timing or machine-dependent thresholds: ``/proc/self/maps`` lists the address
ranges where the process maps the checkpoint file; every loaded parameter's storage must lie inside them (a
copy would live in anonymous memory), tied parameters must share one storage, and where a load must copy
(a cast to another dtype) the mapping must be gone afterwards (no file kept mapped behind its copy).
Linux only: other systems have no ``/proc/self/maps``.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import bertblocks

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps (Linux)")


def _mapped_ranges(path: Path) -> list[tuple[int, int]]:
    """The address ranges where this process maps ``path`` now."""
    target = str(path.resolve())
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == target:
            begin, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((begin, end))
    return ranges


def _storage(tensor: torch.Tensor) -> tuple[int, int]:
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def _inside(storage: tuple[int, int], ranges: list[tuple[int, int]]) -> bool:
    begin, size = storage
    return any(low <= begin and begin + size <= high for low, high in ranges)


@pytest.mark.parametrize("cls", ["BertModel", "BertForMaskedLM"])
def test_every_loaded_parameter_is_the_checkpoint_file_not_a_copy(hf_checkpoint: Callable[..., Path], cls: str):
    directory = hf_checkpoint(cls)
    model = bertblocks.from_pretrained(directory, head="auto")
    ranges = _mapped_ranges(directory / "model.safetensors")
    assert ranges, "the checkpoint is not mapped: its tensors were copied (or read into memory)"
    parameters = dict(model.named_parameters(remove_duplicate=False))
    copies = [name for name, p in parameters.items() if not _inside(_storage(p), ranges)]
    assert not copies, f"parameters copied out of the checkpoint's pages: {copies}"
    # tied weights (the masked-LM decoder and the word embeddings) are one storage, not two
    unique = {id(p) for p in parameters.values()}
    assert len({_storage(p) for p in parameters.values()}) == len(unique)
    if cls == "BertForMaskedLM":
        assert len(unique) < len(parameters)


def test_a_load_that_must_copy_keeps_no_mapping_behind_the_copy(hf_checkpoint: Callable[..., Path]):
    """A cast (fp32 checkpoint loaded in bfloat16) makes new tensors; the file's pages must then be released,
    not held by a forgotten reference next to their converted copy."""
    directory = hf_checkpoint()
    model = bertblocks.from_pretrained(directory, dtype=torch.bfloat16)
    gc.collect()
    assert next(model.parameters()).dtype == torch.bfloat16
    assert _mapped_ranges(directory / "model.safetensors") == []


def test_the_mapping_lives_as_long_as_the_model(hf_checkpoint: Callable[..., Path]):
    directory = hf_checkpoint()
    model = bertblocks.from_pretrained(directory)
    assert _mapped_ranges(directory / "model.safetensors")
    del model
    gc.collect()
    assert _mapped_ranges(directory / "model.safetensors") == []
