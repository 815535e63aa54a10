"""The suite's one tolerance policy for numeric comparisons (CONTRIBUTING.md, "Numeric tolerances").

fp32 results depend on the CPU: the GEMM library picks a blocking (and so a summation order) per
instruction set and per matrix shape, so the same correct computation differs by a few ulps from one
machine to the next. A bound tighter than the rounding of fp32 makes a suite that passes on the machine
it was written on and fails on another one; a bound looser than needed hides real bugs. So:

- **Model outputs** (hidden states, logits, losses, attention probabilities, embeddings) compared with
  transformers, or between two paths that compute the same function with different kernels (fused vs
  split projections, chunked vs whole feed-forward, packed vs padded, compiled vs eager, SDPA vs eager),
  are equal within :data:`OUTPUT_ATOL` (1e-5, absolute). A wrong mask, position or weight moves the
  outputs of the tiny test models by 1e-2 or more, three orders above it.
- **Gradients and reductions** (a loss summed over a batch, weight gradients accumulated over many
  tokens) grow with the values they sum, and so does their rounding: they are equal within
  :data:`GRAD_RTOL` times the largest magnitude of the reference (at least 1), see
  :func:`assert_grads_close`.
- **Exact equality** (``torch.equal``, :func:`assert_identical`) only where the same kernel runs on the
  same data: a reload of the same weights into the same model, a tuple view of the same output, a copy.
  Say why next to the assertion.

float64 references of a closed formula (a rotary angle, an ALiBi slope) may use tighter bounds: there is
no GEMM between the two sides. Say so next to the assertion.

**Low precision** (bfloat16, float16: a GPU's usual dtypes, and the CPU's where torch supports them): a model run
in the low dtype is compared with the float32 reference (transformers in float32 on the same weights), within
:func:`low_precision_atol`: ``LOW_PRECISION_EPS_PER_LAYER × layers × eps(dtype) × max(1, max |reference|)``.
Why that shape: every matmul, softmax and LayerNorm output is rounded to the dtype, a relative error of
``eps / 2`` each, and an encoder layer has about a dozen such roundings in a chain (Q/K/V, scores, softmax,
context, output projection, residual, LayerNorm, two FFN matmuls, activation, residual, LayerNorm); LayerNorm
renormalises, so the errors add up layer by layer rather than compound. Measured on the tiny test models (2
layers, CPU, 3 seeds, BertModel / ForMaskedLM / ForSequenceClassification, padded and packed): at most 2.6 ε
(bfloat16) and 9.0 ε (float16, padded) of the output scale from float32, and transformers' own low-precision run
is as far (bertblocks' bf16/fp16 output equals transformers' bit for bit there: the same kernels); 8 ε per layer
leaves about 2× headroom for other kernels (a GPU's fused attention). ``eps`` is ``torch.finfo(dtype).eps``:
2⁻⁷ for bfloat16, 2⁻¹⁰ for float16. A wrong mask or position still shows: it moves the outputs by a sizeable
fraction of their scale, far above the bound (``tests/test_tolerances.py`` checks both sides on CPU).
"""

from __future__ import annotations

import torch

#: fp32 parity bound for model outputs: against transformers, or between kernels computing the same function
OUTPUT_ATOL = 1e-5

#: gradients and large reductions: bound = GRAD_RTOL * max(1, max |reference|)
GRAD_RTOL = 1e-5

#: low precision against the float32 reference: bound = this × layers × eps(dtype) × max(1, max |reference|)
LOW_PRECISION_EPS_PER_LAYER = 8

#: the dtypes :func:`low_precision_atol` has a bound for
LOW_PRECISION_DTYPES = (torch.bfloat16, torch.float16)


