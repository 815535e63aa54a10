"""What only DeBERTa-v2/v3 (``deberta-v2``) does. The v3 settings under the backbone and every task class, the
packed and padded paths, hidden states and attentions, refusals naming the field, the tokenizer convention and the
presets are rows of the shared family tables (``reference.py``, ``test_parity.py``, ``test_family_paths.py``);
here: parity both ways with transformers' own classes for the variants of the disentangled attention and the
ConvLayer, long sequences, pruning, token types, the non-legacy masked LM, gradients, every position (padded
ones included), and the extension points the family is built through (a shared position term, a per-layer term
reading the layer's projections, position factories told the model's sizes)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import bertblocks
from bertblocks.core.component import Component
from bertblocks.core.interfaces import ModelDims, PositionScheme, SharedPositionBias, SharedPositionTerm
from bertblocks.plugins.disentangled import RelativeTable, log_bucket_position
from bertblocks.registry import Registry
from tests.conftest import TINY
from tests.families.reference import FAMILIES, TOL, Family, batch, round_trip, save_hf
from tests.tolerances import assert_grads_close

#: the table's row (tests/families/reference.py): the v3 settings, the backbone and every task class, whose load →
#: compare → save → reload-in-transformers round trip test_parity.py runs; here the variants and what only DeBERTa does
DEBERTA = FAMILIES["deberta-v2"]
V3 = DEBERTA.settings
#: the task classes the variants do not run (they run the backbone and the sequence classifier)
OTHER_HEADS = [c for c in DEBERTA.classes if c not in ("DebertaV2Model", "DebertaV2ForSequenceClassification")]


#: each variant changes what a wrong reading of it would show in the numbers
VARIANTS = {
    # few buckets over a short span: distances beyond 2 are log-bucketed and clamped in the 9-token batch
    "log-buckets": {"position_buckets": 4, "max_relative_positions": 16},
    # no buckets, a span shorter than the batch: the table's ends are clamped
    "exact-clamped": {"position_buckets": -1, "max_relative_positions": 3},
    # own position projections (pos_key_proj, pos_query_proj), no table norm
    "own-projections": {"share_att_key": False, "norm_rel_ebd": "none"},
    "c2p-only": {"pos_att_type": ["c2p"], "share_att_key": False},
    "p2c-only": {"pos_att_type": "p2c"},
    # DeBERTa-v2's absolute table and token types, a tanh pooler
    "v2-absolute": {"position_biased_input": True, "type_vocab_size": 2, "pooler_hidden_act": "tanh"},
    # the ConvLayer after the first layer (mDeBERTa-v2 / DeBERTa-v2-xlarge have it)
    "conv": {"conv_kernel_size": 3},
    "conv-grouped": {"conv_kernel_size": 5, "conv_groups": 4, "conv_act": "gelu"},
    # DebertaV2Config's defaults: no relative table, absolute positions; the terms still widen the denominator
    "absolute-only": {"relative_attention": False, "position_biased_input": True, "norm_rel_ebd": "none"},
    "absolute-scaled": {
        "relative_attention": False,
        "position_biased_input": True,
        "norm_rel_ebd": "none",
        "pos_att_type": ["c2p"],
    },
    # relative attention with no term: the table exists (and is stored), nothing reads it
    "no-terms": {"pos_att_type": []},
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("cls", ["DebertaV2Model", "DebertaV2ForSequenceClassification"])
def test_variants_match_transformers_both_ways(tmp_path, variant, cls):
    round_trip(tmp_path, DEBERTA, cls, **VARIANTS[variant])


@pytest.mark.parametrize("cls", OTHER_HEADS)
def test_the_conv_layer_under_every_head(tmp_path, cls):
    round_trip(tmp_path, DEBERTA, cls, conv_kernel_size=3)


@pytest.mark.parametrize("left", [False, True])
def test_the_packed_path_through_the_conv_layer_gives_transformers_numbers(tmp_path, left):
    """The ConvLayer unpacks the packed tokens for its convolution over each sequence (the plain v3 model's
    packed path is in test_parity.py's table)."""
    reference = save_hf(DEBERTA, "DebertaV2Model", tmp_path, conv_kernel_size=3)
    inputs, mask = batch(DEBERTA, "DebertaV2Model", left=left)
    inputs = {k: v for k, v in inputs.items() if k != "token_type_ids"}
    ours = bertblocks.from_pretrained(tmp_path, ["encoder.packing=always"]).eval()
    with torch.no_grad():
        expected = reference(**inputs).last_hidden_state[mask.bool()]
        got = ours(**inputs).last_hidden_state[mask.bool()]
    assert (expected - got).abs().max().item() <= TOL


def test_sequences_longer_than_max_position_embeddings_without_an_absolute_table(tmp_path):
    """Every distance has a bucket: transformers' DeBERTa-v3 reads any length, and so does bertblocks; with the
    absolute table (position_biased_input) the length is bounded."""
    reference = save_hf(DEBERTA, "DebertaV2Model", tmp_path / "v3")
    ids = torch.randint(3, 99, (2, 150), generator=torch.Generator().manual_seed(3))  # max_position_embeddings 64
    mask = torch.ones_like(ids)
    mask[1, 100:] = 0
    ours = bertblocks.from_pretrained(tmp_path / "v3").eval()
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
        got = ours(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
    assert (expected - got).abs().max().item() <= TOL
    save_hf(DEBERTA, "DebertaV2Model", tmp_path / "v2", position_biased_input=True)
    with pytest.raises(ValueError, match="exceeds max_position_embeddings=64"):
        bertblocks.from_pretrained(tmp_path / "v2")(input_ids=ids)


def test_pruning_projects_the_table_with_the_kept_heads_only(tmp_path):
    save_hf(DEBERTA, "DebertaV2Model", tmp_path / "shared")
    model = bertblocks.from_pretrained(tmp_path / "shared").eval()
    ids = torch.randint(3, 99, (1, 7))
    head_mask = torch.ones(2, 4)
    head_mask[0, 1:3] = 0
    with torch.no_grad():
        masked = model(input_ids=ids, head_mask=head_mask).last_hidden_state
        model.prune_heads({0: [1, 2]})
        pruned = model(input_ids=ids).last_hidden_state
    assert (masked - pruned).abs().max().item() <= TOL  # the table went through the kept heads' projections only
    save_hf(DEBERTA, "DebertaV2Model", tmp_path / "own", share_att_key=False)
    model = bertblocks.from_pretrained(tmp_path / "own").eval()
    model.prune_heads({0: [1]})
    with pytest.raises(ValueError, match="share_att_key"):
        model(input_ids=ids)


def test_token_types_of_a_v2_model_are_read(tmp_path):
    family = Family("DebertaV2Config", {**V3, "type_vocab_size": 2}, pad=0, second_segment=3)
    round_trip(tmp_path, family, "DebertaV2Model")


def test_token_type_ids_are_ignored_without_a_table(tmp_path):
    save_hf(DEBERTA, "DebertaV2Model", tmp_path)
    ours = bertblocks.from_pretrained(tmp_path, head="auto").eval()
    inputs, _ = batch(DEBERTA, "DebertaV2Model")
    with torch.no_grad():
        a = ours(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).last_hidden_state
        b = ours(**{**inputs, "token_type_ids": torch.ones_like(inputs["input_ids"])}).last_hidden_state
    assert torch.equal(a, b)
    assert not any("token_type" in k for k in ours.state_dict())


def test_log_buckets_are_transformers_own():
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    relative = torch.arange(-600, 600)[:, None] - torch.arange(0, 3)[None, :]
    assert torch.equal(log_bucket_position(relative, 256, 512), make_log_bucket_position(relative, 256, 512))


def test_the_non_legacy_masked_lm_layout_loads_into_the_same_head(tmp_path):
    """legacy: false stores the masked LM as ``lm_predictions.lm_head.*`` (the published checkpoints' layout): it
    loads, gives transformers' numbers, and is written back under the legacy names, which transformers reads
    (``round_trip`` compares both); the EnhancedMaskDecoder's ``mask_predictions.*`` are dropped, as transformers
    drops them."""
    round_trip(tmp_path / "a", DEBERTA, "DebertaV2ForMaskedLM", legacy=False)
    reference = save_hf(DEBERTA, "DebertaV2ForMaskedLM", tmp_path / "b", legacy=False)
    state = load_file(tmp_path / "b" / "model.safetensors")
    assert any(k.startswith("lm_predictions.lm_head.") for k in state)
    save_file({**state, "mask_predictions.dense.weight": torch.zeros(2, 2)}, tmp_path / "b" / "model.safetensors")
    ours, info = bertblocks.from_pretrained(tmp_path / "b", head="auto", output_loading_info=True)
    assert (info.missing_keys, info.unexpected_keys) == ([], [])
    inputs, mask = batch(DEBERTA, "DebertaV2ForMaskedLM")
    with torch.no_grad():
        diff = (reference(**inputs).logits - ours.eval()(**inputs).logits)[mask.bool()].abs().max().item()
    assert diff <= TOL


def test_presets_of_the_published_checkpoints():
    for name, (hidden, layers) in {
        "deberta-v3-xsmall": (384, 12),
        "deberta-v3-small": (768, 6),
        "deberta-v3-base": (768, 12),
        "deberta-v3-large": (1024, 24),
        "mdeberta-v3-base": (768, 12),
    }.items():
        cfg = bertblocks.load_config(name)
        assert (cfg.family, cfg.hidden_size, cfg.encoder.num_layers, cfg.type_vocab_size) == (
            "deberta-v2",
            hidden,
            layers,
            0,
        )
        assert cfg.position.name == "disentangled"


# ------------------------------------------------------------------------------------- extension points
def test_the_scheme_works_in_a_hybrid_with_other_blocks():
    """The position scheme is a general component: a pre-LN GLU model with it builds, runs and trains."""
    config = copy.deepcopy(TINY)
    config["position"] = {"name": "disentangled", "position_buckets": 8, "max_relative_positions": 32}
    config["encoder"]["layer"] = {"name": "pre_ln"}
    config["encoder"]["feedforward"] = {**config["encoder"]["feedforward"], "name": "glu"}
    model = bertblocks.create_model(config)
    assert "encoder.rel_embeddings.weight" in model.state_dict()
    ids = torch.randint(0, 99, (2, 7))
    out = model(input_ids=ids).last_hidden_state
    out.sum().backward()
    assert model.encoder.rel_embeddings.weight.grad is not None  # the shared table learns through every layer
    assert model.encoder.layer[0].attention.self.query.weight.grad is not None


def _registry_with(*components: Component) -> Registry:
    registry = Registry(load_entry_points=False)
    registry.register(
        type("P", (), {"bertblocks_register_components": staticmethod(lambda: list(components))}), name="p"
    )
    return registry


def test_a_position_factory_is_told_the_model_sizes():
    told: list[ModelDims] = []

    def factory(*, max_positions: int, options: Any, model: ModelDims) -> PositionScheme:
        told.append(model)
        return PositionScheme(max_positions)

    config = copy.deepcopy(TINY)
    config["position"] = {"name": "told"}
    bertblocks.create_model(config, registry=_registry_with(Component("position", "told", factory)))
    assert told[0] == ModelDims(
        hidden_size=32, num_heads=4, num_layers=2, layer_norm_eps=1e-12, hidden_dropout=0.1, max_positions=64
    )


def test_a_shared_term_of_the_wrong_type_is_refused_naming_it():
    class Wrong(SharedPositionTerm):
        module_name = "wrong_term"
        produces = RelativeTable

        def forward(self, positions, dtype):
            return torch.zeros(3)

    class Scheme(PositionScheme):
        def shared_terms(self, model):
            return [Wrong()]

    config = copy.deepcopy(TINY)
    config["position"] = {"name": "wrong"}
    registry = _registry_with(
        Component("position", "wrong", lambda *, max_positions, model, options: Scheme(max_positions))
    )
    model = bertblocks.create_model(config, registry=registry)
    with pytest.raises(TypeError, match=r"Wrong .*encoder.wrong_term.* not the RelativeTable"):
        model(input_ids=torch.ones(1, 4, dtype=torch.long))


def test_a_shared_bias_of_the_wrong_shape_is_refused():
    class Table(SharedPositionBias):
        def forward(self, positions, dtype):
            return torch.zeros(5, 8)  # a table, not a [1, h, q, k] score bias

    class Scheme(PositionScheme):
        def shared_bias(self, num_heads):
            return Table()

    config = copy.deepcopy(TINY)
    config["position"] = {"name": "table"}
    registry = _registry_with(
        Component("position", "table", lambda *, max_positions, model, options: Scheme(max_positions))
    )
    model = bertblocks.create_model(config, registry=registry)
    with pytest.raises(ValueError, match=r"returned \(5, 8\); a score bias must be \[1\|b, h, 4, 4\]"):
        model(input_ids=torch.ones(1, 4, dtype=torch.long))


@pytest.mark.parametrize("length", [9, 40])
def test_eager_projects_only_the_rows_of_the_table_it_reads_and_agrees_with_the_whole_table(
    tmp_path, monkeypatch, length
):
    """Eagerly, the c2p/p2c products are taken against the rows of the relative table some (query, key) pair reads
    (a batch shorter than the buckets reaches fewer than 2·span); a graph, which cannot shape a tensor by data,
    takes the rows the distances bound (the log buckets never exceed the distance: ``RelativeTable.contracting``),
    one row of margin each side. Both give the same hidden states and gradients; the eager one projects fewest."""
    from bertblocks.plugins.disentangled import DisentangledBias

    settings = {**FAMILIES["deberta-v2"].settings, "max_position_embeddings": 64, "position_buckets": 32}
    torch.manual_seed(0)
    transformers.DebertaV2Model(transformers.DebertaV2Config(**settings)).save_pretrained(tmp_path)
    ids = torch.randint(3, 99, (2, length))
    probe = torch.randn(2, length, 32)
    projected: list[int] = []
    project = DisentangledBias._project

    def counting(self: DisentangledBias, rel: torch.Tensor, *args: Any) -> torch.Tensor:
        projected.append(rel.shape[0])
        return project(self, rel, *args)

    monkeypatch.setattr(DisentangledBias, "_project", counting)

    def run(compiling: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
        model = bertblocks.from_pretrained(tmp_path).eval()  # no dropout: the same arithmetic twice
        out = model(input_ids=ids).last_hidden_state
        # a fixed random direction: the sum of squares of LayerNorm outputs is nearly constant, so its gradient
        # reaching the embeddings is rounding noise (1e-5 of float64's), which no tolerance tells from a bug
        (out * probe).sum().backward()
        return out.detach(), {name: p.grad for name, p in model.named_parameters() if p.grad is not None}

    whole, whole_grads = run(compiling=True)
    bound = min(2 * 32, 2 * (length - 1) + 3)  # distances -(length - 1) … length - 1, a row of margin each side
    assert set(projected) == {bound}
    projected.clear()
    sliced, sliced_grads = run(compiling=False)
    distance = torch.tensor(length - 1)
    reach = int(log_bucket_position(distance, 32, 64))  # the farthest bucket the batch reads
    assert set(projected) == {2 * reach + 1}
    assert 2 * reach + 1 < bound
    assert (whole - sliced).abs().max().item() <= TOL
    assert whole_grads.keys() == sliced_grads.keys()
    for name, grad in whole_grads.items():
        assert_grads_close(sliced_grads[name], grad, what=name)


def test_torch_compile_gives_transformers_numbers_in_one_graph(tmp_path):
    """One graph (fullgraph): the table, its buckets, both terms and the ConvLayer stay traceable; a compiled
    model packs every 2-D mask, so the convolution's unpacking is traced too."""
    reference = save_hf(DEBERTA, "DebertaV2Model", tmp_path, conv_kernel_size=3)
    inputs, mask = batch(DEBERTA, "DebertaV2Model")
    compiled = torch.compile(bertblocks.from_pretrained(tmp_path).eval(), fullgraph=True)
    with torch.no_grad():
        expected = reference(**inputs).last_hidden_state[mask.bool()]
        got = compiled(**inputs).last_hidden_state[mask.bool()]
    assert (expected - got).abs().max().item() <= TOL


def test_the_tokenizer_convention_is_transformers_deberta_v2_tokenizer(tmp_path):
    """A SentencePiece-style (Unigram) tokenizer.json with DeBERTa-v3's specials and its own post-processor:
    bertblocks' tokenizer gives the ids, token types and special ids of transformers' DebertaV2Tokenizer on the
    same files (without a post-processor, the family's template: test_parity.py's tokenizer table)."""
    from bertblocks import BertTokenizer
    from tests.families import test_tokenizers as toks
    from tests.families.reference import deberta_unigram

    tok = deberta_unigram()
    tok.post_processor = toks.bert_processor(tok)
    directory = toks.save(tmp_path, tok, "DebertaV2Tokenizer")
    (directory / "config.json").write_text('{"model_type": "deberta-v2"}')
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    assert type(theirs).__name__ == "DebertaV2Tokenizer"
    ours = BertTokenizer.from_pretrained(directory)
    for args in ((toks.TEXTS,), (toks.TEXTS, toks.PAIRS)):
        expected = theirs(*args, padding=True, return_tensors="pt")
        got = ours(*args)
        assert sorted(got) == sorted(expected.keys())
        for key in got:
            assert got[key].tolist() == expected[key].tolist(), key
    assert (ours.pad_token_id, ours.mask_token_id, ours.unk_token_id) == (
        theirs.pad_token_id,
        theirs.mask_token_id,
        theirs.unk_token_id,
    )


def test_gradients_match_transformers(tmp_path):
    """Backward through the shared table, its norm, both terms and the layer's own projections: the gradients of
    the loss equal transformers' (dropout off), relative to their magnitude."""
    settings = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "conv_kernel_size": 3}
    reference = save_hf(DEBERTA, "DebertaV2ForSequenceClassification", tmp_path, **settings).train()
    ours = bertblocks.from_pretrained(tmp_path, head="auto").train()
    inputs, _ = batch(DEBERTA, "DebertaV2ForSequenceClassification")
    reference(**inputs).loss.backward()
    ours(**inputs).loss.backward()
    theirs, mine = dict(reference.named_parameters()), dict(ours.named_parameters())
    pairs = {
        "deberta.encoder.rel_embeddings.weight": "bert.encoder.rel_embeddings.weight",
        "deberta.encoder.LayerNorm.weight": "bert.encoder.rel_embeddings.LayerNorm.weight",
        "deberta.encoder.layer.0.attention.self.query_proj.weight": "bert.encoder.layer.0.attention.self.query.weight",
        "deberta.encoder.layer.1.attention.self.key_proj.bias": "bert.encoder.layer.1.attention.self.key.bias",
        "deberta.encoder.conv.conv.weight": "bert.encoder.layer.0.conv.conv.weight",
        "deberta.embeddings.word_embeddings.weight": "bert.embeddings.word_embeddings.weight",
        "pooler.dense.weight": "bert.pooler.dense.weight",
    }
    for hf_name, name in pairs.items():
        a, b = theirs[hf_name].grad, mine[name].grad
        assert a is not None, hf_name
        assert b is not None, name
        assert a.abs().max().item() > 0, hf_name  # the parameter is on the loss's path
        assert_grads_close(b, a, what=name)


def test_attentions_and_hidden_states_match_at_every_position(tmp_path):
    """transformers masks padding on both sides: padded queries attend uniformly and padded embeddings are zero.
    On the padded path (packing off) every position matches, padded ones included, and so do the probabilities."""
    reference = save_hf(DEBERTA, "DebertaV2Model", tmp_path)
    ours = bertblocks.from_pretrained(tmp_path, ["encoder.packing=never"], attn_implementation="eager").eval()
    inputs, mask = batch(DEBERTA, "DebertaV2Model")
    assert (mask == 0).any()
    with torch.no_grad():
        theirs = reference(**inputs, output_attentions=True, output_hidden_states=True)
        mine = ours(**inputs, output_attentions=True, output_hidden_states=True)
    pairs = [*zip(theirs.attentions, mine.attentions, strict=True)]
    pairs += [*zip(theirs.hidden_states, mine.hidden_states, strict=True)]
    for a, b in pairs:
        assert a.shape == b.shape
        assert (a - b).abs().max().item() <= TOL
