"""The varlen kernels against their reference, the per-sequence SDPA calls (``varlen/sdpa.py``): flex
(``varlen/flex.py``: the same numbers on every device the machine has, its score-modification hook, one block mask per
forward pass), FlashAttention's (``varlen/flash.py``: bfloat16 on CUDA; its re-padded fallback in float32), and the
per-device choice made when the backend is built (``varlen/kernels.py``)."""

from __future__ import annotations

import itertools

import pytest
import torch

import bertblocks
from bertblocks.config import ConfigError
from bertblocks.plugins import backends
from bertblocks.plugins.varlen import kernels
from bertblocks.plugins.varlen.flash import flash_serves, flash_varlen_attention, repadded_varlen_attention
from bertblocks.plugins.varlen.flex import PackedIndex, flex_serves, flex_varlen_attention
from bertblocks.plugins.varlen.sdpa import sdpa_per_sequence
from tests.conftest import TINY, to_device
from tests.tolerances import assert_close, assert_low_precision_close

LENGTHS = [5, 1, 7, 7, 3, 12]  # a single token, a run of equal lengths, the longest last


def _packed(device: str, heads: int = 4, dim: int = 16) -> tuple[torch.Tensor, ...]:
    """Random packed heads of :data:`LENGTHS` (16 wide: the narrowest flex's GPU kernel takes)."""
    g = torch.Generator().manual_seed(0)
    tokens = sum(LENGTHS)
    q, k, v = (torch.randn(tokens, heads, dim, generator=g).to(device) for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return q, k, v, cu


def test_packed_index_gives_each_token_its_sequence_and_position():
    cu = torch.tensor([0, 2, 2, 5], dtype=torch.int32)  # an empty sequence in between adds no token
    index = PackedIndex.from_cu_seqlens(cu, 5)
    assert index.document.tolist() == [0, 0, 2, 2, 2]
    assert index.position.tolist() == [0, 1, 0, 1, 2]


def test_flex_equals_the_per_sequence_reference(device):
    q, k, v, cu = _packed(device)
    scale = 16**-0.5
    assert_close(flex_varlen_attention(q, k, v, cu, scale), sdpa_per_sequence(q, k, v, cu, scale))


def test_a_score_modification_sees_positions_within_each_sequence(device):
    """An ALiBi-style bias ``-slope[h]·|i - j|`` by positions within the sequence, through the hook, equals the
    written-out attention of each sequence alone with that bias (what a score-bias scheme will pass)."""
    q, k, v, cu = _packed(device)
    scale = 16**-0.5
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=device)

    def alibi(index: PackedIndex):
        def score_mod(score, b, h, q_idx, kv_idx):
            return score - slopes[h] * (index.position[q_idx] - index.position[kv_idx]).abs()

        return score_mod

    got = flex_varlen_attention(q, k, v, cu, scale, score_mod=alibi)
    bounds = cu.tolist()
    for start, stop in itertools.pairwise(bounds):
        qs, ks, vs = (x[start:stop].transpose(0, 1) for x in (q, k, v))  # [h, l, d]
        pos = torch.arange(stop - start, device=device)
        bias = -slopes[:, None, None] * (pos[:, None] - pos[None, :]).abs()  # [h, l, l]
        expected = torch.softmax(qs @ ks.transpose(-1, -2) * scale + bias, dim=-1) @ vs
        assert_close(got[start:stop], expected.transpose(0, 1), what=f"sequence at {start}")
    # the bias matters: without it the outputs differ far beyond the tolerance
    assert (flex_varlen_attention(q, k, v, cu, scale) - got).abs().max() > 1e-2


def _tiny(kernel: str, dropout: float = 0.1) -> torch.nn.Module:
    torch.manual_seed(0)
    # 2 heads of 16 (flex's GPU kernel takes no narrower heads)
    attention = {"num_heads": 2, "dropout": dropout, "backend": {"name": "sdpa", "varlen_kernel": kernel}}
    config = {
        **TINY,
        "initializer_range": 0.2,
        "hidden_dropout_prob": dropout,
        "encoder": {**TINY["encoder"], "attention": attention},
    }
    return bertblocks.create_model(config, ["encoder.packing=always"])


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    mask = (torch.arange(12)[None, :] < torch.tensor([12, 5, 9, 2])[:, None]).long()
    return {"input_ids": torch.randint(1, 99, (4, 12), generator=g), "attention_mask": mask}


