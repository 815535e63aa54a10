"""Position schemes: the shapes of what they add, biases and rotations consistent under a KV cache offset, and
positions that restart per sequence in a packed batch."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ...core.interfaces import ModelDims, PositionBias, Positions, PositionScheme
from ..assertions import close, close_outputs, expect, max_abs_diff
from ..inputs import infer, padded_batch, qkv
from ..subject import ConformanceSkip, Subject

#: the sizes a scheme is told (``model``) where the checks make it directly: 4 heads of 8 (hidden 32), 64 positions
_DIMS = ModelDims(hidden_size=32, num_heads=4, num_layers=2, layer_norm_eps=1e-12, hidden_dropout=0.0, max_positions=64)


def check_position_scheme(subject: Subject) -> None:
    """The scheme's modules have the documented shapes, and its attention bias for queries after a cache is
    the matching rows of the bias over the whole sequence (what makes it correct under a KV cache)."""
    scheme: PositionScheme = subject.make(max_positions=64, model=_DIMS)
    expect(isinstance(scheme, PositionScheme), f"factory returned {type(scheme).__name__}, not a PositionScheme")
    table = scheme.embedding(32)
    if table is not None:
        ids = torch.arange(9)[None].expand(3, 9)
        emb = table(ids)
        expect(tuple(emb.shape) == (3, 9, 32), f"position embedding of [3, 9] ids is {tuple(emb.shape)}")
    shared = scheme.shared_bias(4)
    if shared is not None:
        for dtype in (torch.float32, torch.float64):
            whole = shared(Positions.contiguous(9, 0, torch.device("cpu")), dtype)
            expect(
                whole.dim() == 4 and whole.shape[1:] == (4, 9, 9) and whole.shape[0] in (1, 3),
                f"shared bias for 4 heads over 9 tokens must be [1|b, 4, 9, 9]; got {tuple(whole.shape)}",
            )
            expect(whole.dtype == dtype, f"shared bias is {whole.dtype} when {dtype} was asked")
            tail = shared(Positions.contiguous(4, 5, torch.device("cpu")), dtype)
            close(
                f"shared bias of 4 queries after 5 cached keys vs rows 5.. of the whole ({dtype})",
                tail,
                whole[:, :, 5:],
            )
    bias = scheme.attention_bias(4, 8)
    expect(
        (bias is not None) == scheme.adds_score_bias,
        f"adds_score_bias is {scheme.adds_score_bias} but attention_bias returned "
        f"{'a bias' if bias is not None else 'None'}: declare what the scheme contributes",
    )
    if bias is None:
        if table is None and shared is None and scheme.layer_terms(0, 4, 8).rotary is None:
            raise ConformanceSkip("the scheme adds no embedding, no score bias and no rotation")
        return
    for dtype in (torch.float32, torch.float64):
        query, key, _ = qkv(b=2, h=4, q=9, k=9, dtype=dtype)
        call = _bias_call(scheme, bias, dtype)
        full = call(query, key, 9, 0)
        expect(full.dim() == 4, f"bias must be 4-D [b|1, h|1, q, k]; got {tuple(full.shape)}")
        expect(
            all(n in (1, want) for n, want in zip(full.shape, (2, 4, 9, 9), strict=True)) and full.shape[-2:] == (9, 9),
            f"bias of shape {tuple(full.shape)} does not broadcast to [b, h, q, k] = [2, 4, 9, 9]",
        )
        expect(full.dtype == dtype, f"bias is {full.dtype} for {dtype} queries")
        tail = call(query[:, :, 5:], key, 4, 5)
        close(f"bias of 4 queries after 5 cached keys vs rows 5.. of the full bias ({dtype})", tail, full[:, :, 5:])
    if bias.packs_per_sequence():
        _check_packed_term(scheme, bias)


def _check_packed_term(scheme: PositionScheme, bias: PositionBias) -> None:
    """A term's packed form (:meth:`PositionBias.packed_term`, what a compiled graph hands its varlen op) gathers,
    for each packed sequence, the term :meth:`~PositionBias.sequence_terms` gives, and the term of the same sequence
    left-padded in its row (a compiled graph packs any padding side): lengths 7, 3, 3 of a batch padded to 7."""
    from ...plugins.varlen.biased import run_mask  # the op's own gathering

    dtype, length, h, d = torch.float64, 7, 4, 8
    terms = scheme.shared_terms(_DIMS)
    extra = {"projections": _Projections(dtype)} if bias.reads_projections else {}
    positions = Positions.contiguous(length, 0, torch.device("cpu"))
    if terms:
        positions = replace(positions, shared={t.produces: t(positions, dtype) for t in terms})
    g = torch.Generator().manual_seed(6)
    query, key = (torch.randn(13, h, d, generator=g, dtype=dtype) for _ in range(2))  # [T, h, d]
    with torch.no_grad():
        packed = bias.packed_term(query, key, positions, **extra)
        if packed is None:
            return
        sequence = bias.sequence_terms(query, key, positions, **extra)
        for start, count, size in ((0, 1, 7), (7, 2, 3)):
            got = run_mask(start, count, size, 1.0, packed.index, packed.rows, packed.cols, packed.fixed)
            if got is None:
                continue
            got = got.expand(count, h, size, size)
            want = sequence(start, count, size).expand(count, h, size, size)
            close(f"packed_term vs sequence_terms, {count} sequence(s) of {size}", got, want)
            for i in range(count):
                span = slice(start + i * size, start + (i + 1) * size)
                # the sequence at the end of a row of `length` (left padding): its term is the bottom-right corner
                q, k = (torch.zeros(1, h, length, d, dtype=dtype) for _ in range(2))
                q[0, :, length - size :], k[0, :, length - size :] = (
                    query[span].transpose(0, 1),
                    key[span].transpose(0, 1),
                )
                whole = bias(q, k, positions, **extra)[0].expand(h, length, length)
                close(
                    f"packed_term vs the term of a left-padded row, a sequence of {size}",
                    got[i],
                    whole[:, length - size :, length - size :],
                )


class _Projections(nn.Module):
    """A layer's query and key projections [.., 32] → [.., 4·8], for terms that read them."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.query_weight = nn.Parameter(torch.randn(32, 32, generator=g, dtype=dtype) / 6)
        self.key_weight = nn.Parameter(torch.randn(32, 32, generator=g, dtype=dtype) / 6)

    def project_query(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states @ self.query_weight.T

    def project_key(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states @ self.key_weight.T


def _bias_call(scheme: PositionScheme, bias: PositionBias, dtype: torch.dtype) -> Any:
    """``call(query, key, q, past)``: the bias as an attention of 4 heads of 8 (hidden 32) calls it, with the
    values the scheme's shared terms compute once per pass (:meth:`PositionScheme.shared_terms`) and, for a term
    that declares ``reads_projections``, the layer's projections."""
    terms = scheme.shared_terms(_DIMS)
    extra = {"projections": _Projections(dtype)} if bias.reads_projections else {}

    def call(query: torch.Tensor, key: torch.Tensor, q: int, past: int) -> torch.Tensor:
        positions = Positions.contiguous(q, past, query.device)
        if terms:
            positions = replace(positions, shared={t.produces: t(positions, dtype) for t in terms})
        with torch.no_grad():
            return bias(query, key, positions, **extra)

    return call


def _rotary_of(subject: Subject) -> Any:
    scheme: PositionScheme = subject.make(max_positions=64, model=_DIMS)
    rotary = scheme.layer_terms(0, 4, 8).rotary
    if rotary is None:
        raise ConformanceSkip("the scheme does not rotate queries and keys")
    return rotary


def check_rotary_shift_invariance(subject: Subject) -> None:
    """A rotation makes scores depend on positions only through their difference: shifting every position by
    the same amount (a cache offset, a later packed sequence) leaves ``q·k`` unchanged, while a rotation that
    ignored positions would be caught by the second half (scores at other distances must differ)."""
    rotary = _rotary_of(subject)
    g = torch.Generator().manual_seed(4)
    for dtype in (torch.float32, torch.float64):
        query, key = (torch.randn(2, 9, 4, 8, generator=g).to(dtype) for _ in range(2))  # [B, t, h, d]
        base = torch.arange(9)[None].expand(2, 9)
        with torch.no_grad():
            q0, k0 = rotary(query, key, base)
            q1, k1 = rotary(query, key, base + 17)
            expect(q0.shape == query.shape and k0.shape == key.shape, "rotation changed the shape of q or k")
            expect(q0.dtype == dtype, f"rotation of {dtype} queries returned {q0.dtype}")
            scores = torch.einsum("bqhd,bkhd->bhqk", q0, k0)
            close(
                f"scores with every position shifted by 17 ({dtype})", torch.einsum("bqhd,bkhd->bhqk", q1, k1), scores
            )
            q2, k2 = rotary(query, key, base.flip(-1))
            expect(
                max_abs_diff(torch.einsum("bqhd,bkhd->bhqk", q2, k2), scores) > 1e-3,
                "reversing the positions left every score unchanged: the rotation ignores positions",
            )


def check_position_cache_chunks(subject: Subject) -> None:
    """As a decoder, feeding the sequence through the KV cache in chunks of 1, of 3, and all at once gives what
    one pass gives: positions continue exactly after the cache, whatever the chunk size."""
    model = subject.decoder()  # skips when the component refuses to be a decoder
    ids = padded_batch(b=2, length=8)["input_ids"]
    full = infer(model, input_ids=ids).last_hidden_state
    for size in (1, 3, ids.shape[1]):
        cache, pieces = None, []
        for start in range(0, ids.shape[1], size):
            out = infer(model, input_ids=ids[:, start : start + size], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            pieces.append(out.last_hidden_state)
        close(f"chunks of {size} through the cache vs one pass", torch.cat(pieces, dim=1), full)


def check_packed_positions(subject: Subject) -> None:
    """A padded batch run packed (``encoder.packing: always``: real tokens laid end to end, each sequence's
    positions restarting at 0) equals the padded run at every real position, with default and with explicit
    ``position_ids``."""
    model = subject.model()
    cfg = subject.config()
    cfg["encoder"]["packing"] = "always"
    packed = subject.model(config=cfg)
    packed.load_state_dict(model.state_dict())
    cfg["encoder"]["packing"] = "never"
    padded = subject.model(config=cfg)
    padded.load_state_dict(model.state_dict())
    inputs = padded_batch()
    # rows spaced differently: a scheme that dropped them (or took the packed index for a position) shows it
    explicit = {**inputs, "position_ids": torch.arange(9)[None] * torch.tensor([[1], [2], [3]])}
    for label, batch in (("default positions", inputs), ("explicit position_ids", explicit)):
        close_outputs(
            f"packed vs padded batch ({label})",
            infer(packed, **batch),
            infer(padded, **batch),
            inputs["attention_mask"],
        )
