"""Cost of one model at one input shape: parameters, FLOPs, forward latency and peak memory.

Peak memory is the largest total of tensor bytes alive during one forward pass *above* what was alive
before it (activations and outputs; the weights are already there), read from the allocation and free
events of PyTorch's CPU memory profiler (``torch.profiler`` with ``profile_memory=True``). It counts
tensors only (not the Python interpreter or allocator slack, which an RSS delta would mix in), and it is
exact and repeatable for a given model and shape, so variants compare cleanly.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from bertblocks.config import BertConfig

from .flops import analytic_flops_per_token, counted_flops


def unique_parameters(model: nn.Module) -> int:
    """Parameters counted once each (a tied weight is one tensor)."""
    return sum(p.numel() for p in model.parameters())


def used_parameters(model: nn.Module, config: BertConfig, seq_len: int) -> int:
    """Parameters that a forward pass over ``seq_len`` tokens reaches: all of them but the rows that receive
    no gradient, such as the rows of a 512-row position table (or a ``2·512 − 1``-row distance table) beyond
    what ``seq_len`` tokens index, or the token-type row of segment 1 when no segment ids are given. The
    vocabulary's rows are always counted (which of them are reached depends on the text, not the model).

    One forward and backward pass on a single sequence of random ids, in eval mode (no dropout).
    """
    was_training = model.training
    model.eval()
    model.zero_grad(set_to_none=True)
    ids = torch.randint(0, config.vocab_size, (1, seq_len), generator=torch.Generator().manual_seed(0))
    with torch.enable_grad():
        out = model(ids)
        values = out if isinstance(out, tuple) else out.to_tuple()
        # every output (the pooler's too), so that whatever produces one is reached
        tensors = [t for t in values if isinstance(t, torch.Tensor) and t.is_floating_point()]
        sum(t.float().square().sum() for t in tensors).backward()  # type: ignore[union-attr]
    unused = 0
    for param in model.parameters():
        if param.dim() < 2 or param.shape[0] == config.vocab_size:
            continue
        if param.grad is None:  # not on the path of the forward pass at all (e.g. a layer skipped)
            unused += param.numel()
            continue
        untouched = (param.grad.flatten(1) == 0).all(dim=1)
        unused += int(untouched.sum()) * param[0].numel()
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return unique_parameters(model) - unused


def forward_latency_ms(model: nn.Module, ids: torch.Tensor, repeats: int, warmup: int) -> list[float]:
    """Wall time of each of ``repeats`` forward passes (inference mode), after ``warmup`` untimed ones."""
    model.eval()
    times = []
    with torch.inference_mode():
        for _ in range(warmup):
            model(ids)
        for _ in range(repeats):
            start = time.perf_counter()
            model(ids)
            times.append((time.perf_counter() - start) * 1e3)
    return times


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    # The profiler's C++ side prints start/stop lines straight to file descriptor 2; they would break the
    # progress bar. Python-level errors still propagate as exceptions.
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def peak_forward_bytes(model: nn.Module, ids: torch.Tensor) -> int:
    """Peak tensor bytes allocated during one forward pass above those alive before it (see module doc)."""
    model.eval()
    activity = torch.profiler.ProfilerActivity.CPU
    with (
        _quiet_stderr(),
        torch.profiler.profile(activities=[activity], profile_memory=True) as prof,
        torch.inference_mode(),
    ):
        model(ids)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    current = peak = 0
    for event in events:
        current += event.nbytes()  # negative for a free
        peak = max(peak, current)
    return peak


def measure_costs(model: nn.Module, config: BertConfig, spec: Any) -> dict[str, Any]:
    """The costs ``spec.metrics`` asks for (a :class:`~bertblocks.ablation.study.MeasureSpec`)."""
    out: dict[str, Any] = {}
    ids = torch.randint(0, config.vocab_size, (spec.batch, spec.seq_len), generator=torch.Generator().manual_seed(0))
    if "params" in spec.metrics:
        out["params"] = unique_parameters(model)
    if "flops" in spec.metrics:
        estimate = analytic_flops_per_token(config, spec.seq_len)
        out["flops_per_token"] = estimate.per_token
        out["flops_per_token_counted"] = counted_flops(model, spec.batch, spec.seq_len, config.vocab_size) / (
            spec.batch * spec.seq_len
        )
        if estimate.note:
            out["flops_note"] = estimate.note
    if "latency" in spec.metrics:
        times = forward_latency_ms(model, ids, spec.repeats, spec.warmup)
        out["latency_ms"] = statistics.median(times)
    if "memory" in spec.metrics:
        out["peak_mem_mib"] = peak_forward_bytes(model, ids) / 2**20
    return out
