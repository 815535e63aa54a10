"""Score-bias position schemes stay packed: a packed batch attends sequence by sequence with each sequence's own
``[h, l, l]`` score term as the backend's mask, never re-padded, and equals the padded path on real tokens,
forward and backward.

Schemes: ``relative_key`` / ``relative_key_query`` (per-layer distance table), ``symmetric_alibi`` (Jina v2's,
a shared bias), ``relative_bucket`` (MPNet's shared bias), ``disentangled`` (DeBERTa-v3's c2p + p2c, the table
projected once per layer) and the example plugin's per-layer ``alibi``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch
from bertblocks_alibi import plugin as alibi_plugin

import bertblocks
from bertblocks.core.component import Component
from bertblocks.core.interfaces import PackedScoreTerm, PositionBias, Positions
from bertblocks.errors import UnsupportedError
from bertblocks.plugins.attention import BertAttention
from bertblocks.plugins.positions import RelativeBias, RelativeKeyPositions
from bertblocks.registry import Registry
from bertblocks.testing import ConformanceError, ConformanceSuite
from tests.conftest import TINY
from tests.tolerances import assert_close, assert_grads_close

#: each scheme as a config's ``position`` (and any encoder/attention fields it needs)
SCHEMES: dict[str, dict[str, Any]] = {
    "relative_key": {"position": "relative_key"},
    "relative_key_query": {"position": "relative_key_query"},
    "symmetric_alibi": {"position": {"name": "symmetric_alibi"}},
    "relative_bucket": {"position": {"name": "relative_bucket", "num_buckets": 8, "max_distance": 16}},
    # DeBERTa-v3's settings at test size: 8 log buckets (distances past 4 bucketed), both terms, shared keys
    "disentangled": {"position": {"name": "disentangled", "position_buckets": 8, "max_relative_positions": 16}},
    # a table wider than the batch's distances (32 rows, distances past 8 bucketed): a compiled graph projects only
    # the rows the distances reach
    "disentangled (wide table)": {
        "position": {"name": "disentangled", "position_buckets": 16, "max_relative_positions": 512}
    },
    "alibi (plugin, per layer)": {"position": {"name": "alibi"}},
}


def _registry() -> Registry:
    reg = Registry(load_entry_points=False)
    reg.register(alibi_plugin, name="bertblocks-alibi")
    return reg


def _model(scheme: str, packing: str, *, backend: str = "sdpa") -> torch.nn.Module:
    """No dropout, so that a training step's results are deterministic on both paths."""
    torch.manual_seed(0)
    config = {**TINY, **SCHEMES[scheme], "initializer_range": 0.2, "hidden_dropout_prob": 0.0}
    model = bertblocks.create_model(
        config,
        [f"encoder.attention.backend={backend}", f"encoder.packing={packing}", "encoder.attention.dropout=0.0"],
        registry=_registry(),
    )
    with torch.no_grad():  # position tables large enough that a wrong distance shows
        for name, param in model.named_parameters():
            if "distance_embedding" in name or "relative_attention_bias" in name or "rel_embeddings.weight" in name:
                param.normal_()
    return model


