"""Longformer (``longformer``) and its attention component (``longformer``), what the shared table cannot say:
global tokens (``global_attention_mask``) on every head class, the global tokens the task classes choose themselves on
packed batches, sequences several windows long, the banded attention
probabilities against transformers' own layout, the component in another family's model (where a window covering
the whole sequence is BERT's attention), the conformance suite with a narrow window, and what is refused. Parity of
the backbone, masked LM and token classification without global tokens, hidden states, the preset and the
per-family paths: the ``longformer`` row of ``reference.py`` (``test_parity.py``, ``test_family_paths.py``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers

import bertblocks
from bertblocks.config import ConfigError
from bertblocks.core.interfaces import Head
from bertblocks.errors import InputError
from bertblocks.registry import BuildError, Registry
from tests.families.reference import FAMILIES, TOL, assert_same, batch, round_trip, save_hf

LONGFORMER = FAMILIES["longformer"]
B, C, LENGTH, REAL = 2, 3, 29, 20  # 29 tokens: past the windows of 4 and 8 keys many times over


def long_batch(cls: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A right-padded batch several windows long, global tokens at the start, in the middle and on a padded position
    (which must stay local: padding is never global), and labels of the head's kind."""
    g = torch.Generator().manual_seed(3)
    shape = (B, C, LENGTH) if cls.endswith("MultipleChoice") else (B, LENGTH)
    mask = torch.ones(shape, dtype=torch.long)
    mask[1, ..., REAL:] = 0
    ids = torch.randint(3, 99, shape, generator=g).masked_fill(mask == 0, LONGFORMER.pad)
    global_mask = torch.zeros(shape, dtype=torch.long)
    global_mask[0, ..., [0, 11, 12, 27]] = 1
    global_mask[1, ..., [0, 7, 24]] = 1  # 24 is padding
    inputs = {"input_ids": ids, "attention_mask": mask, "global_attention_mask": global_mask}
    if cls.endswith("MaskedLM"):
        inputs["labels"] = torch.randint(0, 99, shape, generator=g).masked_fill(mask == 0, -100)
    elif cls.endswith(("SequenceClassification", "MultipleChoice")):
        inputs["labels"] = torch.tensor([1, 2])
    elif cls.endswith("TokenClassification"):
        inputs["labels"] = torch.randint(0, 3, shape, generator=g).masked_fill(mask == 0, -100)
    elif cls.endswith("QuestionAnswering"):
        inputs["start_positions"], inputs["end_positions"] = torch.tensor([1, 13]), torch.tensor([4, 40])
    return inputs, mask


HEADS = (
    "LongformerForMaskedLM",
    "LongformerForSequenceClassification",
    "LongformerForTokenClassification",
    "LongformerForQuestionAnswering",
    "LongformerForMultipleChoice",
)


@pytest.mark.parametrize("cls", HEADS)
def test_every_head_with_global_tokens_on_long_padded_inputs(tmp_path, cls):
    """transformers' checkpoint loads and gives its numbers with global tokens, and bertblocks' save loads back in
    transformers; transformers pads 29 tokens to a multiple of the window, bertblocks computes the window as is."""
    inputs, mask = long_batch(cls)
    round_trip(tmp_path, LONGFORMER, cls, inputs, mask)


CHOOSING = ("LongformerForSequenceClassification", "LongformerForQuestionAnswering", "LongformerForMultipleChoice")


@pytest.mark.parametrize("cls", CHOOSING)
def test_task_classes_choose_global_tokens_as_transformers_on_packed_batches(tmp_path, cls):
    """Without ``global_attention_mask`` the classifier makes the first token global, QA the question, multiple
    choice each choice's answer (the row's question-and-context batch of reference.py); packed, the task model gives
    transformers' logits on the real tokens (padded and unpacked: test_parity.py's round trip)."""
    reference = save_hf(LONGFORMER, cls, tmp_path).eval()
    inputs, mask = batch(LONGFORMER, cls)
    assert "global_attention_mask" not in inputs
    ours = bertblocks.from_pretrained(tmp_path, ["encoder.packing=always"], head="auto").eval()
    with torch.no_grad():
        want, got = reference(**inputs), ours(**inputs)
    field = "start_logits" if cls.endswith("QuestionAnswering") else "logits"
    a, b = getattr(want, field), getattr(got, field)
    if field == "start_logits":
        a, b = a[mask.bool()], b[mask.bool()]
    assert (a - b).abs().max() <= TOL


@pytest.mark.parametrize("cls", ["LongformerForQuestionAnswering", "LongformerForMultipleChoice"])
def test_the_question_needs_three_separators_per_row(tmp_path, cls):
    """As transformers' ``_get_question_end_index``: a row without ``<s> q </s></s> c </s>`` has no question to make
    global; the error names the row and the way out (an explicit global_attention_mask, which is then used)."""
    save_hf(LONGFORMER, cls, tmp_path)
    ours = bertblocks.from_pretrained(tmp_path, head="auto").eval()
    inputs, _ = batch(LONGFORMER, cls)
    inputs["input_ids"][1, ..., 3] = 7  # the second row (each of its choices) has two separators
    with pytest.raises(
        InputError, match=r"exactly three .* rows \[.*\] of the flattened batch .* global_attention_mask"
    ):
        ours(**inputs)
    ours(**inputs, global_attention_mask=torch.zeros_like(inputs["input_ids"]))


