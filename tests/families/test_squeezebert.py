"""SqueezeBERT (``squeezebert``), what only this family does: its grouped pointwise convolutions written out, the
pooler every transformers task class keeps, the ``grouped_conv`` components from YAML in another family, and
transformers' ``attentions`` being pre-softmax scores. Parity of every class (each projection with its own group
count), both paddings, hidden states, refusals, the preset and the per-family paths: the ``squeezebert`` row of
``tests/families/reference.py``."""

from __future__ import annotations

import torch

import bertblocks
from bertblocks.plugins.grouped_linear import GroupedLinear
from tests.families.reference import FAMILIES, batch, save_hf
from tests.tolerances import assert_close

SQUEEZEBERT = FAMILIES["squeezebert"]


def test_a_pointwise_convolution_is_each_group_through_its_own_rows():
    torch.manual_seed(0)
    conv = GroupedLinear(6, 4, groups=2, layout="conv1d").double()
    conv.reset_parameters_like_hf(0.5)
    with torch.no_grad():
        conv.bias.normal_()
    assert conv.weight.shape == (4, 3, 1)  # transformers' nn.Conv1d weight, kernel 1
    x = torch.randn(3, 5, 6, dtype=torch.float64)
    weight = conv.weight[..., 0]  # [out, in/groups]
    # written out: output rows 2g, 2g+1 read input slice g only
    expected = torch.cat([x[..., 3 * g : 3 * (g + 1)] @ weight[2 * g : 2 * (g + 1)].T for g in range(2)], -1)
    assert_close(conv(x), expected + conv.bias)


def test_every_task_model_keeps_the_pooler_as_transformers(tmp_path):
    """SqueezeBertForMaskedLM keeps ``transformer.pooler`` (BERT's would not): the family's
    ``pooler.always``, so the checkpoints match both ways (the round trip of the shared table)."""
    save_hf(SQUEEZEBERT, "SqueezeBertForMaskedLM", tmp_path)
    model = bertblocks.from_pretrained(tmp_path, head="auto")
    assert model.bert.pooler is not None
    bert = bertblocks.create_model("tiny-bert", head="masked_lm")
    assert bert.bert.pooler is None  # BERT's masked LM has none, as transformers'


def test_transformers_attentions_are_scores_ours_probabilities(tmp_path):
    """transformers' SqueezeBERT returns the masked, scaled scores as ``attentions``; bertblocks the probabilities
    (as every family): their softmax is ours."""
    reference = save_hf(SQUEEZEBERT, "SqueezeBertModel", tmp_path)
    ours = bertblocks.from_pretrained(tmp_path, ["encoder.attention.backend=eager"]).eval()
    inputs, mask = batch(SQUEEZEBERT, "SqueezeBertModel")
    with torch.no_grad():
        theirs = reference(**inputs, output_attentions=True).attentions
        got = ours(**inputs, output_attentions=True).attentions
    for scores, probabilities in zip(theirs, got, strict=True):
        rows = mask.bool()[:, None, :, None].expand_as(scores)  # real query rows
        assert_close(probabilities[rows], scores.softmax(-1)[rows])


def test_the_grouped_components_serve_another_family_from_yaml(tmp_path):
    overrides = {
        "encoder.attention.name": "grouped_conv",
        "encoder.attention.q_groups": 2,
        "encoder.feedforward.name": "grouped_conv",
        "encoder.feedforward.intermediate_size": 64,
    }
    torch.manual_seed(0)
    model = bertblocks.create_model(bertblocks.load_config("tiny-bert", overrides)).eval()
    query = model.encoder.layer_at(0).attention.self.query
    assert isinstance(query, GroupedLinear)
    assert (query.groups, query.layout) == (2, "conv1d")
    ids = torch.randint(5, 99, (2, 7))
    with torch.no_grad():
        out = model(input_ids=ids).last_hidden_state
    model.save_pretrained(tmp_path)
    again = bertblocks.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        # the same weights; oneDNN may choose another convolution algorithm for the memory-mapped weights
        assert_close(again(input_ids=ids).last_hidden_state, out)