def _batch() -> dict[str, torch.Tensor]:
    """Right-padded, lengths 12, 5, 9, 5, 5, 2: runs of equal neighbours (5, 5) and a lone one."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 99, (6, 12), generator=g)
    mask = torch.zeros(6, 12, dtype=torch.long)
    for row, length in enumerate([12, 5, 9, 5, 5, 2]):
        mask[row, :length] = 1
    return {"input_ids": ids, "attention_mask": mask}


class _RepadSpy:
    """Counts the calls of ``BertAttention._attend_repadded``, the one place a packed batch is re-padded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        original = BertAttention._attend_repadded

        def spy(attention: BertAttention, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return original(attention, *args, **kwargs)

        monkeypatch.setattr(BertAttention, "_attend_repadded", spy)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_packed_equals_padded_and_never_repads(scheme, backend, monkeypatch):
    padded, packed = _model(scheme, "never", backend=backend).eval(), _model(scheme, "always", backend=backend).eval()
    x = _batch()
    real = x["attention_mask"].bool()
    spy = _RepadSpy(monkeypatch)
    head_mask = torch.tensor([[1.0, 0.0, 1.0, 0.5], [1.0, 1.0, 0.0, 1.0]])
    with torch.no_grad():
        a = padded(**x, head_mask=head_mask, output_hidden_states=True)
        b = packed(**x, head_mask=head_mask, output_hidden_states=True)
    assert spy.calls == 0  # both layers of the packed model attended per sequence
    assert_close(a.last_hidden_state[real], b.last_hidden_state[real])
    for h_a, h_b in zip(a.hidden_states, b.hidden_states, strict=True):
        assert_close(h_a[real], h_b[real])
    assert b.last_hidden_state[~real].abs().max() == 0


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_packed_gradients_equal_padded(scheme, monkeypatch):
    """Training on packed batches (``encoder.packing: always``): the same loss and the same gradient for every
    parameter (position tables included) as the padded path."""
    padded, packed = _model(scheme, "never").train(), _model(scheme, "always").train()
    x = _batch()
    real = x["attention_mask"].bool()
    spy = _RepadSpy(monkeypatch)
    losses = []
    for model in (padded, packed):
        out = model(**x).last_hidden_state
        loss = (out[real] ** 2).mean() + out[real][:, 0].sum()
        loss.backward()
        losses.append(loss.detach())
    assert spy.calls == 0
    assert_grads_close(losses[1], losses[0])
    grads = {name: p.grad for name, p in packed.named_parameters() if p.grad is not None}
    for name, param in padded.named_parameters():
        if param.grad is None:
            continue
        assert name in grads, name
        assert_grads_close(grads[name], param.grad, what=name)


def test_output_attentions_still_repads_and_matches(monkeypatch):
    """Attention maps are ``[b, h, L, L]``: that call re-pads (documented), with the same results."""
    padded, packed = _model("symmetric_alibi", "never").eval(), _model("symmetric_alibi", "always").eval()
    spy = _RepadSpy(monkeypatch)
    x = _batch()
    real = x["attention_mask"].bool()
    with torch.no_grad():
        a = padded(**x, output_attentions=True)
        b = packed(**x, output_attentions=True)
    assert spy.calls == 2  # one per layer
    assert_close(a.last_hidden_state[real], b.last_hidden_state[real])


class _UndeclaredBias(RelativeBias):
    """A term that does not declare ``per_sequence`` (as a third-party term written before the declaration)."""

    per_sequence: ClassVar[bool] = False


class _ChangedForward(RelativeBias):
    """A subclass that changes ``forward`` (here: the same term, reshaped) and inherits its parent's declaration."""

    def forward(self, query: torch.Tensor, key: torch.Tensor, positions: Positions) -> torch.Tensor:
        return super().forward(query, key, positions).contiguous()


@pytest.mark.parametrize("term", [_UndeclaredBias, _ChangedForward])
def test_a_term_that_does_not_declare_per_sequence_is_repadded(term, monkeypatch):
    """Undeclared, or declared only for a parent's ``forward``: the layer re-pads (always correct)."""
    assert not term.packs_per_sequence()
    padded, packed = _model("relative_key", "never").eval(), _model("relative_key", "always").eval()
    for layer in packed.encoder.layer:
        layer.attention.self.distance_embedding.__class__ = term
    spy = _RepadSpy(monkeypatch)
    x = _batch()
    real = x["attention_mask"].bool()
    with torch.no_grad():
        a, b = padded(**x).last_hidden_state, packed(**x).last_hidden_state
    assert spy.calls == 2
    assert_close(a[real], b[real])
    bias = packed.encoder.layer[0].attention.self.distance_embedding
    positions = Positions.contiguous(4, 0, torch.device("cpu"))
    with pytest.raises(UnsupportedError, match="does not declare per_sequence for its forward"):
        bias.sequence_terms(torch.zeros(4, 4, 8), torch.zeros(4, 4, 8), positions)


def test_the_default_sequence_terms_are_the_padded_terms_corner():
    """:meth:`PositionBias.sequence_terms`: ``forward`` over the run alone equals the padded term's top-left
    ``[l, l]`` of each sequence (right-padded: sequence ``i`` at positions ``0 … l - 1``)."""
    torch.manual_seed(0)
    bias: PositionBias = RelativeBias(16, 8, with_key=True)
    lengths, length = [7, 3, 3], 7
    t = sum(lengths)
    query, key = torch.randn(t, 2, 8), torch.randn(t, 2, 8)
    terms = bias.sequence_terms(query, key, Positions.contiguous(length, 0, torch.device("cpu")))
    start = 0
    for n, run_length in ((1, 7), (2, 3)):
        got = terms(start, n, run_length)  # [n, h, l, l]
        for i in range(n):
            s = start + i * run_length
            q, k = (x[s : s + run_length].transpose(0, 1)[None] for x in (query, key))
            pad = length - run_length
            q, k = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (q, k))
            want = bias(q, k, Positions.contiguous(length, 0, torch.device("cpu")))[0, :, :run_length, :run_length]
            assert_close(got[i], want)
        start += n * run_length