def test_a_packed_model_on_flex_equals_per_sequence_with_one_block_mask_per_pass(device, monkeypatch):
    flex, reference = _tiny("flex").to(device).eval(), _tiny("per_sequence").to(device).eval()
    assert flex.encoder.layer[0].attention.backend.varlen_kernels == {"cpu": "flex", "cuda": "flex"}
    calls, masks = [], []
    monkeypatch.setattr(
        kernels, "flex_varlen_attention", lambda *a, **k: calls.append(1) or flex_varlen_attention(*a, **k)
    )
    from torch.nn.attention import flex_attention as flex_module

    create = flex_module.create_block_mask
    monkeypatch.setattr(flex_module, "create_block_mask", lambda *a, **k: masks.append(1) or create(*a, **k))
    x = to_device(_batch(), device)
    real = x["attention_mask"].bool()
    with torch.no_grad():
        got, expected = flex(**x).last_hidden_state, reference(**x).last_hidden_state
        flex(**x)  # a second batch (the same values, a new cu_seqlens tensor): a new mask
    assert len(calls) == 2 * 2  # every layer of both passes went through flex
    assert len(masks) == 2  # one block mask per pass, shared by the layers
    assert_close(got[real], expected[real])
    assert (got[~real] == 0).all()


def test_flex_hands_dropout_to_the_per_sequence_kernel(monkeypatch):
    """flex has no dropout: a training step with attention dropout runs the per-sequence kernel."""
    model = _tiny("flex").train()
    monkeypatch.setattr(kernels, "flex_varlen_attention", lambda *a, **k: pytest.fail("flex ran with dropout"))
    out = model(**_batch()).last_hidden_state
    out.sum().backward()
    assert model.encoder.layer[0].attention.self.query.weight.grad is not None


def test_flex_hands_cpu_gradients_and_narrow_gpu_heads_to_the_per_sequence_kernel():
    """flex has no CPU backward, and its GPU kernel takes heads of 16 or more: those calls go per sequence."""
    q, k, v, _ = _packed("cpu")
    assert flex_serves(q, k, v, 0.0)
    assert not flex_serves(q, k, v, 0.1)  # dropout
    with torch.no_grad():
        assert flex_serves(q.requires_grad_(), k, v, 0.0)
    assert not flex_serves(q, k, v, 0.0)  # q needs a gradient
    narrow, wide = torch.empty(3, 2, 8, device="meta"), torch.empty(3, 2, 16, device="meta")
    assert not flex_serves(narrow, narrow, narrow, 0.0)
    assert flex_serves(wide, wide, wide, 0.0)
    model = _tiny("flex", dropout=0.0).train()  # no dropout: only the CPU backward keeps flex out
    out = model(**_batch()).last_hidden_state
    out.sum().backward()  # flex would raise "does not support backward on CPU"
    assert model.encoder.layer[0].attention.self.query.weight.grad is not None


def test_the_kernel_is_chosen_per_device_when_built(monkeypatch):
    assert kernels.varlen_kernels("auto") == {
        "cpu": "per_sequence",
        "cuda": "flash",
    }  # measured: docs/explanation/performance.md
    assert kernels.varlen_kernels("per_sequence") == {"cpu": "per_sequence", "cuda": "per_sequence"}
    assert _tiny("auto").encoder.layer[0].attention.backend.varlen_kernels["cpu"] == "per_sequence"
    monkeypatch.setattr(kernels, "flash_available", lambda: False)
    # a torch without varlen_attn
    assert kernels.varlen_kernels("auto") == {"cpu": "per_sequence", "cuda": "per_sequence"}
    monkeypatch.setattr(backends, "flex_available", lambda: False)
    with pytest.raises(ConfigError, match=r"encoder\.attention\.backend.*varlen_kernel.*flex needs"):
        _tiny("flex")


