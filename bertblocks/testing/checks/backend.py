"""Attention backends: softmax attention as the built-in ``eager`` kernel computes it, under every additive mask,
and the capabilities a backend claims (attention weights, causal masking, dropout)."""

from __future__ import annotations

from typing import Any

import torch

from ...core.interfaces import AttentionBackend
from ...registry import Registry
from ..assertions import close, expect, max_abs_diff
from ..inputs import qkv
from ..subject import ConformanceSkip, Subject


def eager_reference(registry: Registry) -> AttentionBackend:
    """The built-in ``eager`` kernel, the reference every backend is compared with unless its plugin gives its
    own (``ConformanceSuite(reference=...)``)."""
    return registry.get("backend", "eager").factory(options=registry.get("backend", "eager").options())


def reference_for(subject: Subject) -> tuple[Any, str]:
    """The kernel ``subject``'s numbers are compared with, and its name for messages: the plugin's own reference
    when the suite was given one, else the built-in ``eager`` kernel (softmax attention)."""
    if subject.reference is not None:
        return subject.reference, "the reference"
    return eager_reference(subject.registry), "eager"


def additive_masks(b: int, h: int, q: int, k: int) -> dict[str, torch.Tensor | None]:
    """The additive masks a backend must take: none, padding ``[b, 1, 1, k]``, a per-query ``[b, 1, q, k]``
    padding mask, and a position-bias-like float term ``[b, h, q, k]`` plus padding."""
    low = torch.finfo(torch.float32).min
    padding = torch.zeros(b, 1, 1, k)
    padding[-1, ..., -3:] = low
    per_query = torch.zeros(b, 1, q, k)
    per_query[0, :, 1, :2] = low
    g = torch.Generator().manual_seed(5)
    bias = torch.randn(b, h, q, k, generator=g) + padding
    return {"no mask": None, "padding [b,1,1,k]": padding, "per-query [b,1,q,k]": per_query, "bias [b,h,q,k]": bias}


def check_backend_eager_equivalence(subject: Subject) -> None:
    """The backend computes what its reference computes (the built-in ``eager`` kernel, softmax attention, unless
    the plugin gave its own) with every kind of additive mask (float32 tolerance)."""
    backend = subject.make()
    reference, ref_name = reference_for(subject)
    query, key, value = qkv()
    for label, mask in additive_masks(2, 4, 7, 7).items():
        kwargs: dict[str, Any] = {"mask": mask, "scale": 8**-0.5, "dropout_p": 0.0, "is_causal": False}
        got, _ = backend(query, key, value, need_weights=False, **kwargs)
        want, _ = reference(query, key, value, need_weights=False, **kwargs)
        expect(
            tuple(got.shape) == tuple(query.shape), f"output shape {tuple(got.shape)} for queries {tuple(query.shape)}"
        )
        close(f"output vs {ref_name} ({label})", got, want)


def check_backend_attention_weights(subject: Subject) -> None:
    """A backend claiming ``attention_weights`` returns post-softmax probabilities ``[b, h, q, k]`` equal to
    eager's; one that does not returns ``None``."""
    backend: AttentionBackend = subject.make()
    query, key, value = qkv()
    mask = additive_masks(2, 4, 7, 7)["bias [b,h,q,k]"]
    kwargs: dict[str, Any] = {"mask": mask, "scale": 8**-0.5, "dropout_p": 0.0, "is_causal": False}
    _, weights = backend(query, key, value, need_weights=True, **kwargs)
    if not backend.capabilities.attention_weights:
        expect(weights is None, "attention_weights=False in the capabilities, yet weights were returned")
        raise ConformanceSkip("the backend does not claim attention_weights (and returned none: correct)")
    expect(weights is not None, "capabilities claim attention_weights, but need_weights=True returned None")
    reference, ref_name = reference_for(subject)
    _, want = reference(query, key, value, need_weights=True, **kwargs)
    expect(want is not None, f"{ref_name} returned no weights to compare with (need_weights=True)")
    close(f"attention weights vs {ref_name}", weights, want)
    if subject.reference is None:  # softmax probabilities; a plugin's own kernel may weigh otherwise (sigmoid)
        close("attention weights rows sum to 1", weights.sum(-1), torch.ones_like(weights[..., 0]))
    output, _ = backend(query, key, value, need_weights=False, **kwargs)
    close(
        "output vs weights @ value (the weights returned are the ones the output is made with)", output, weights @ value
    )