class _LyingBias(RelativeBias):
    """Declares ``per_sequence``, but its term depends on the batch's longest distance (``distance_range``): over one
    packed sequence alone it is not the padded term's corner."""

    per_sequence: ClassVar[bool] = True

    def forward(self, query: torch.Tensor, key: torch.Tensor, positions: Positions) -> torch.Tensor:
        _, hi = positions.distance_range
        return super().forward(query, key, positions) + positions.key[None, :].to(query.dtype) * hi * 0.05


class _LyingPositions(RelativeKeyPositions):
    name = "lying"

    def attention_bias(self, num_heads: int, head_dim: int) -> PositionBias:
        return _LyingBias(self.max_positions, head_dim, with_key=False)


def test_the_conformance_suite_catches_a_wrong_per_sequence_declaration():
    reg = Registry(load_entry_points=False)

    class Plugin:
        @staticmethod
        def bertblocks_register_components() -> list[Component]:
            return [
                Component(
                    "position", "lying", lambda *, max_positions, model, options=None: _LyingPositions(max_positions)
                )
            ]

    reg.register(Plugin(), name="lying-plugin")
    (case,) = ConformanceSuite(reg).cases(kinds=["position"], names=["lying"], include=["padding_declaration"])
    with pytest.raises(ConformanceError, match=r"declares per_sequence .*_LyingBias"):
        case.run()


@pytest.mark.parametrize("scheme", ["symmetric_alibi", "disentangled", "relative_key_query"])
def test_pruned_heads_stay_packed_and_equal_padded(scheme, monkeypatch):
    """A pruned layer keeps its remaining heads' rows of a shared bias and projects its term with the pruned
    projections, on the per-sequence path as on the padded one."""
    padded, packed = _model(scheme, "never").eval(), _model(scheme, "always").eval()
    for model in (padded, packed):
        model.prune_heads({0: [1, 3], 1: [0]})
    spy = _RepadSpy(monkeypatch)
    x = _batch()
    real = x["attention_mask"].bool()
    with torch.no_grad():
        a, b = padded(**x).last_hidden_state, packed(**x).last_hidden_state
    assert spy.calls == 0
    assert_close(a[real], b[real])