def max_abs_diff(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """The largest absolute difference, in float64 (shapes must agree: no broadcasting hides a bug)."""
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    assert actual.shape == expected.shape, f"shapes differ: {tuple(actual.shape)} vs {tuple(expected.shape)}"
    if actual.numel() == 0:
        return 0.0
    return (actual.detach().double() - expected.detach().double()).abs().max().item()


def _where(actual: torch.Tensor, expected: torch.Tensor) -> str:
    """Index and values of the worst element, so that a failure says what moved."""
    diff = (actual.detach().double() - expected.detach().double()).abs()
    flat = int(diff.argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape)) if diff.dim() else ()
    return f"at {index}: {actual.detach().reshape(-1)[flat].item()!r} vs {expected.detach().reshape(-1)[flat].item()!r}"


def assert_close(actual: torch.Tensor, expected: torch.Tensor, *, atol: float = OUTPUT_ATOL, what: str = "") -> None:
    """``max |actual - expected| <= atol``; the failure reports the max abs diff and where it is.

    Args:
        actual: the tensor under test.
        expected: the reference (transformers, or the other kernel).
        atol: the bound; keep the default :data:`OUTPUT_ATOL` unless the comparison is not fp32 model
            output (then say why at the call).
        what: a name for the message (a field, a parameter).
    """
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    diff = max_abs_diff(actual, expected)
    if not diff <= atol:  # also catches NaN
        name = f"{what}: " if what else ""
        raise AssertionError(f"{name}max abs diff {diff:.3g} > {atol:.3g} {_where(actual, expected)}")


def grad_atol(expected: torch.Tensor, rtol: float = GRAD_RTOL) -> float:
    """The bound for a gradient or a reduction: ``rtol * max(1, max |expected|)``."""
    expected = torch.as_tensor(expected)
    scale = expected.detach().abs().max().item() if expected.numel() else 0.0
    return rtol * max(1.0, scale)


def assert_grads_close(
    actual: torch.Tensor, expected: torch.Tensor, *, rtol: float = GRAD_RTOL, what: str = ""
) -> None:
    """Gradients (or a loss summed over many terms) equal within ``rtol`` of the reference's magnitude."""
    assert_close(actual, expected, atol=grad_atol(expected, rtol), what=what)


def assert_identical(actual: torch.Tensor, expected: torch.Tensor, *, what: str = "") -> None:
    """Bit-for-bit equality: only for the same kernel on the same data (say why at the call)."""
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    if not torch.equal(actual, expected):
        if actual.shape != expected.shape:
            detail = f"shapes {tuple(actual.shape)} vs {tuple(expected.shape)}"
        else:
            detail = f"max abs diff {max_abs_diff(actual, expected):.3g}"
        name = f"{what}: " if what else ""
        raise AssertionError(f"{name}not identical ({detail})")


def low_precision_atol(dtype: torch.dtype, expected: torch.Tensor, *, layers: int) -> float:
    """The bound for a ``dtype`` (bfloat16 or float16) run of a ``layers``-layer model against its float32
    reference ``expected``: ``LOW_PRECISION_EPS_PER_LAYER × layers × eps(dtype) × max(1, max |expected|)``.

    Raises:
        ValueError: ``dtype`` is not a low-precision float (float32 outputs use :data:`OUTPUT_ATOL`).
    """
    if dtype not in LOW_PRECISION_DTYPES:
        raise ValueError(f"low_precision_atol: {dtype} is not one of {LOW_PRECISION_DTYPES} (float32: OUTPUT_ATOL)")
    if layers < 1:
        raise ValueError(f"low_precision_atol: layers={layers}; a model has at least one layer")
    expected = torch.as_tensor(expected)
    scale = expected.detach().abs().max().item() if expected.numel() else 0.0
    return LOW_PRECISION_EPS_PER_LAYER * layers * torch.finfo(dtype).eps * max(1.0, scale)


def assert_low_precision_close(
    actual: torch.Tensor, expected: torch.Tensor, *, dtype: torch.dtype, layers: int, what: str = ""
) -> None:
    """A ``dtype`` run (``actual``, any float dtype) within :func:`low_precision_atol` of the float32 reference."""
    assert_close(actual, expected, atol=low_precision_atol(dtype, expected, layers=layers), what=what)
