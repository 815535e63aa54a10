"""The numerics a GPU changes, tested on every device the machine has (the ``device`` fixture: ``cpu`` always,
``cuda`` where present): low-precision runs (bfloat16, float16) within the dtype's bound of transformers' float32
numbers (``tests/tolerances.py``), and every kernel of PyTorch's ``scaled_dot_product_attention`` giving the same
outputs (on CPU: the math kernel and the default fused one; on CUDA: math, flash, memory-efficient, and cuDNN where
present). The same test code runs on CPU on every run, so the CUDA cases cannot rot between GPU runs."""

from __future__ import annotations

import logging

import pytest
import torch
import transformers
from torch.nn.attention import SDPBackend, sdpa_kernel

import bertblocks
from tests.conftest import TINY_HF, batch, to_device
from tests.tolerances import assert_close, assert_low_precision_close

LAYERS = TINY_HF["num_hidden_layers"]

#: the aten op each SDPA backend runs, per device type (what the profiler shows, so a test knows the kernel ran)
KERNEL_OPS = {
    ("cpu", SDPBackend.MATH): "aten::_scaled_dot_product_attention_math",
    ("cpu", SDPBackend.FLASH_ATTENTION): "aten::_scaled_dot_product_flash_attention_for_cpu",
    ("cuda", SDPBackend.MATH): "aten::_scaled_dot_product_attention_math",
    ("cuda", SDPBackend.FLASH_ATTENTION): "aten::_scaled_dot_product_flash_attention",
    ("cuda", SDPBackend.EFFICIENT_ATTENTION): "aten::_scaled_dot_product_efficient_attention",
    ("cuda", SDPBackend.CUDNN_ATTENTION): "aten::_scaled_dot_product_cudnn_attention",
}