# ------------------------------------------------------------------------------------------ inside torch.compile
#: what the compiled tests cover: the per-layer relative table with both terms, DeBERTa-v3's shared-key c2p + p2c,
#: Jina v2's shared ALiBi and the example plugin's per-layer ALiBi. Each scheme through AOT autograd (the op's fake
#: kernel and autograd registration, what any compiler backend sees); one through inductor as well (its C++ build
#: costs half a minute, so only the scheme with the most parts)
COMPILED_SCHEMES = [
    ("relative_key_query", "aot_eager"),
    ("disentangled", "aot_eager"),
    ("disentangled", "inductor"),
    ("disentangled (wide table)", "aot_eager"),
    ("symmetric_alibi", "aot_eager"),
    ("alibi (plugin, per layer)", "aot_eager"),
]


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.compile
@pytest.mark.parametrize(("scheme", "compiler"), COMPILED_SCHEMES)
def test_compiled_packed_outputs_and_gradients_equal_padded_and_never_repad(
    scheme, compiler, monkeypatch, fresh_dynamo
):
    """``torch.compile`` (one dynamic graph) of a packed model: outputs and every parameter's gradient
    (the position tables included) equal the eager padded model's, and no layer re-padded while the graph was
    traced (the spy is Python: it counts at trace time, once per layer, if the graph holds a re-padded call).
    Two batches of different lengths, right- and left-padded, go through the same compiled model."""
    padded, packed = _model(scheme, "never").train(), _model(scheme, "always").train()
    spy = _RepadSpy(monkeypatch)
    compiled = torch.compile(packed, backend=compiler, dynamic=True, fullgraph=True)
    first = _batch()
    # a second length, and left padding: a compiled graph packs any padding side (each sequence then reads the
    # top-left corner of the padded batch's index and bias, where its padded row has them bottom-right: equal for
    # terms of the distance i - j, which every packed form is)
    second = {"input_ids": first["input_ids"][1:, :9], "attention_mask": first["attention_mask"][1:, :9].flip(-1)}
    for x in (first, second):
        real = x["attention_mask"].bool()
        losses, outputs = [], []
        for model in (padded, compiled):
            model.zero_grad()
            out = model(**x).last_hidden_state
            loss = (out[real] ** 2).mean() + out[real][:, 0].sum()
            loss.backward()
            losses.append(loss.detach())
            outputs.append(out.detach())
        assert outputs[1][~real].abs().max() == 0  # packed in the graph: padded positions are zeros
        assert_close(outputs[1][real], outputs[0][real])
        assert_grads_close(losses[1], losses[0])
        grads = {name: p.grad for name, p in packed.named_parameters() if p.grad is not None}
        for name, param in padded.named_parameters():
            if param.grad is not None:
                assert name in grads, name
                assert_grads_close(grads[name], param.grad, what=name)
    assert spy.calls == 0