def test_a_family_and_a_head_defaulting_the_same_input_is_refused(tmp_path, monkeypatch):
    save_hf(LONGFORMER, "LongformerForSequenceClassification", tmp_path)
    monkeypatch.setattr(Head, "input_defaults", {"global_attention_mask": lambda inputs, config: None})
    with pytest.raises(
        BuildError, match=r"longformer family and the 'dense_classification' head both .*global_attention_mask"
    ):
        bertblocks.from_pretrained(tmp_path, head="auto")


def test_backbone_with_global_tokens_and_several_windows(tmp_path):
    reference = save_hf(LONGFORMER, "LongformerModel", tmp_path)
    ours = bertblocks.from_pretrained(tmp_path).eval()
    inputs, mask = long_batch("LongformerModel")
    inputs.pop("labels", None)
    with torch.no_grad():
        assert_same(reference(**inputs), ours(**inputs), mask)
        # the global tokens change the numbers (they are read, not ignored)
        without = ours(input_ids=inputs["input_ids"], attention_mask=mask).last_hidden_state
    assert (without - ours(**inputs).last_hidden_state)[mask.bool()].abs().max() > 1e-2


def test_attention_probabilities_are_transformers_band_laid_out_in_full(tmp_path):
    """``output_attentions`` returns ``[b, h, L, L]``: transformers' banded local probabilities (``[b, h, L, G +
    w + 1]``: its global-key columns, then keys ``i - w … i + w``) and its global rows, at every real query."""
    reference = save_hf(LONGFORMER, "LongformerModel", tmp_path)
    ours = bertblocks.from_pretrained(tmp_path).eval()
    inputs, mask = long_batch("LongformerModel")
    with torch.no_grad():
        theirs = reference(**inputs, output_attentions=True)
        mine = ours(**inputs, output_attentions=True).attentions
    is_global = inputs["global_attention_mask"].bool() & mask.bool()
    most = int(is_global.sum(1).max())  # transformers' global-key columns: as many as the row with the most
    for layer, window in enumerate(LONGFORMER.settings["attention_window"]):
        w = window // 2
        local, glob = theirs.attentions[layer], theirs.global_attentions[layer]  # [b, h, L, G + 2w + 1], [b, h, L, G]
        for row in range(B):
            positions = is_global[row].nonzero()[:, 0].tolist()
            for i in range(int(mask[row].sum())):
                want = torch.zeros(LENGTH, local.shape[1])
                if i in positions:
                    want[:] = glob[row, :, :, positions.index(i)].T[:LENGTH]
                else:
                    band = local[row, :, i, most:]  # [h, 2w + 1]
                    for s in range(2 * w + 1):
                        if 0 <= i - w + s < LENGTH:
                            want[i - w + s] += band[:, s]
                    for g, j in enumerate(positions):
                        want[j] += local[row, :, i, g]
                got = mine[layer][row, :, i]  # [h, L]
                assert (got - want.T).abs().max().item() <= TOL, (layer, row, i)


def tiny_bert(attention: dict[str, Any], **encoder: Any) -> dict[str, Any]:
    """A tiny BERT config with ``attention`` (and further ``encoder`` fields)."""
    return {
        "family": "bert",
        "vocab_size": 99,
        "hidden_size": 32,
        "encoder": {"num_layers": 2, "attention": {"num_heads": 4, **attention}, **encoder},
    }