def sdpa_backends(device: str) -> list[SDPBackend]:
    """The SDPA kernels of ``device``: CPU has the math one and a fused (flash-style) one; CUDA has math, flash,
    memory-efficient and, with cuDNN 9 on compute capability 8.0 or newer, cuDNN's."""
    if device == "cpu":
        return [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION]
    backends = [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    cudnn = torch.backends.cudnn.is_available() and (torch.backends.cudnn.version() or 0) >= 90000
    if cudnn and torch.cuda.get_device_capability() >= (8, 0):
        backends.append(SDPBackend.CUDNN_ATTENTION)
    return backends


def masked_backends(device: str) -> set[SDPBackend]:
    """The kernels that take an attention mask (a padded batch): CUDA's flash and cuDNN kernels take none."""
    if device == "cpu":
        return {SDPBackend.MATH, SDPBackend.FLASH_ATTENTION}
    return {SDPBackend.MATH, SDPBackend.EFFICIENT_ATTENTION}


@pytest.fixture
def reference(hf_checkpoint):
    """A tiny BertForMaskedLM checkpoint and transformers' float32 logits (CPU) on :func:`tests.conftest.batch`."""
    logging.getLogger("transformers").setLevel(logging.ERROR)
    directory = hf_checkpoint("BertForMaskedLM")
    hf = transformers.BertForMaskedLM.from_pretrained(directory).eval()
    inputs = batch(3)
    uniform = {key: value[:1] for key, value in inputs.items()}  # row 0 has no padding
    with torch.no_grad():
        return directory, inputs, hf(**inputs).logits, uniform, hf(**uniform).logits


def _real(logits: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    return logits[inputs["attention_mask"].bool().to(logits.device)].float().cpu()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("packing", ["never", "always"])
def test_low_precision_run_is_within_the_dtype_bound_of_transformers_fp32(reference, device, dtype, packing):
    """bertblocks in ``dtype`` on ``device``, padded and packed, within the policy's bound of transformers' float32
    logits; and transformers' own ``dtype`` run is too (the bound is not tighter than the reference's rounding)."""
    directory, inputs, expected, _, _ = reference
    ours = bertblocks.BertForMaskedLM.from_pretrained(directory, [f"encoder.packing={packing}"])
    ours = ours.to(device=device, dtype=dtype).eval()
    theirs = transformers.BertForMaskedLM.from_pretrained(directory).to(device=device, dtype=dtype).eval()
    x = to_device(inputs, device)
    with torch.no_grad():
        got, hf_low = ours(**x).logits, theirs(**x).logits
    assert got.dtype == dtype
    real = _real(expected, inputs)
    assert_low_precision_close(_real(got, inputs), real, dtype=dtype, layers=LAYERS, what=f"{dtype} logits")
    assert_low_precision_close(_real(hf_low, inputs), real, dtype=dtype, layers=LAYERS, what=f"transformers {dtype}")


def _run_with(backend: SDPBackend, model: torch.nn.Module, inputs: dict[str, torch.Tensor], device: str):
    """The model's logits with only ``backend`` allowed, and whether its aten op ran."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile, sdpa_kernel([backend]):
        logits = model(**inputs).logits
    ran = {event.key for event in profile.key_averages()}
    return logits, KERNEL_OPS[(device, backend)] in ran


@pytest.mark.parametrize("batch_kind", ["uniform", "padded", "packed"])
def test_every_sdpa_kernel_gives_transformers_numbers(reference, device, batch_kind):
    """Each SDPA kernel of the device runs (its op shows in the profile) and gives transformers' float32 logits:
    fp32 within ``OUTPUT_ATOL`` where the kernel takes fp32, otherwise (CUDA's flash and cuDNN kernels) bfloat16
    within its bound. ``uniform`` has no padding (no mask reaches the kernel), ``padded`` a masked batch (only the
    kernels that take a mask), ``packed`` the padded batch packed (one unmasked call per sequence)."""
    directory, inputs, expected, uniform, expected_uniform = reference
    if batch_kind == "uniform":
        inputs, expected = uniform, expected_uniform
    packing = "always" if batch_kind == "packed" else "never"
    # packed batches through SDPA itself (on CUDA, varlen_kernel auto would attend them with FlashAttention)
    overrides = [f"encoder.packing={packing}", "encoder.attention.backend.varlen_kernel=per_sequence"]
    backends = [b for b in sdpa_backends(device) if batch_kind != "padded" or b in masked_backends(device)]
    assert len(backends) >= 2  # at least two kernels to compare on every device
    real = _real(expected, inputs)
    for backend in backends:
        half = device != "cpu" and backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION)
        dtype = torch.bfloat16 if half else torch.float32
        # a model loaded for each kernel: one cast to bfloat16 and back would leave its weights rounded for the
        # float32 kernels after it (seen on an H100: the memory-efficient kernel ran after flash, 0.02 off)
        model = bertblocks.BertForMaskedLM.from_pretrained(directory, overrides).to(device=device, dtype=dtype).eval()
        with torch.no_grad():
            logits, ran = _run_with(backend, model, to_device(inputs, device), device)
        assert ran, f"{backend.name}: {KERNEL_OPS[(device, backend)]} did not run"
        if dtype == torch.float32:
            assert_close(_real(logits, inputs), real, what=backend.name)
        else:
            assert_low_precision_close(_real(logits, inputs), real, dtype=dtype, layers=LAYERS, what=backend.name)


def test_the_cuda_fixture_matches_the_machine():
    """``device`` adds ``cuda`` exactly when torch sees a GPU (so ``pytest -m cuda`` runs them there)."""
    from tests.conftest import DEVICES

    ids = [param.id for param in DEVICES]  # type: ignore[attr-defined]
    assert ids == (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])


def test_selecting_the_cuda_cases_never_fails_for_want_of_a_gpu():
    """The documented ``python -m pytest -q -m cuda`` exits 0 on every machine: it runs the CUDA cases where there
    is a GPU, and where there is none it selects nothing and says so (pytest alone would exit 5, "no tests")."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda"]
    command += ["tests/test_varlen_kernels.py", "-k", "flex_equals_the_per_sequence_reference"]
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    if torch.cuda.is_available():
        assert "1 passed" in done.stdout
    else:
        assert "no CUDA device: the cuda cases are collected only where torch.cuda.is_available()" in done.stdout
