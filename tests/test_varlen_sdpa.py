"""The SDPA backend's varlen path: packed sequences attend one unmasked call each, eagerly and compiled."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

import bertblocks
from bertblocks.plugins.backends import SdpaBackend
from bertblocks.plugins.varlen import sdpa
from tests.conftest import TINY
from tests.tolerances import assert_close, assert_grads_close

NO_DROPOUT = ["hidden_dropout_prob=0", "encoder.attention.dropout=0"]


def _pair(overrides: list[str] | None = None):
    """The same weights twice: padded (``packing: never``) and packed (``packing: always``)."""
    torch.manual_seed(0)
    base = {**TINY, "initializer_range": 0.2}
    padded = bertblocks.create_model(base, ["encoder.packing=never", *(overrides or [])])
    packed = bertblocks.create_model(base, ["encoder.packing=always", *(overrides or [])])
    packed.load_state_dict(padded.state_dict())
    return padded, packed


def _batch(mask_rows: list[list[int]], seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor(mask_rows)
    return {"input_ids": torch.randint(1, TINY["vocab_size"], mask.shape, generator=g), "attention_mask": mask}


def _masked_reference(q, k, v, lengths, scale):
    """Re-padded, masked SDPA over the same packed tokens: what the varlen kernel must equal."""
    out = torch.zeros_like(q)
    start = 0
    longest = max(lengths)
    for n in lengths:
        if n:
            pad = torch.zeros(longest - n, *q.shape[1:])
            qs, ks, vs = (torch.cat([x[start : start + n], pad]).transpose(0, 1)[None] for x in (q, k, v))
            mask = torch.zeros(1, 1, 1, longest).masked_fill(torch.arange(longest) >= n, float("-inf"))
            out[start : start + n] = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale)[0][
                :, :n
            ].transpose(0, 1)
        start += n
    return out


def test_equal_length_neighbours_form_one_run():
    cu = torch.tensor([0, 3, 6, 6, 9, 11, 13, 17], dtype=torch.int32)  # lengths 3, 3, 0, 3, 2, 2, 4
    assert sdpa.equal_length_runs(cu) == [(0, 3, 3), (9, 2, 2), (13, 1, 4)]


@pytest.mark.parametrize("lengths", [[5, 0, 3, 1, 7], [3, 3, 0, 3, 2, 2, 4], [6, 6, 6]])
def test_per_sequence_kernel_equals_masked_attention_and_skips_empty_rows(lengths):
    torch.manual_seed(0)
    t = sum(lengths) + 1  # one stand-in token past the last sequence (a compiled empty batch): zeros
    q, k, v = (torch.randn(t, 2, 8, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    out = sdpa.sdpa_per_sequence(q, k, v, cu, scale=0.3)
    ref = _masked_reference(q, k, v, lengths, scale=0.3)
    assert_close(out, ref)
    assert (out[-1] == 0).all()
    # gradients flow through the eager loop as through the masked computation
    (g_out,) = torch.autograd.grad(out.square().sum(), [q])
    (g_ref,) = torch.autograd.grad(ref.square().sum(), [q])
    assert_grads_close(g_out, g_ref)


def test_custom_op_passes_torch_library_checks():
    """Schema, fake (symbolic shapes) and autograd registration of the op the compiled graph calls."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(11, 2, 8, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 2, 2, 5, 8, 11], dtype=torch.int32)  # lengths 2, 0, 3, 3, 3: a run of three
    torch.library.opcheck(torch.ops.bertblocks.sdpa_varlen.default, (q, k, v, cu, 0.25))
    out = torch.ops.bertblocks.sdpa_varlen(q, k, v, cu, 0.25)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    q2, k2, v2 = (x.detach().requires_grad_() for x in (q, k, v))
    expected = torch.autograd.grad(sdpa.sdpa_per_sequence(q2, k2, v2, cu, 0.25).sum(), (q2, k2, v2))
    for got, want in zip(grads, expected, strict=True):
        assert_grads_close(got, want)


