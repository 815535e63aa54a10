"""Packing inside torch.compile (one graph for every token count) and the inference fast path."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import bertblocks
from tests.conftest import TINY
from tests.tolerances import assert_close


def _model(**overrides):
    torch.manual_seed(0)
    return bertblocks.create_model({**TINY, "initializer_range": 0.2}, overrides).eval()


def _padded_batch(batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    lengths[0] = length
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    return {"input_ids": torch.randint(1, TINY["vocab_size"], (batch, length), generator=g), "attention_mask": mask}


@pytest.fixture(params=[False, True], ids=["default-settings", "capture-dynamic-output-shapes"])
def capture_dynamic_sizes(request):
    """Packing is traced with dynamo's default settings, and with the process-wide setting that captures
    ``nonzero`` (which a user may have on for code of their own)."""
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=request.param):
        yield
    torch._dynamo.reset()


@pytest.mark.compile
def test_compiled_packed_outputs_equal_eager_packed(capture_dynamic_sizes):
    model = _model(**{"encoder.packing": "always"})
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    inputs = _padded_batch(3, 12, seed=1)
    with torch.no_grad():
        eager = model(**inputs)
        out = compiled(**inputs)
    # zeros at padded positions on both sides: the compiled graph packed (the padded path computes values there)
    assert_close(out.last_hidden_state, eager.last_hidden_state)
    assert (out.last_hidden_state[~inputs["attention_mask"].bool()] == 0).all()
    assert_close(out.pooler_output, eager.pooler_output)


@pytest.mark.compile
def test_compiled_packed_model_does_not_recompile_across_ten_batches(capture_dynamic_sizes):
    """Ten batches, each of a different padded length and different real lengths: one graph serves them all."""
    model = _model()
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend="aot_eager")
    with torch.no_grad():
        for n in range(10):
            inputs = _padded_batch(3, 5 + n, seed=n)
            out = compiled(**inputs)
            if n == 0:
                graphs = counters["stats"]["unique_graphs"]
            real = inputs["attention_mask"].bool()
            assert (out.last_hidden_state[~real] == 0).all()  # packed in the graph
            assert_close(out.last_hidden_state[real], model(**inputs).last_hidden_state[real])
    assert graphs == 1
    assert counters["stats"]["unique_graphs"] == graphs  # no recompilation


@pytest.mark.compile
def test_compiled_packing_over_a_fixed_length_needs_no_dynamic_flag(capture_dynamic_sizes):
    """The token count is data-dependent, not a guarded size: batches padded to one length share one graph
    even when torch.compile is static in the shapes."""
    model = _model()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        for n in range(4):
            compiled(**_padded_batch(2, 10, seed=n))
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.compile
def test_fast_path_equals_eager_on_real_tokens_and_keeps_module_names():
    model = _model()
    reference = _model()
    keys = list(model.state_dict())
    names = [name for name, _ in model.named_modules()]
    fired = []
    model.encoder.layer[0].output.register_forward_hook(lambda *_: fired.append(1))
    fast = bertblocks.optimize_for_inference(model)
    assert fast is model
    try:
        for n, length in enumerate((9, 14)):
            inputs = _padded_batch(3, length, seed=n)
            real = inputs["attention_mask"].bool()
            out = fast(**inputs)
            with torch.no_grad():
                expected = reference(**inputs)
            assert_close(out.last_hidden_state[real], expected.last_hidden_state[real])
            assert_close(out.pooler_output, expected.pooler_output)
        assert fired  # a hook registered before the call is traced into the graph
        assert list(model.state_dict()) == keys
        assert [name for name, _ in model.named_modules()] == names
        assert not torch._dynamo.config.capture_dynamic_output_shape_ops  # packing needs no dynamo setting
    finally:
        bertblocks.models.inference.restore_eager(model)
        torch._dynamo.reset()
    assert_close(model(**inputs).last_hidden_state[real], expected.last_hidden_state[real])


def test_fast_path_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match="mode must be one of"):
        bertblocks.optimize_for_inference(_model(), mode="fastest")


@pytest.mark.parametrize("prepack", [False, True])
def test_fast_path_compiles_with_its_own_inductor_settings_and_leaves_the_process_alone(prepack):
    """Freezing and (off by default) oneDNN weight prepacking hold while the model's call compiles, not after."""
    import torch._inductor.config as inductor

    before = (inductor.freezing, inductor.cpp.weight_prepack)
    model = _model()
    kwargs = {} if not prepack else {"weight_prepack": True}
    bertblocks.optimize_for_inference(model, **kwargs)
    with model._compiled_call_impl._settings():
        assert inductor.freezing
        assert inductor.cpp.weight_prepack is prepack
        assert not torch._dynamo.config.capture_dynamic_output_shape_ops  # packing needs no dynamo setting
    assert (inductor.freezing, inductor.cpp.weight_prepack) == before
    bertblocks.models.inference.restore_eager(model)


@pytest.mark.compile
def test_fast_path_gives_eager_zeros_for_a_batch_without_a_real_token():
    # Inductor needs the packed token count to be at least 1: an all-padding batch stands position 0 in and
    # zeroes it again, instead of failing a runtime assertion
    model, reference = _model(), _model()
    fast = bertblocks.optimize_for_inference(model)
    try:
        inputs = _padded_batch(3, 9, seed=0)
        real = inputs["attention_mask"].bool()
        with torch.no_grad():
            expected = reference(**inputs)
        assert_close(fast(**inputs).last_hidden_state[real], expected.last_hidden_state[real])
        empty = {**inputs, "attention_mask": torch.zeros_like(inputs["attention_mask"])}
        out = fast(**empty)
        with torch.no_grad():
            expected = reference(**empty)
        # no real token: both paths return zeros by construction, not by arithmetic
        assert torch.equal(expected.last_hidden_state, torch.zeros_like(expected.last_hidden_state))
        assert torch.equal(out.last_hidden_state, expected.last_hidden_state)
        assert_close(out.pooler_output, expected.pooler_output)
    finally:
        bertblocks.models.inference.restore_eager(model)
        torch._dynamo.reset()