@pytest.mark.compile
def test_compiled_graph_holds_the_biased_varlen_op_and_no_repadding(fresh_dynamo):
    """The traced graph of a packed model (relative_key per layer, MPNet's shared bias: both forms) calls
    ``bertblocks::sdpa_varlen_biased`` once per layer and scatters no query back to the padded layout (re-padding is
    an ``index_copy_`` of ``[T, ·]`` into ``[b·L, ·]``, three per layer: with packing, the graph's only one is the
    output's unpack). With a pruned head and a head mask, its outputs are the padded model's."""
    head_mask = torch.tensor([[1.0, 0.0, 1.0, 0.5], [1.0, 1.0, 0.0, 1.0]])
    for scheme in ("relative_key", "relative_bucket"):
        torch._dynamo.reset()
        padded, packed = _model(scheme, "never").eval(), _model(scheme, "always").eval()
        for model in (padded, packed):
            model.prune_heads({1: [2]})
        graphs: list[str] = []

        def capture(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
            graphs.append(gm.code)  # noqa: B023 (called while this iteration compiles)
            return gm

        x = _batch()
        real = x["attention_mask"].bool()
        with torch.no_grad():
            out = torch.compile(packed, backend=capture, dynamic=True, fullgraph=True)(**x, head_mask=head_mask)
            assert_close(out.last_hidden_state[real], padded(**x, head_mask=head_mask).last_hidden_state[real])
        (code,) = graphs
        assert code.count("bertblocks.sdpa_varlen_biased") == 2, scheme
        assert code.count(".index_copy_(") == 1, scheme


@pytest.mark.compile
def test_compiled_repads_where_the_op_cannot_serve(monkeypatch, fresh_dynamo):
    """The eager backend (its own kernel, not SDPA's) and a term without a packed form keep the re-padded call
    inside a graph, with the same results."""
    padded = _model("relative_key", "never").eval()
    eager_backend = _model("relative_key", "always", backend="eager").eval()
    no_form = _model("relative_key", "always").eval()
    for layer in no_form.encoder.layer:
        layer.attention.self.distance_embedding.__class__ = _NoPackedForm
    x = _batch()
    real = x["attention_mask"].bool()
    for model in (eager_backend, no_form):
        torch._dynamo.reset()
        spy = _RepadSpy(monkeypatch)
        with torch.no_grad():
            out = torch.compile(model, backend="aot_eager", dynamic=True, fullgraph=True)(**x).last_hidden_state
            assert_close(out[real], padded(**x).last_hidden_state[real])
        assert spy.calls == 2


class _NoPackedForm(RelativeBias):
    """Declares ``per_sequence`` (eager packs) but gives no packed form (a third-party term written before it)."""

    per_sequence: ClassVar[bool] = True

    def forward(self, query: torch.Tensor, key: torch.Tensor, positions: Positions) -> torch.Tensor:
        return super().forward(query, key, positions)

    def packed_term(self, *args: Any, **kwargs: Any) -> None:
        return None


def test_the_biased_varlen_op_passes_opcheck():
    """Fake kernel, autograd registration and schema of ``bertblocks::sdpa_varlen_biased`` (torch's own checks,
    gradients against finite differences included), with every term present, over runs of equal and lone lengths."""
    g = torch.Generator().manual_seed(0)
    t, h, d, length, n = 10, 2, 4, 5, 7
    q, k, v = (torch.randn(t, h, d, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 5, 7, 9, 10], dtype=torch.int32)
    index = torch.randint(0, n, (length, length), generator=g)
    rows, cols = (torch.randn(t, h, n, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    fixed = torch.randn(1, h, length, length, generator=g, dtype=torch.float64, requires_grad=True)
    args = (q, k, v, cu, 0.5, 0.25, index, rows, cols, fixed)
    torch.library.opcheck(torch.ops.bertblocks.sdpa_varlen_biased.default, args)
    torch.autograd.gradcheck(lambda *a: torch.ops.bertblocks.sdpa_varlen_biased(*a), args)
    # and against masked SDPA over the same sequences
    out = torch.ops.bertblocks.sdpa_varlen_biased(*args)
    for start, stop in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        span = stop - start
        pair = index[:span, :span]
        mask = (
            torch.stack(
                [rows[start:stop, i].gather(-1, pair) + cols[start:stop, i].gather(-1, pair.T).T for i in range(h)]
            )
            * 0.25
            + fixed[0, :, :span, :span]
        )
        want = torch.nn.functional.scaled_dot_product_attention(
            *(x[start:stop].transpose(0, 1) for x in (q, k, v)), attn_mask=mask, scale=0.5
        )
        assert_close(out[start:stop].transpose(0, 1), want)


class _TransposedPackedBias(RelativeBias):
    """A packed form that gathers each pair's row at ``(j, i)``: right for a symmetric term, wrong for this one."""

    def packed_term(self, query: torch.Tensor, key: torch.Tensor, positions: Positions, projections: Any = None) -> Any:
        term = super().packed_term(query, key, positions)
        return PackedScoreTerm(index=term.index.T.contiguous(), rows=term.rows, cols=term.cols)


class _TransposedPositions(RelativeKeyPositions):
    name = "transposed"

    def attention_bias(self, num_heads: int, head_dim: int) -> PositionBias:
        return _TransposedPackedBias(self.max_positions, head_dim, with_key=False)


def test_the_conformance_suite_checks_a_terms_packed_form():
    """``position_scheme`` compares :meth:`PositionBias.packed_term` with :meth:`~PositionBias.sequence_terms` and
    with a left-padded row's term (the built-ins pass it in tests/test_conformance.py): a form gathered at the wrong
    pairs is caught."""
    reg = Registry(load_entry_points=False)

    class Plugin:
        @staticmethod
        def bertblocks_register_components() -> list[Component]:
            return [
                Component(
                    "position",
                    "transposed",
                    lambda *, max_positions, model, options=None: _TransposedPositions(max_positions),
                )
            ]

    reg.register(Plugin(), name="transposed-plugin")
    (case,) = ConformanceSuite(reg).cases(kinds=["position"], names=["transposed"], include=["position_scheme"])
    with pytest.raises(ConformanceError, match="packed_term vs sequence_terms"):
        case.run()