def test_packed_sdpa_model_attends_per_sequence_and_equals_padded(monkeypatch):
    calls = []
    kernel = sdpa.sdpa_per_sequence
    monkeypatch.setattr(sdpa, "sdpa_per_sequence", lambda *a, **kw: calls.append(1) or kernel(*a, **kw))
    padded, packed = _pair()
    inputs = _batch([[1] * 9, [1] * 4 + [0] * 5, [1] * 1 + [0] * 8, [1] * 6 + [0] * 3])
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        a = padded.eval()(**inputs).last_hidden_state
        b = packed.eval()(**inputs).last_hidden_state
    assert len(calls) == TINY["encoder"]["num_layers"]  # the varlen path, not a re-padded call
    assert_close(b[real], a[real])


def test_a_subclass_that_changes_the_padded_kernel_is_not_bypassed_by_varlen():
    class Scaled(SdpaBackend):
        def __call__(self, query, key, value, **kwargs):
            out, weights = super().__call__(query, key, value, **kwargs)
            return out * 2, weights

    class ScaledVarlen(Scaled):
        def varlen(self, query, key, value, **kwargs):
            return super().varlen(query, key, value, **kwargs) * 2

    assert SdpaBackend().accepts_varlen(dropout_p=0.1)
    assert not Scaled().accepts_varlen(dropout_p=0.0)
    assert ScaledVarlen().accepts_varlen(dropout_p=0.0)


def test_export_keeps_to_standard_ops(monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    assert not SdpaBackend().accepts_varlen(dropout_p=0.0)


def test_compiled_training_with_dropout_stays_on_the_padded_path(monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not SdpaBackend().accepts_varlen(dropout_p=0.1)  # the op's backward recomputes: dropout would differ
    assert SdpaBackend().accepts_varlen(dropout_p=0.0)
    with pytest.raises(ValueError, match="takes no dropout"):
        sdpa.varlen_attention(*(torch.zeros(2, 1, 4) for _ in range(3)), torch.tensor([0, 2]), 1.0, 0.1)


@pytest.fixture
def capture_dynamic_sizes():
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        yield
    torch._dynamo.reset()


def _graph_recorder(graphs: list[str]):
    def backend(gm: torch.fx.GraphModule, example_inputs):
        graphs.append(str(gm.graph))
        return gm.forward

    return backend


@pytest.mark.compile
def test_compiled_varlen_is_one_op_in_the_graph_for_any_padding_pattern(capture_dynamic_sizes):
    """Left padding and holes: a compiled model packs every mask, and each row's real tokens attend together."""
    padded, packed = _pair()
    graphs: list[str] = []
    compiled = torch.compile(packed.eval(), fullgraph=True, dynamic=True, backend=_graph_recorder(graphs))
    inputs = _batch([[0, 0, 1, 1, 1, 1], [1, 0, 1, 1, 0, 1], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1]], seed=3)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        a = padded.eval()(**inputs).last_hidden_state
        b = compiled(**inputs).last_hidden_state
    assert len(graphs) == 1
    assert "bertblocks.sdpa_varlen" in graphs[0]
    assert_close(b[real], a[real])


@pytest.mark.compile
def test_compiled_packed_training_step_gives_the_padded_gradients(capture_dynamic_sizes):
    """Forward and backward through the compiled varlen op (Inductor) equal the eager padded computation."""
    padded, packed = _pair(NO_DROPOUT)
    padded.train()
    packed.train()
    compiled = torch.compile(packed, fullgraph=True, dynamic=True)
    inputs = _batch([[1] * 7, [1] * 3 + [0] * 4, [1] * 5 + [0] * 2], seed=5)
    real = inputs["attention_mask"].bool()
    losses = []
    for model in (padded, compiled):
        out = model(**inputs)
        loss = out.last_hidden_state[real].square().mean() + out.pooler_output.sum()
        loss.backward()
        losses.append(loss.detach())
    assert_grads_close(losses[1], losses[0], what="loss")  # a sum over the batch: scaled to its size
    grads_padded = {n: p.grad for n, p in padded.named_parameters() if p.grad is not None}
    grads_packed = {n: p.grad for n, p in packed.named_parameters() if p.grad is not None}
    assert grads_padded.keys() == grads_packed.keys()
    for name, grad in grads_padded.items():
        assert_grads_close(grads_packed[name], grad, what=name)
