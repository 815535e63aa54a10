"""The mask contract (docs/plugins/hooks.md, "The mask a backend receives"): what every attention backend is
handed inside a model, on the padded and on the packed path, recorded at the backend and checked call by call."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ...core.interfaces import AttentionBackend
from ...core.masks import is_hidden
from ..assertions import expect
from ..inputs import infer, padded_batch
from ..subject import ConformanceSkip, Subject

#: what CUDA's memory-efficient SDPA kernel multiplies the masked scores by before its ``exp2`` softmax
LOG2E = math.log2(math.e)

#: the kinds that shape what a backend receives: the backend itself, the attention module that calls it, the
#: position scheme whose bias travels in the mask, the layer that passes the mask on
MASK_KINDS: tuple[str, ...] = ("backend", "attention", "position", "layer")


@dataclass
class RecordingBackend(AttentionBackend):
    """Wraps a model's backend, recording what each call receives, and delegates everything."""

    inner: AttentionBackend
    calls: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.name = self.inner.name  # type: ignore[misc]
        self.capabilities = self.inner.capabilities  # type: ignore[misc]

    def __call__(self, query: Any, key: Any, value: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.calls.append({"kind": "padded", "query": query, "key": key, "value": value, **kwargs})
        return self.inner(query, key, value, **kwargs)

    def varlen(self, query: Any, key: Any, value: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.calls.append({"kind": "varlen", "query": query, "key": key, "value": value, **kwargs})
        return self.inner.varlen(query, key, value, **kwargs)

    def accepts_varlen(self, *, dropout_p: float) -> bool:
        return self.inner.accepts_varlen(dropout_p=dropout_p)


def _record(model: nn.Module) -> list[RecordingBackend]:
    """Replace every module's ``backend`` attribute by a recorder; the recorders."""
    recorders = []
    for module in model.modules():
        backend = module.__dict__.get("backend")
        if isinstance(backend, AttentionBackend):
            recorder = RecordingBackend(backend)
            module.backend = recorder
            recorders.append(recorder)
    return recorders


def check_mask_contract(subject: Subject) -> None:
    """Inside a model, on the padded and the packed path, every backend call gets what the contract says.

    ``query [b, h, q, d]``, ``key``/``value [b, h, k, d]`` of the query's dtype; ``mask`` is ``None`` or an
    *additive* float tensor of the query's dtype (never boolean), ``[b|1, h|1, q|1, k]``, finite even scaled by
    ``log2(e)`` in float32 as CUDA's memory-efficient kernel scales it (masked: ``finfo.min / 2``, from
    :func:`~bertblocks.core.masks.hidden_value`; never ``finfo.min`` or ``-inf``), hiding every padded key from every
    query of its row and leaving every real key visible (a position bias adds finite values there). A packed batch
    reaches a ``varlen`` backend as ``[T, h, d]`` with ``cu_seqlens`` of the real lengths; with a score term
    computable per sequence, sequence by sequence (``[n, h, l, d]`` for ``n`` neighbouring sequences of ``l`` real
    tokens, the mask their finite ``[n|1, h|1, l, l]`` term, nothing hidden); else re-padded as above (``b`` rows of
    the padded length).
    """
    batch = padded_batch()
    mask01 = batch["attention_mask"]
    lengths = mask01.sum(-1)
    b, length = mask01.shape
    for path, packing in (("padded", "never"), ("packed", "always")):
        model = subject.on(packing).model()
        recorders = _record(getattr(model, "bert", model))
        if not recorders:
            raise ConformanceSkip("the model's attention modules hold no `backend` attribute to record")
        infer(model, **{k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")})
        calls = [call for recorder in recorders for call in recorder.calls]
        where = f"{path} path (encoder.packing: {packing})"
        expect(bool(calls), f"{where}: no backend was called")
        for n, call in enumerate(calls):
            if packing == "always" and _per_sequence(call, b, length):
                _check_sequence_call(call, f"{where}, backend call {n}", lengths)
            else:
                _check_call(call, f"{where}, backend call {n}", b, length, lengths, mask01)


def _per_sequence(call: dict[str, Any], b: int, length: int) -> bool:
    """A packed call attending a run of sequences rather than the re-padded batch (which has ``b`` rows of the
    padded length ``length``; a padded batch has a shorter row, so no run has that shape)."""
    query = call["query"]
    return call["kind"] == "padded" and query.dim() == 4 and (query.shape[0], query.shape[2]) != (b, length)


def _check_sequence_call(call: dict[str, Any], where: str, lengths: torch.Tensor) -> None:
    """``[n, h, l, d]`` for ``n`` sequences of ``l`` real tokens; the mask, if any, their finite score term."""
    query, key, value, mask = call["query"], call["key"], call["value"], call["mask"]
    n, h, size, _ = query.shape
    expect(
        key.shape[:3] == (n, h, size) and value.shape[:3] == (n, h, size) and key.dtype == value.dtype == query.dtype,
        f"{where}: a per-sequence call's key {tuple(key.shape)} / value {tuple(value.shape)} do not match its query "
        f"{tuple(query.shape)} ([n, h, l, d], the query's dtype)",
    )
    expect(
        int((lengths == size).sum()) >= n,
        f"{where}: a per-sequence call over {n} sequence(s) of {size} tokens, but the batch's real lengths are "
        f"{lengths.tolist()}",
    )
    if mask is None:
        return
    expect(
        mask.is_floating_point() and mask.dtype == query.dtype,
        f"{where}: the mask is {mask.dtype}; it must be additive, in the query's dtype {query.dtype} (never boolean)",
    )
    expect(
        mask.dim() == 4 and mask.shape[0] in (1, n) and mask.shape[1] in (1, h) and mask.shape[2:] == (size, size),
        f"{where}: a per-sequence mask {tuple(mask.shape)} is not [n|1, h|1, l, l] for n={n}, l={size}",
    )
    _expect_finite(mask, where)
    expect(
        not bool(is_hidden(mask).any()),
        f"{where}: a per-sequence call hides a real key (a sequence's own term holds no padding)",
    )


def _expect_finite(mask: torch.Tensor, where: str) -> None:
    """The mask, and the mask as CUDA's memory-efficient kernel scales it (float32, times ``log2(e)``), hold no
    ``-inf`` or NaN: a row hidden at ``finfo.min`` overflows there and gives zeros, not the uniform softmax."""
    expect(bool(torch.isfinite(mask).all()), f"{where}: the mask holds -inf or NaN")
    expect(
        bool(torch.isfinite(mask.float() * LOG2E).all()),
        f"{where}: the mask overflows to -inf when a kernel scales it by log2(e) (CUDA's memory-efficient SDPA), so "
        "a fully hidden row gives zeros there: hide keys with bertblocks.core.masks.hidden_value(dtype) "
        "(finfo.min / 2), not finfo.min",
    )


def _check_call(
    call: dict[str, Any], where: str, b: int, length: int, lengths: torch.Tensor, mask01: torch.Tensor
) -> None:
    query, key, value = call["query"], call["key"], call["value"]
    if call["kind"] == "varlen":
        t = int(lengths.sum())
        expect(
            query.dim() == 3 and query.shape[0] == t,
            f"{where}: varlen query is {tuple(query.shape)}, not [T={t}, h, d]",
        )
        cu = call["cu_seqlens"]
        want = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(cu.dtype)
        expect(
            torch.equal(cu.cpu(), want),
            f"{where}: cu_seqlens {cu.tolist()} do not delimit the real lengths {want.tolist()}",
        )
        return
    expect(query.dim() == 4, f"{where}: query is {tuple(query.shape)}, not [b, h, q, d]")
    expect(
        key.dim() == 4 and value.shape == key.shape and key.dtype == value.dtype == query.dtype,
        f"{where}: key {tuple(key.shape)} {key.dtype} / value {tuple(value.shape)} {value.dtype} for query "
        f"{query.dtype}: must be [b, h, k, d] of the query's dtype",
    )
    expect(query.shape[0] == b, f"{where}: batch {query.shape[0]}, not the padded batch's {b} (packed rows re-padded)")
    mask = call["mask"]
    q, k = query.shape[2], key.shape[2]
    expect(mask is not None, f"{where}: a padded batch reached the backend without a mask")
    expect(
        mask.is_floating_point() and mask.dtype == query.dtype,
        f"{where}: the mask is {mask.dtype}; it must be additive, in the query's dtype {query.dtype} (never boolean)",
    )
    shape_ok = (
        mask.dim() == 4
        and mask.shape[0] in (1, b)
        and mask.shape[1] in (1, query.shape[1])
        and mask.shape[2] in (1, q)
        and mask.shape[3] == k
    )
    expect(shape_ok, f"{where}: mask {tuple(mask.shape)} is not [b|1, h|1, q|1, k] for q={q}, k={k}")
    _expect_finite(mask, where)
    expect(k == length, f"{where}: {k} keys, not the padded length {length}")
    full = mask.expand(b, mask.shape[1], q, k)
    real_rows = mask01.bool()[:, None, :q, None] if q == length else torch.ones(b, 1, q, 1, dtype=torch.bool)
    padded_keys = ~mask01.bool()[:, None, None, :]
    hidden = is_hidden(full)
    expect(
        bool((hidden | ~padded_keys | ~real_rows).all()),
        f"{where}: a padded key is visible to a real query (the mask must hide padding: "
        "bertblocks.core.masks.hidden_value there)",
    )
    expect(
        bool((~hidden | padded_keys | ~real_rows).all()),
        f"{where}: a real key is hidden from a real query of its row (a bias must stay finite and far above "
        "finfo.min / 4)",
    )
