"""torch.compile (fullgraph) equals eager; reduced precision (bf16/fp16) runs on CPU close to fp32."""

from __future__ import annotations

import pytest
import torch

import bertblocks
from tests.conftest import TINY, batch, max_diff
from tests.tolerances import assert_close


def _model(position="relative_key", backend="sdpa"):
    torch.manual_seed(0)
    config = {**TINY, "position": position, "initializer_range": 0.2}
    model = bertblocks.create_model(config, [f"encoder.attention.backend={backend}"]).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "distance_embedding" in name:
                param.normal_()
    return model


@pytest.mark.compile
def test_compiled_model_matches_eager_in_one_graph():
    """fullgraph=True: the forward has no graph breaks (data-dependent checks and packing step aside)."""
    model = _model()
    inputs = batch()
    real = inputs["attention_mask"].bool()
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        eager = model(**inputs)
        out = compiled(**inputs)
    # eager may pack the padded batch (zeros at padded positions); compiled never packs
    assert_close(out.last_hidden_state[real], eager.last_hidden_state[real])
    assert_close(out.pooler_output, eager.pooler_output)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("position", ["absolute", "relative_key_query"])
def test_reduced_precision_runs_close_to_fp32(dtype, backend, position):
    model = _model(position, backend)
    inputs = batch()
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        reference = model(**inputs).last_hidden_state
        out = model.to(dtype)(**inputs).last_hidden_state
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    # LayerNorm outputs are O(1); bf16 keeps ~3 significant digits through two layers
    assert max_diff(out[real], reference[real]) <= 0.1
