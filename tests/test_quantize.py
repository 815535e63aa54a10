"""Int8 inference (``bertblocks.quantize``): every family and head stays within a stated bound of fp32, packing and
the fast path compose with it, it saves, loads and exports, a fine-tuned classifier keeps its accuracy, and bad
input gets a clear error.

The bound: int8 weights (per output channel) and int8 activations (per token) give each output a relative error
of about 1/127 per layer, which adds up over layers. Every output tensor must differ from fp32 (a layer left in
fp32 would not), its max abs difference must stay under ``REL_TOL`` of the fp32 tensor's max abs value, and
vectors of 16 or more entries (hidden states, vocabulary logits; not a few class scores) must keep a cosine
similarity of at least ``MIN_COSINE`` to fp32 row by row (per token). A wrong scale (per tensor instead of per
channel, a transposed weight, a missing bias) breaks both by orders of magnitude.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import bertblocks
from bertblocks.errors import BertBlocksError
from bertblocks.models.inference import restore_eager
from bertblocks.models.quantize import (
    Int8Linear,
    QuantizationError,
    is_quantized,
    load_quantized,
    quantize,
    quantize_weight,
    save_quantized,
)
from tests.conftest import TINY, batch
from tests.families.reference import CASES, COMMON, FAMILIES, FIELDS, Family, save_hf
from tests.families.reference import batch as family_batch

MIN_COSINE = 0.99
REL_TOL = 0.1

BERT_CLASSES = [
    "BertModel",
    "BertForPreTraining",
    "BertForMaskedLM",
    "BertForNextSentencePrediction",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertForQuestionAnswering",
    "BertForMultipleChoice",
]
BERT = Family(
    "BertConfig",
    COMMON,  # the tiny BERT settings of tests/conftest.py, three labels
    pad=0,
)
#: every family of the shared table with each of its transformers classes (tests/families/reference.py), and BERT's
ALL_CASES = [("bert", cls) for cls in BERT_CLASSES] + CASES


def _family(name: str) -> Family:
    return BERT if name == "bert" else FAMILIES[name]


def assert_close_to_fp32(reference: Any, quantized: Any, mask: torch.Tensor) -> int:
    """Every output field within the bound (real tokens only for per-token outputs); returns how many compared."""
    compared = 0
    for name in FIELDS:
        a, b = getattr(reference, name, None), getattr(quantized, name, None)
        if a is None:
            continue
        assert b is not None, name
        assert a.shape == b.shape, name
        if a.dim() >= 2 and a.shape[: mask.dim()] == mask.shape:
            a, b = a[mask.bool()], b[mask.bool()]
        diff = (a - b).abs().max().item()
        assert diff > 0, f"{name} equals fp32's: a layer it depends on was not quantized"
        scale = a.abs().max().item()
        assert diff <= REL_TOL * scale, f"{name}: max abs diff {diff:.3g} over {REL_TOL} x {scale:.3g}"
        if a.shape[-1:] >= (16,):  # vectors: hidden states, vocabulary logits (not 2 or 3 class scores)
            rows = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
            cosine = nn.functional.cosine_similarity(*rows, dim=-1).min().item()
            assert cosine >= MIN_COSINE, f"{name}: worst row cosine {cosine:.4f} < {MIN_COSINE}"
        compared += 1
    return compared


# ------------------------------------------------------------------------------------------------ the layer
def test_int8_linear_computes_the_quantized_product_and_stays_near_fp32():
    torch.manual_seed(0)
    linear = nn.Linear(48, 24)
    x = torch.randn(5, 7, 48) * torch.linspace(0.01, 10.0, 7)[None, :, None]  # tokens of very different scale
    layer = Int8Linear.from_float(linear)
    q, scale = quantize_weight(linear.weight.detach())
    assert layer.weight.dtype == torch.int8
    assert torch.equal(layer.weight, q)
    assert (q.abs().amax(dim=1) == 127).all()  # each channel uses the full range
    # the reference arithmetic, token by token
    rows = x.reshape(-1, 48)
    s = rows.abs().amax(dim=1, keepdim=True) / 127
    xq = torch.round(rows / s).clamp(-127, 127)
    expected = (xq @ q.float().T) * s * scale + linear.bias.detach()
    with torch.no_grad():
        out = layer(x)
        reference = linear(x)
    assert out.shape == (5, 7, 24)
    assert (out.reshape(-1, 24) - expected).abs().max().item() <= 1e-4 * expected.abs().max().item()
    # per-token scales: the small tokens are as accurate, relatively, as the large ones
    relative = (out - reference).norm(dim=-1) / reference.norm(dim=-1)
    assert relative.max().item() < 0.02


def test_a_token_quantizes_independently_of_its_batch():
    torch.manual_seed(0)
    layer = Int8Linear.from_float(nn.Linear(16, 8))
    x = torch.randn(4, 16)
    together = layer(torch.cat([x, 1000 * torch.randn(1, 16)]))[:4]  # a huge token in the same batch
    assert torch.equal(together, layer(x))


# ------------------------------------------------------------------------------------------------ every family
@pytest.mark.parametrize(("family_name", "cls"), ALL_CASES, ids=[f"{f}-{c}" for f, c in ALL_CASES])
def test_every_family_and_head_stays_within_the_bound_of_fp32(tmp_path: Path, family_name: str, cls: str, device: str):
    family = _family(family_name)
    save_hf(family, cls, tmp_path)
    model = bertblocks.from_pretrained(tmp_path, head="auto").to(device).eval()
    if device != "cpu":  # the int8 kernels are CPU ones: any other device is refused naming it, nothing changed
        with pytest.raises(QuantizationError, match=f"is on {device}.*runs on CPU"):
            quantize(model)
        assert not is_quantized(model)
        return
    inputs, mask = family_batch(family, cls)
    linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    with torch.no_grad():
        reference = model(**inputs)
    assert quantize(model) is model
    head = vars(model).get("head")  # a task model's head object: not a submodule, but it runs the head's layers
    for root in (model, head) if head is not None else (model,):
        assert not any(isinstance(m, nn.Linear) for m in root.modules()), "an nn.Linear was left in fp32"
    assert sum(isinstance(m, Int8Linear) for m in model.modules()) == linears
    with torch.no_grad():
        quantized = model(**inputs)
    assert assert_close_to_fp32(reference, quantized, mask) >= 1


def test_skip_keeps_matching_layers_in_fp32():
    model = bertblocks.create_model(TINY, head="sequence_classification").eval()
    quantize(model, skip=["classifier", "bert.pooler.*"])
    assert isinstance(model.classifier, nn.Linear)
    assert isinstance(model.bert.pooler.dense, nn.Linear)
    assert isinstance(model.bert.encoder.layer[0].attention.self.query, Int8Linear)


# ------------------------------------------------------------------------------------------------ composition
def test_packed_and_padded_int8_give_the_same_outputs():
    """Per-token scales make each token's int8 product independent of the batch, so packing (which drops the
    padding rows) changes nothing beyond fp32 rounding in attention."""
    torch.manual_seed(0)
    packed = bertblocks.create_model(TINY, ["encoder.packing=auto"]).eval()
    padded = bertblocks.create_model(TINY, ["encoder.packing=never"]).eval()
    padded.load_state_dict(packed.state_dict())
    quantize(packed)
    quantize(padded)
    inputs = batch()
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        a = packed(**inputs).last_hidden_state
        b = padded(**inputs).last_hidden_state
    assert (a[real] - b[real]).abs().max().item() <= 1e-5
    assert (a[~real] == 0).all()  # packed: padded positions hold zeros, as in fp32


def test_the_fast_path_compiles_a_quantized_model_in_one_graph():
    torch.manual_seed(0)
    model = bertblocks.create_model(TINY).eval()
    inputs = batch()
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        reference = model(**inputs).last_hidden_state
        eager = quantize(model)(**inputs).last_hidden_state
    bertblocks.optimize_for_inference(model)  # fullgraph=True: a graph break would raise
    compiled = model(**inputs).last_hidden_state
    # Inductor may round a value on a .5 boundary the other way (x * (1/s) against x / s): one int8 step
    assert (compiled[real] - eager[real]).abs().max().item() <= 0.1 * REL_TOL * eager.abs().max().item()
    cosine = nn.functional.cosine_similarity(compiled[real], reference[real], dim=-1).min().item()
    assert cosine >= MIN_COSINE
    assert (compiled[~real] == 0).all()  # packed in the graph


def test_cached_decoding_matches_full_recomputation():
    """Per-token scales: a cached step quantizes its one new token as the full forward pass does (a scale per
    tensor would differ between the one-token step and the whole sequence)."""
    from bertblocks.models.generation import generate

    torch.manual_seed(0)
    model = bertblocks.create_model({**TINY, "is_decoder": True}, head="causal_lm").eval()
    quantize(model)
    sequence = torch.randint(5, 99, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(input_ids=sequence).logits[:, -1]
        prefix = model(input_ids=sequence[:, :-1], use_cache=True)
        step = model(input_ids=sequence[:, -1:], past_key_values=prefix.past_key_values, use_cache=True)
        assert (step.logits[:, -1] - full).abs().max().item() <= 1e-5
        cached = generate(model, sequence[:, :4], max_new_tokens=6, use_cache=True)
        recomputed = generate(model, sequence[:, :4], max_new_tokens=6, use_cache=False)
    assert torch.equal(cached, recomputed)


# ------------------------------------------------------------------------------------------------ save, load, ONNX
@pytest.mark.parametrize(("family_name", "cls"), [("bert", "BertForSequenceClassification"), ("albert", "AlbertModel")])
def test_save_and_load_give_the_same_model(tmp_path: Path, family_name: str, cls: str):
    save_hf(_family(family_name), cls, tmp_path / "hf")
    model = quantize(bertblocks.from_pretrained(tmp_path / "hf", head="auto").eval())
    inputs, _ = family_batch(_family(family_name), cls)
    save_quantized(model, tmp_path / "int8")
    loaded = load_quantized(tmp_path / "int8")
    assert type(loaded) is type(model)
    assert not loaded.training
    assert loaded.state_dict().keys() == model.state_dict().keys()
    with torch.no_grad():
        for name, value in model(**inputs).items():
            assert torch.equal(loaded(**inputs)[name], value), name
    if family_name == "albert":  # one shared layer: still one module after loading
        layers = [m for m in loaded.modules() if isinstance(m, Int8Linear)]
        assert len(layers) == len({id(m) for m in layers})


def test_load_quantized_reports_a_missing_file_and_a_mismatch(tmp_path: Path):
    with pytest.raises(QuantizationError, match="lacks"):
        load_quantized(tmp_path)
    model = quantize(bertblocks.create_model(TINY).eval())
    save_quantized(model, tmp_path)
    manifest = json.loads((tmp_path / "quantization.json").read_text())
    (tmp_path / "quantization.json").write_text(json.dumps({**manifest, "skip": ["encoder.*"]}))
    with pytest.raises(QuantizationError, match="does not fit"):
        load_quantized(tmp_path)


def test_onnx_export_runs_int8_matmuls_in_onnx_runtime(tmp_path: Path):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from bertblocks.models.export import export_onnx

    torch.manual_seed(0)
    model = quantize(bertblocks.create_model(TINY).eval())
    path = export_onnx(model, tmp_path / "int8.onnx")
    ops = [node.op_type for node in onnx.load(str(path)).graph.node]
    assert ops.count("MatMulInteger") == 2 * 6 + 1  # 6 linear layers per layer, 2 layers, the pooler
    inputs = batch()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    out = session.run(None, {k: v.numpy() for k, v in inputs.items()})[0]
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
    assert (torch.from_numpy(out)[real] - expected[real]).abs().max().item() <= 1e-4


# ------------------------------------------------------------------------------------------------ accuracy
def _task(n: int, seed: int, length: int = 12) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Label 1 when more real tokens come from the lower half of the vocabulary than from the upper half."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 99, (n, length), generator=g)
    real = torch.randint(3, length // 2 + 1, (n,), generator=g) * 2 - 1  # odd counts: no ties
    mask = (torch.arange(length)[None, :] < real[:, None]).long()
    low = ((ids < 52) & mask.bool()).sum(1)
    return ids.masked_fill(mask == 0, 0), mask, (2 * low > real).long()


def test_a_fine_tuned_classifier_keeps_its_held_out_accuracy():
    torch.manual_seed(0)
    config = {**TINY, "hidden_dropout_prob": 0.0, "num_labels": 2}
    model = bertblocks.create_model(config, head="sequence_classification")
    ids, mask, labels = _task(2048, seed=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for step in range(150):
        chosen = torch.randint(0, len(ids), (64,), generator=torch.Generator().manual_seed(step))
        loss = model(input_ids=ids[chosen], attention_mask=mask[chosen], labels=labels[chosen]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    held_ids, held_mask, held_labels = _task(1000, seed=2)

    def accuracy() -> float:
        with torch.no_grad():
            logits = model(input_ids=held_ids, attention_mask=held_mask).logits
        return (logits.argmax(-1) == held_labels).float().mean().item()

    fp32 = accuracy()
    assert fp32 >= 0.85, f"the classifier did not learn the task ({fp32:.3f}); the comparison would say nothing"
    quantize(model)
    int8 = accuracy()
    assert abs(int8 - fp32) <= 0.01, f"held-out accuracy fp32 {fp32:.4f}, int8 {int8:.4f}"


# ------------------------------------------------------------------------------------------------ errors
def _tiny() -> nn.Module:
    return bertblocks.create_model(TINY).eval()


def test_a_model_in_training_mode_is_refused():
    with pytest.raises(QuantizationError, match=r"training mode.*model\.eval\(\)"):
        quantize(_tiny().train())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_a_non_fp32_model_is_refused(dtype: torch.dtype):
    with pytest.raises(QuantizationError, match=rf"weight is {dtype}.*model\.float\(\)"):
        quantize(_tiny().to(dtype))


def test_double_quantization_is_refused():
    model = quantize(_tiny())
    with pytest.raises(QuantizationError, match="already quantized"):
        quantize(model)


def test_quantizing_after_the_fast_path_is_refused():
    model = bertblocks.optimize_for_inference(_tiny())
    with pytest.raises(QuantizationError, match="quantize first, then call optimize_for_inference"):
        quantize(model)
    restore_eager(model)
    assert is_quantized(quantize(model))


def test_nothing_to_quantize_is_refused():
    with pytest.raises(QuantizationError, match=r"no nn\.Linear"):
        quantize(nn.Sequential(nn.Embedding(4, 4)).eval())
    with pytest.raises(QuantizationError, match=r"no nn\.Linear"):
        quantize(_tiny(), skip=["*"])


def test_saving_an_unquantized_model_is_refused(tmp_path: Path):
    with pytest.raises(QuantizationError, match="not quantized"):
        save_quantized(_tiny(), tmp_path)
    assert issubclass(QuantizationError, BertBlocksError)


# a fused Wqkv read in parts: cross-attention (query from the decoder, key/value from the encoder) and DeBERTa's
# shared-key position term slice its weight, which an int8 layer holds as int8
def _cross_attention_decoder() -> nn.Module:
    torch.manual_seed(0)
    config = {**TINY, "is_decoder": True, "add_cross_attention": True}
    return bertblocks.create_model(config, {"encoder.attention.fused_qkv": True}, head="causal_lm").eval()


def test_a_fused_cross_attention_wqkv_is_refused_naming_it_and_the_model_is_left_as_it_was():
    model = _cross_attention_decoder()
    with pytest.raises(
        QuantizationError, match=r"bert\.encoder\.layer\.0\.crossattention\.self\.Wqkv .*cross-attention"
    ):
        quantize(model)
    assert not is_quantized(model)  # refused before any layer was replaced


def test_a_fused_wqkv_read_by_a_position_term_is_refused():
    model = bertblocks.create_model("tiny-deberta-v2", {"encoder.attention.fused_qkv": True}).eval()
    with pytest.raises(QuantizationError, match=r"encoder\.layer\.0\.attention\.self\.Wqkv .*DisentangledBias"):
        quantize(model)
    assert not is_quantized(model)


def test_the_named_workaround_quantizes_the_rest_within_the_bound():
    """The error's ``skip`` keeps the cross-attention ``Wqkv`` in fp32; the decoder's self-attention ``Wqkv`` and
    every other layer quantize, and the outputs stay within the bound of fp32."""
    reference = _cross_attention_decoder()
    model = quantize(_cross_attention_decoder(), skip=["*.crossattention.self.Wqkv"])
    assert isinstance(model.bert.encoder.layer[0].attention.self.Wqkv, Int8Linear)
    assert isinstance(model.bert.encoder.layer[0].crossattention.self.Wqkv, nn.Linear)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, TINY["vocab_size"], (2, 7), generator=g)
    mask = torch.ones(2, 7, dtype=torch.long)
    encoder_states = torch.randn(2, 5, TINY["hidden_size"], generator=g)
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask, encoder_hidden_states=encoder_states)
        actual = model(input_ids=ids, attention_mask=mask, encoder_hidden_states=encoder_states)
    assert assert_close_to_fp32(expected, actual, mask) >= 1
