"""Comparisons that raise :class:`~bertblocks.testing.subject.ConformanceError` saying what differed and by
how much: the building blocks of every check (and of a plugin's own checks)."""

from __future__ import annotations

from typing import Any

import torch

from .subject import ATOL, ConformanceError

#: output fields that are not the component's answer (passed through, or needing labels)
_NOT_COMPARED = ("loss", "hidden_states", "attentions", "cross_attentions", "past_key_values")


def float_outputs(out: Any) -> dict[str, torch.Tensor]:
    """The floating-point output tensors by field name (``last_hidden_state``, ``pooler_output``, ``logits``, …)."""
    return {
        k: v for k, v in out.items() if k not in _NOT_COMPARED and isinstance(v, torch.Tensor) and v.is_floating_point()
    }


def real_positions(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token outputs (leading shape = the mask's) at real positions only: padded positions have no defined
    value (an unpadded path may leave zeros there). Sequence-level outputs whole."""
    if x.shape[: mask.dim()] == mask.shape:
        return x[mask.bool()]
    return x


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest absolute difference (in float64); tensors of different shapes are a failure."""
    if a.shape != b.shape:
        raise ConformanceError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def close(what: str, got: torch.Tensor, want: torch.Tensor, atol: float = ATOL) -> None:
    """Fail, naming ``what`` and the difference, unless ``got`` is within ``atol`` of ``want`` everywhere."""
    diff = max_abs_diff(got, want)
    if not diff <= atol:  # also catches NaN
        raise ConformanceError(f"{what}: max abs difference {diff:.3g} > {atol:g}")


def close_outputs(what: str, got: Any, want: Any, mask: torch.Tensor, atol: float = ATOL) -> None:
    """Two model outputs have the same floating-point fields, each close at the real positions of ``mask``."""
    mine, theirs = float_outputs(got), float_outputs(want)
    expect(mine.keys() == theirs.keys(), f"{what}: output fields differ ({sorted(mine)} vs {sorted(theirs)})")
    for name, value in mine.items():
        close(f"{what} ({name})", real_positions(value, mask), real_positions(theirs[name], mask), atol)


def expect(condition: bool, message: str) -> None:
    """Fail with ``message`` unless ``condition`` holds."""
    if not condition:
        raise ConformanceError(message)