def test_flash_serves_half_precision_cuda_calls_only():
    """FlashAttention's varlen kernel takes CUDA float16/bfloat16 without dropout, heads up to 256 in steps of 8;
    everything else goes to the per-sequence calls (float32 on a GPU, every CPU call, dropout, a compiled graph)."""
    cpu = torch.empty(3, 2, 16, dtype=torch.bfloat16)
    assert not flash_serves(cpu, cpu, cpu, 0.0)  # a CPU
    if not torch.cuda.is_available():
        return
    half, full = (torch.empty(3, 2, 16, dtype=dt, device="cuda") for dt in (torch.bfloat16, torch.float32))
    assert flash_serves(half, half, half, 0.0)
    assert not flash_serves(full, full, full, 0.0)
    assert not flash_serves(half, half, half, 0.1)
    odd = torch.empty(3, 2, 12, dtype=torch.bfloat16, device="cuda")
    assert not flash_serves(odd, odd, odd, 0.0)


def test_flash_equals_the_per_sequence_reference_forward_and_backward(device):
    """One FlashAttention launch gives each sequence what its own SDPA call gives, and the same gradients: in
    bfloat16 on a GPU (within its bound), and on a CPU, where the per-sequence calls run it (exactly those)."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q, k, v, cu = (x.to(dtype) if x.is_floating_point() else x for x in _packed(device))
    scale = 16**-0.5
    got_in = [x.clone().requires_grad_() for x in (q, k, v)]
    ref_in = [x.clone().requires_grad_() for x in (q, k, v)]
    got = flash_varlen_attention(*got_in, cu, scale, 0.0, max(LENGTHS))
    expected = sdpa_per_sequence(*ref_in, cu, scale)
    grad = torch.randn_like(got)
    got.backward(grad)
    expected.backward(grad)
    grads = [(a.grad, b.grad, f"d{n}") for a, b, n in zip(got_in, ref_in, "qkv", strict=True)]
    pairs = [(got, expected, "output"), *grads]
    for actual, reference, what in pairs:
        if device == "cpu":
            torch.testing.assert_close(actual, reference, rtol=0, atol=0, msg=what)  # the same kernel: exact
        else:
            assert_low_precision_close(actual.float(), reference.float(), dtype=dtype, layers=1, what=what)


def test_the_repadded_fallback_equals_the_per_sequence_reference_and_takes_dropout(device):
    """Where FlashAttention cannot serve a GPU call (float32, dropout), the kernel re-pads it to one masked SDPA
    launch: the same outputs and gradients as the per-sequence calls (float32, the tolerance policy), and dropout
    applies (a different kernel: within the policy, not exact)."""
    q, k, v, cu = _packed(device)
    scale = 16**-0.5
    got_in = [x.clone().requires_grad_() for x in (q, k, v)]
    ref_in = [x.clone().requires_grad_() for x in (q, k, v)]
    got = repadded_varlen_attention(*got_in, cu, scale, 0.0, max(LENGTHS))
    expected = sdpa_per_sequence(*ref_in, cu, scale)
    assert_close(got, expected, what="output")
    grad = torch.randn_like(got)
    got.backward(grad)
    expected.backward(grad)
    for a, b, name in zip(got_in, ref_in, "qkv", strict=True):
        assert_close(a.grad, b.grad, what=f"d{name}")
    torch.manual_seed(0)
    dropped = repadded_varlen_attention(q, k, v, cu, scale, 0.5, max(LENGTHS))
    assert (dropped - expected.detach()).abs().max() > 1e-2  # dropout reached the probabilities
    # an empty sequence in the batch adds no token and no NaN
    cu_empty = torch.tensor([0, 5, 5, *cu[2:].tolist()], dtype=torch.int32, device=device)
    assert torch.isfinite(repadded_varlen_attention(q, k, v, cu_empty, scale, 0.0)).all()