def check_backend_causal(subject: Subject) -> None:
    """A backend claiming ``causal`` matches eager with ``is_causal=True``, and aligns the causal mask
    bottom-right when there are fewer queries than keys (the queries are the last ones, as under a cache)."""
    backend: AttentionBackend = subject.make()
    if not backend.capabilities.causal:
        raise ConformanceSkip("the backend does not claim causal support")
    reference, ref_name = reference_for(subject)
    query, key, value = qkv(q=7, k=7)
    kwargs: dict[str, Any] = {"scale": 8**-0.5, "dropout_p": 0.0, "is_causal": True, "need_weights": False}
    for label, mask in (("no mask", None), ("padding", additive_masks(2, 4, 7, 7)["padding [b,1,1,k]"])):
        full, _ = backend(query, key, value, mask=mask, **kwargs)
        close(f"causal output vs {ref_name} ({label})", full, reference(query, key, value, mask=mask, **kwargs)[0])
        tail, _ = backend(query[:, :, 4:], key, value, mask=mask, **kwargs)
        close(f"last 3 queries over 7 keys vs the full causal pass ({label})", tail, full[:, :, 4:])


def check_backend_dropout(subject: Subject) -> None:
    """A backend claiming ``dropout`` changes its output when ``dropout_p > 0``, reproducibly under a seed."""
    backend: AttentionBackend = subject.make()
    if not backend.capabilities.dropout:
        raise ConformanceSkip("the backend does not claim dropout support")
    query, key, value = qkv()
    kwargs: dict[str, Any] = {"mask": None, "scale": 8**-0.5, "is_causal": False, "need_weights": False}
    plain, _ = backend(query, key, value, dropout_p=0.0, **kwargs)
    torch.manual_seed(7)
    first, _ = backend(query, key, value, dropout_p=0.5, **kwargs)
    torch.manual_seed(7)
    second, _ = backend(query, key, value, dropout_p=0.5, **kwargs)
    expect(max_abs_diff(first, plain) > 1e-3, "dropout_p=0.5 left the output unchanged")
    close("two dropout runs under the same seed", first, second, atol=0.0)


def check_backend_varlen(subject: Subject) -> None:
    """A backend claiming ``varlen`` computes, over packed sequences (``[T, h, d]`` with ``cu_seqlens``), what its
    reference computes for each sequence alone: no token sees another sequence's."""
    backend: AttentionBackend = subject.make()
    if not backend.capabilities.varlen:
        raise ConformanceSkip("the backend does not claim varlen (packed batches are re-padded for it)")
    reference, ref_name = reference_for(subject)
    lengths = (5, 1, 7)
    query, key, value = (x[0].transpose(0, 1) for x in qkv(b=1, q=sum(lengths), k=sum(lengths)))  # [T, h, d]
    cu = torch.tensor([0, 5, 6, 13], dtype=torch.int32)
    got = backend.varlen(query, key, value, cu_seqlens=cu, max_seqlen=max(lengths), scale=8**-0.5, dropout_p=0.0)
    expect(tuple(got.shape) == tuple(query.shape), f"varlen output {tuple(got.shape)} for queries {tuple(query.shape)}")
    for i, (start, stop) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        q, k, v = (x[start:stop].transpose(0, 1)[None] for x in (query, key, value))  # [1, h, n, d]
        want, _ = reference(q, k, v, mask=None, scale=8**-0.5, dropout_p=0.0, is_causal=False, need_weights=False)
        close(
            f"varlen sequence {i} (tokens {start}..{stop - 1}) vs {ref_name} on it alone",
            got[start:stop],
            want[0].transpose(0, 1),
        )
