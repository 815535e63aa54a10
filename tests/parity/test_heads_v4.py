"""Every task head on relative-position backbones, against transformers 4.46.3 golden outputs.

transformers 5 dropped relative positions, so these parities come from ``tests/fixtures/v4/head_*`` (made by
``tests/fixtures/v4/make_fixtures.py`` with transformers 4.46.3, eager attention, fp32, eval mode): logits and
loss with labels, and the backbone's last hidden state, on the checkpoints stored beside them.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

import bertblocks
from tests.conftest import V4, max_diff
from tests.tolerances import assert_close

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# case → (class bertblocks must pick from `architectures`, label tensors, output tensors)
CASES = {
    "head_mlm_relative_key": ("BertForMaskedLM", ("labels",), ("logits",)),
    "head_seqcls_relative_key": ("BertForSequenceClassification", ("labels",), ("logits",)),
    "head_pretraining_relative_key_query": (
        "BertForPreTraining",
        ("labels", "next_sentence_label"),
        ("prediction_logits", "seq_relationship_logits"),
    ),
    "head_tokcls_relative_key": ("BertForTokenClassification", ("labels",), ("logits",)),
    "head_qa_relative_key": (
        "BertForQuestionAnswering",
        ("start_positions", "end_positions"),
        ("start_logits", "end_logits"),
    ),
    "head_multiplechoice_relative_key": ("BertForMultipleChoice", ("labels",), ("logits",)),
    "head_nsp_relative_key": ("BertForNextSentencePrediction", ("labels",), ("logits",)),
}


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
def test_head_matches_transformers_4(case, backend):
    class_name, label_names, output_names = CASES[case]
    io = load_file(V4 / case / "io.safetensors")
    model, info = bertblocks.from_pretrained(
        V4 / case, head="auto", attn_implementation=backend, output_loading_info=True
    )
    assert type(model).__name__ == class_name
    # v4 writes an unused absolute position table for relative models; nothing else may be left over
    assert info.ignored_keys == ["bert.embeddings.position_embeddings.weight"]
    assert not info.missing_keys
    assert not info.unexpected_keys
    model.eval()
    inputs = {k: io[k] for k in INPUTS}
    with torch.no_grad():
        out = model(**inputs, **{k: io[k] for k in label_names}, output_hidden_states=True)
        unlabelled = model(**inputs)
    for name in output_names:
        assert_close(out[name], io[name], what=name)
        assert_close(unlabelled[name], io[name], what=name)
    assert_close(out.loss, io["loss"])
    assert unlabelled.loss is None
    assert_close(out.hidden_states[-1], io["last_hidden_state"])


def test_qa_fixture_clamps_an_out_of_range_start_and_ignores_it():
    """start_positions [2, 100]: 100 clamps to seq_len, the ignore index, so only example 0's start counts."""
    io = load_file(V4 / "head_qa_relative_key" / "io.safetensors")
    model = bertblocks.BertForQuestionAnswering.from_pretrained(V4 / "head_qa_relative_key").eval()
    inputs = {k: io[k] for k in INPUTS}
    with torch.no_grad():
        out = model(**inputs, start_positions=io["start_positions"], end_positions=io["end_positions"])
        only_first = model(
            **inputs, start_positions=torch.tensor([2, 7]), end_positions=io["end_positions"]
        )  # 7 = seq_len: ignored explicitly
    assert io["start_positions"].tolist() == [2, 100]
    assert_close(out.loss, io["loss"])
    assert max_diff(only_first.loss, out.loss) == 0  # an ignored position changes no computation


def test_fixture_head_checkpoint_round_trips_through_save(tmp_path):
    """A v4 pre-training checkpoint saved by bertblocks loads back to the same numbers (tied keys not written)."""
    case = "head_pretraining_relative_key_query"
    io = load_file(V4 / case / "io.safetensors")
    model = bertblocks.BertForPreTraining.from_pretrained(V4 / case).eval()
    model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert "cls.predictions.decoder.weight" not in saved
    assert "cls.predictions.decoder.bias" not in saved
    assert "bert.embeddings.position_embeddings.weight" not in saved  # relative: no unused table
    again, info = bertblocks.from_pretrained(tmp_path, head="auto", output_loading_info=True)
    assert isinstance(again, bertblocks.BertForPreTraining)
    assert not info.missing_keys
    assert not info.unexpected_keys
    assert not info.ignored_keys
    inputs = {k: io[k] for k in INPUTS}
    with torch.no_grad():
        out = again.eval()(**inputs)
    assert_close(out.prediction_logits, io["prediction_logits"])


@pytest.mark.parametrize("case", ["decoder_absolute", "decoder_relative_key", "decoder_relative_key_query"])
def test_causal_lm_head_on_v4_decoders_gives_logits_and_shifted_loss(case):
    """The causal-LM head in decoder mode (cross-attention): full-forward logits and loss of v4's
    BertLMHeadModel; with labels no cache is built, as in transformers."""
    io = load_file(V4 / case / "io.safetensors")
    model = bertblocks.from_pretrained(V4 / case, head="auto").eval()
    assert isinstance(model, bertblocks.BertLMHeadModel)
    assert model.config.is_decoder
    inputs = {k: io[k] for k in ("input_ids", "attention_mask", "encoder_hidden_states", "encoder_attention_mask")}
    with torch.no_grad():
        out = model(**inputs, labels=io["labels"])
    assert_close(out.logits, io["logits"])
    assert_close(out.loss, io["loss"])
    assert out.past_key_values is None