def test_the_attention_selected_in_another_family_is_bert_attention_when_the_window_covers_everything():
    """The component in a BERT model from YAML: with a window of twice the length and no global tokens every token
    sees every key, so on BERT's weights (its query/key/value and output) it gives BERT's attention."""
    torch.manual_seed(0)
    bert = bertblocks.create_model(tiny_bert({"backend": "eager"}))
    long = bertblocks.create_model(tiny_bert({"name": "longformer", "attention_window": 64}))
    missing, unexpected = long.load_state_dict(bert.state_dict(), strict=False)
    assert unexpected == []
    assert all("_global" in key for key in missing)  # only the global projections are Longformer's own
    ids = torch.randint(3, 99, (2, 21), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 21, dtype=torch.long)
    mask[1, 13:] = 0
    bert.eval(), long.eval()
    with torch.no_grad():
        a = bert(input_ids=ids, attention_mask=mask, output_attentions=True)
        b = long(input_ids=ids, attention_mask=mask, output_attentions=True)
    real = mask.bool()
    assert (a.last_hidden_state - b.last_hidden_state)[real].abs().max().item() <= TOL
    for x, y in zip(a.attentions, b.attentions, strict=True):
        assert (x - y).permute(0, 2, 1, 3)[real].abs().max().item() <= TOL
    # a narrow window changes the numbers, per layer through an override
    override = [{"layers": 1, "attention": {"attention_window": 4}}]
    narrow = bertblocks.create_model(tiny_bert({"name": "longformer", "attention_window": 64}, overrides=override))
    narrow.eval()
    narrow.load_state_dict(long.state_dict())
    with torch.no_grad():
        c = narrow(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (c - b.last_hidden_state)[real].abs().max().item() > 1e-3


def test_per_layer_windows_round_trip_through_config_json(tmp_path):
    """A list of windows becomes overrides of the layers that differ from the first, and is written back as a list;
    an int is one window for every layer."""
    from bertblocks.hf.config_json import config_from_hf, config_to_hf

    hf = LONGFORMER.hf_config(num_hidden_layers=4, attention_window=[8, 4, 8, 6])
    config = bertblocks.load_config(config_from_hf(hf))
    windows = [config.encoder.layer_spec(i, "attention").options()["attention_window"] for i in range(4)]
    assert windows == [8, 4, 8, 6]
    assert config_to_hf(config)["attention_window"] == [8, 4, 8, 6]
    same = bertblocks.load_config(config_from_hf({**hf, "attention_window": 16}))
    assert same.encoder.overrides == []
    assert config_to_hf(same)["attention_window"] == [16] * 4


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"attention_window": 0}, "attention_window"),
        ({"attention_window": [4, "8"]}, "attention_window"),
        ({"attention_window": [4, 7]}, r"attention_window=\[4, 7\].*even positive integer"),
    ],
)
def test_bad_windows_are_refused_naming_the_field(change, message):
    from bertblocks.hf.config_json import config_from_hf

    with pytest.raises(ConfigError, match=message):
        bertblocks.load_config(config_from_hf(LONGFORMER.hf_config() | change))


def test_what_the_attention_cannot_do_is_refused_with_where():
    longformer = {"name": "longformer"}
    with pytest.raises(ConfigError, match=r"encoder\.attention\.attention_window.*must be even"):
        bertblocks.create_model(tiny_bert({**longformer, "attention_window": 5}))
    with pytest.raises(ConfigError, match=r"encoder\.attention.*needs position: absolute"):
        bertblocks.create_model({**tiny_bert(longformer), "position": "rope"})
    with pytest.raises(ConfigError, match=r"encoder\.attention.*encoder's: set is_decoder: false"):
        bertblocks.create_model({**tiny_bert(longformer), "is_decoder": True})
    model = bertblocks.create_model(tiny_bert(longformer))
    ids = torch.ones(1, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"\[b, k\] padding mask"):
        model(input_ids=ids, attention_mask=torch.ones(1, 5, 5, dtype=torch.long).tril())
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'global_mask'.*global_attention_mask"):
        model(input_ids=ids, global_mask=ids)
    plain = bertblocks.create_model(tiny_bert({}))
    with pytest.raises(TypeError, match="unexpected keyword argument 'global_attention_mask'"):
        plain(input_ids=ids, global_attention_mask=ids)


def test_the_attention_passes_the_conformance_suite_with_a_narrow_window():
    """Windows of 4 keys over the suite's 9-token batches, on the padded and packed paths. What does not apply is
    skipped with the component's reasons: no backend to record (the kernel is its own), no cache, no pruning."""
    from bertblocks.testing import ConformanceSuite

    suite = ConformanceSuite(
        Registry(load_entry_points=False), options={("attention", "longformer"): {"attention_window": 4}}
    )
    report = suite.run(kinds=["attention"], names=["longformer"], exclude=["compile"])
    failed = {case: result for case, result in report.items() if not (result == "ok" or result.startswith("skipped"))}
    assert not failed, failed
    skipped = {case.rsplit("-", 1)[1] for case, result in report.items() if result.startswith("skipped")}
    assert skipped == {"mask_contract", "cache_equivalence"}, report
    assert report["attention-longformer-padding_declaration"] == "ok"  # packing is exact: nothing declared


def test_sequences_past_the_window_agree_with_transformers_at_512_tokens(tmp_path):
    """A longer sequence, one window size of the published models' shape scaled down (8 keys), no padding."""
    reference = save_hf(LONGFORMER, "LongformerModel", tmp_path, attention_window=8, max_position_embeddings=600)
    ours = bertblocks.from_pretrained(tmp_path).eval()
    ids = torch.randint(3, 99, (1, 512), generator=torch.Generator().manual_seed(5))
    global_mask = torch.zeros_like(ids)
    global_mask[0, [0, 100, 511]] = 1
    with torch.no_grad():
        expected = reference(input_ids=ids, global_attention_mask=global_mask).last_hidden_state
        got = ours(input_ids=ids, global_attention_mask=global_mask).last_hidden_state
    assert (expected - got).abs().max().item() <= TOL
    assert isinstance(reference, transformers.LongformerModel)
