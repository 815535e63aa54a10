"""BigBird beyond the shared row of reference.py: the block-sparse attention at lengths past several blocks (eval and
training, padded), the full-attention fallback for short inputs, the decoder, the kernel against its dense
equivalent, the attention in another family (BERT), and the conformance suite on the component."""

from __future__ import annotations

import dataclasses
import logging
import types

import pytest
import torch
import transformers

import bertblocks
from bertblocks.plugins.block_sparse import (
    block_sparse_attention,
    dense_block_mask,
    full_attention_limit,
    key_blocks,
    random_blocks,
)
from bertblocks.registry import Registry
from bertblocks.testing import ConformanceError, ConformanceSuite
from tests.families.reference import COMMON, TOL
from tests.tolerances import assert_close, assert_identical

SETTINGS = {**COMMON, "block_size": 2, "num_random_blocks": 1, "rescale_embeddings": True, "layer_norm_eps": 1e-5}


def _pair(tmp_path, cls="BigBirdModel", **extra):
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    theirs = getattr(transformers, cls)(transformers.BigBirdConfig(**{**SETTINGS, **extra}))
    theirs.save_pretrained(tmp_path)
    ours = bertblocks.from_pretrained(tmp_path, head="auto")
    return theirs, ours


def _batch(length, real):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 99, (2, length), generator=g)
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, real:] = 0
    return ids.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("length", [15, 23, 40, 63])  # past (5 + 2)·2 = 14: block-sparse, padded to blocks of 2
@pytest.mark.parametrize("training", [False, True])
def test_long_inputs_equal_transformers_in_eval_and_training(tmp_path, length, training):
    """Eval: every random block is block 0, as transformers'; training (dropout 0): transformers' numpy draws,
    seeded by the layer index."""
    theirs, ours = _pair(tmp_path, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    theirs.train(training)
    ours.train(training)
    ids, mask = _batch(length, length - 6)
    with torch.no_grad():
        want, got = theirs(input_ids=ids, attention_mask=mask), ours(input_ids=ids, attention_mask=mask)
    real = mask.bool()
    assert (want.last_hidden_state - got.last_hidden_state)[real].abs().max() <= TOL
    assert (want.pooler_output - got.pooler_output).abs().max() <= TOL


def test_short_inputs_fall_back_to_full_attention_per_call(tmp_path):
    """At most (5 + 2r)·bs tokens run full attention, as transformers; bertblocks decides per call, where
    transformers switches the model to full attention for good (compared on a fresh model)."""
    assert full_attention_limit(2, 1) == 14
    theirs, ours = _pair(tmp_path)
    theirs.eval()
    ours.eval()
    ids, mask = _batch(14, 9)
    with torch.no_grad():
        assert (theirs(input_ids=ids, attention_mask=mask).last_hidden_state - ours(ids, mask).last_hidden_state)[
            mask.bool()
        ].abs().max() <= TOL
        assert theirs.attention_type == "original_full"  # transformers' switch, kept by the model
        long_ids, long_mask = _batch(30, 30)
        sparse = ours(long_ids, long_mask).last_hidden_state
        fresh = transformers.BigBirdModel.from_pretrained(tmp_path).eval()
        assert (fresh(input_ids=long_ids, attention_mask=long_mask).last_hidden_state - sparse).abs().max() <= TOL
        # and the switched transformers model now gives full attention's (different) numbers
        assert (theirs(input_ids=long_ids, attention_mask=long_mask).last_hidden_state - sparse).abs().max() > 1e-3


@pytest.mark.parametrize("length", [12, 30])  # full attention (≤ 14 tokens) and block-sparse
@pytest.mark.parametrize(
    "given",
    ["nothing", "question_lengths", "token_type_ids", "inputs_embeds", "no_sep"],
)
def test_question_answering_finds_the_question_as_transformers(tmp_path, length, given):
    """``BigBirdForQuestionAnswering`` without ``question_lengths`` ends the question at the first ``sep_token_id``,
    lowers the question's logits (the first token's aside) by 10⁶ and, without token types, types the question 0 and
    the rest 1; with ``question_lengths`` it reads them; from ``inputs_embeds`` (no ids to search) it masks nothing;
    a row without a separator has a question of length 1 (nothing masked). Loss included; a fresh transformers model
    per length (it switches to full attention for good on a short input)."""
    theirs, ours = _pair(tmp_path, cls="BigBirdForQuestionAnswering", sep_token_id=2)
    theirs.eval()
    ours.eval()
    assert ours.bert.pooler is None  # add_pooling_layer=False, unlike BigBird's other classes
    ids, mask = _batch(length, length - 4)
    ids[0, 4] = ids[1, 6] = ids[:, 8] = 2  # questions of 5 and 7 tokens (the first separator counts)
    inputs = {"input_ids": ids, "attention_mask": mask}
    labels = {"start_positions": torch.tensor([7, 9]), "end_positions": torch.tensor([9, 50])}
    if given == "question_lengths":
        inputs["question_lengths"] = torch.tensor([[3], [6]])
    elif given == "token_type_ids":
        inputs["token_type_ids"] = torch.zeros_like(ids)
    elif given == "inputs_embeds":
        inputs = {"inputs_embeds": theirs.get_input_embeddings()(ids), "attention_mask": mask}
    elif given == "no_sep":
        inputs["input_ids"] = ids.masked_fill(ids == 2, 5)
    with torch.no_grad():
        want, got = theirs(**inputs, **labels), ours(**inputs, **labels)
    real = mask.bool()
    for field in ("start_logits", "end_logits"):
        assert (getattr(want, field) - getattr(got, field))[real].abs().max() <= TOL, field
    assert (want.loss - got.loss).abs() <= TOL
    masked = (got.start_logits < -1e5).sum(1).tolist()
    expected = {"nothing": [4, 6], "question_lengths": [2, 5], "token_type_ids": [4, 6]}.get(given, [0, 0])
    assert masked == expected


def test_question_answering_refuses_question_lengths_of_another_shape(tmp_path):
    _, ours = _pair(tmp_path, cls="BigBirdForQuestionAnswering", sep_token_id=2)
    ids, mask = _batch(12, 8)
    with pytest.raises(
        bertblocks.errors.InputError, match=r"question_lengths must be an integer tensor of shape \(2, 1\)"
    ):
        ours(input_ids=ids, attention_mask=mask, question_lengths=torch.tensor([3, 4, 5]))


def test_causal_lm_attends_causally_at_any_length(tmp_path):
    """Short: transformers' numbers. Long: bertblocks stays causal (a later token changes no earlier output),
    where transformers' block-sparse path ignores causality."""
    theirs, ours = _pair(tmp_path / "lm", cls="BigBirdForCausalLM", is_decoder=True)
    theirs.eval()
    ours.eval()
    ids, mask = _batch(12, 8)
    with torch.no_grad():
        want, got = theirs(input_ids=ids, attention_mask=mask).logits, ours(input_ids=ids, attention_mask=mask).logits
        assert (want - got)[mask.bool()].abs().max() <= TOL
        long_ids, _ = _batch(30, 30)
        changed = long_ids.clone()
        changed[:, -1] = 5
        a, b = ours(input_ids=long_ids).logits, ours(input_ids=changed).logits
        assert (a[:, :-1] - b[:, :-1]).abs().max() == 0


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize(("length", "bs", "r"), [(24, 2, 1), (40, 4, 2), (1024, 64, 3)])
def test_gathered_kernel_equals_its_dense_equivalent(length, bs, r, training):
    """The gathered kernel (memory linear in the length) equals softmax over the dense [b, h, L, L] mask with
    log-multiplicities, in float64."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, length, 8, generator=g, dtype=torch.float64) for _ in range(3))
    key_mask = torch.zeros(2, length, dtype=torch.float64)
    key_mask[1, length - 5 :] = torch.finfo(torch.float64).min
    rand = random_blocks(length, bs, 4, r, training=training, seed=1, max_positions=4096)
    blocks, valid = key_blocks(length // bs, rand)
    got = block_sparse_attention(q, k, v, key_mask, blocks, valid, bs, 8**-0.5)
    dense = dense_block_mask(key_mask, blocks, valid, bs)
    want = ((q @ k.transpose(-1, -2)) * 8**-0.5 + dense).softmax(-1) @ v
    assert (got - want).abs().max() < 1e-10


def test_block_sparse_attention_in_a_bert_model():
    """The component in another family: a BERT config selects it; long inputs run sparse (differ from full
    attention), and the probabilities (dense path) describe the sparse output."""
    config = {
        "family": "bert",
        "vocab_size": 99,
        "hidden_size": 32,
        "max_position_embeddings": 64,
        "encoder": {
            "num_layers": 2,
            "attention": {"name": "block_sparse", "num_heads": 4, "block_size": 2, "num_random_blocks": 1},
            "feedforward": {"intermediate_size": 37},
        },
    }
    torch.manual_seed(0)
    model = bertblocks.create_model(config).eval()
    full = bertblocks.create_model(config, overrides=["encoder.attention.attention_type=original_full"]).eval()
    full.load_state_dict(model.state_dict())
    ids, mask = _batch(30, 22)
    with torch.no_grad():
        out = model(ids, mask, output_attentions=True)
        plain = model(ids, mask).last_hidden_state
        dense = full(ids, mask).last_hidden_state
    real = mask.bool()
    assert (out.last_hidden_state - plain)[real].abs().max() <= TOL
    assert (plain - dense)[real].abs().max() > 1e-3
    probabilities = out.attentions[0]  # [b, h, L, L]: zero outside the blocks each query sees
    assert probabilities.shape == (2, 4, 30, 30)
    assert torch.allclose(probabilities.sum(-1)[real[:, None].expand(2, 4, 30)], torch.ones(()), atol=1e-5)
    assert (probabilities[0, :, 10, 14:28] == 0).all()  # block 5 sees blocks 0, 4-6, 14 and block 0 again


def test_position_score_bias_is_refused():
    config = {
        "vocab_size": 99,
        "hidden_size": 32,
        "max_position_embeddings": 64,
        "position": "relative_key",
        "encoder": {"num_layers": 1, "attention": {"name": "block_sparse", "num_heads": 4}},
    }
    with pytest.raises(bertblocks.registry.BuildError, match="takes no position score bias"):
        bertblocks.create_model(config)


REGISTRY = Registry(load_entry_points=False)
#: blocks of 1 with one random block: the suite's 9-token batch runs block-sparse (limit 7); the defaults run full
ENGAGED = ConformanceSuite(REGISTRY, options={("attention", "block_sparse"): {"block_size": 1, "num_random_blocks": 1}})
FULL = ConformanceSuite(REGISTRY)


# the defaults' other checks are tests/test_conformance.py's `attention-block_sparse` cases (the same options and
# config): here only the compile check, which runs there under aot_eager and here under inductor (code generation)
@pytest.mark.parametrize("case", FULL.params(kinds=["attention"], names=["block_sparse"], include=["compile"]))
def test_conformance_full_attention_options(case):
    case.run()


# excluded on the engaged options, each for a property of BigBird itself: `determinism` (training draws random
# blocks, as transformers does, so training with dropout 0 differs from eval: test_long_inputs_... checks
# training against transformers) and `mask_contract` on packing (packed, each sequence attends alone with its own
# block layout, not through the padded backend call; the padded path's calls pass the check in ENGAGED's run)
@pytest.mark.parametrize(
    "case", ENGAGED.params(kinds=["attention"], names=["block_sparse"], exclude=["determinism", "mask_contract"])
)
def test_conformance_block_sparse(case):
    case.run()


def test_chunked_gather_equals_one_chunk(monkeypatch):
    """The sparse kernel gathers CHUNK_TOKENS queries' key blocks at a time; the chunks change no number."""
    import bertblocks.plugins.block_sparse as block_sparse

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 80, 8, generator=g, dtype=torch.float64) for _ in range(3))
    key_mask = torch.zeros(2, 80, dtype=torch.float64)
    key_mask[1, 70:] = torch.finfo(torch.float64).min
    blocks, valid = key_blocks(20, random_blocks(80, 4, 4, 2, training=True, seed=1, max_positions=4096))
    whole = block_sparse_attention(q, k, v, key_mask, blocks, valid, 4, 8**-0.5)
    monkeypatch.setattr(block_sparse, "CHUNK_TOKENS", 12)  # 3 query blocks a chunk: 6 chunks, the last short
    assert torch.equal(block_sparse_attention(q, k, v, key_mask, blocks, valid, 4, 8**-0.5), whole)


def test_original_full_equals_transformers_at_any_length(tmp_path):
    """attention_type: original_full is full attention past the block-sparse limit too, as transformers'."""
    theirs, ours = _pair(tmp_path, attention_type="original_full")
    theirs.eval()
    ours.eval()
    assert ours.config.encoder.attention.options()["attention_type"] == "original_full"
    ids, mask = _batch(40, 31)
    with torch.no_grad():
        want, got = theirs(input_ids=ids, attention_mask=mask), ours(input_ids=ids, attention_mask=mask)
    assert (want.last_hidden_state - got.last_hidden_state)[mask.bool()].abs().max() <= TOL
    assert ours.padding_readers == ()  # packs as BERT does, at any length


def test_packing_runs_each_sequence_alone_and_auto_does_not_pack_a_long_batch(tmp_path):
    """Past the full-attention limit the block layout counts the padded length, so the attention declares
    reads_padded_positions_above the limit: `auto` leaves such a batch padded (transformers' numbers, tested above)
    and says why and from which length; `always` gives each sequence the numbers it has alone (its own layout)."""
    _, ours = _pair(tmp_path)
    assert ours.auto_packing_limit == full_attention_limit(2, 1) == 14
    assert "auto does not pack batches longer than 14 tokens" in ours.packing_off_reason
    assert "encoder.layer.0.attention (BlockSparseAttention, above 14 tokens)" in ours.packing_off_reason
    packed = bertblocks.from_pretrained(tmp_path, head="auto", overrides=["encoder.packing=always"]).eval()
    ids, mask = _batch(40, 23)  # the second row alone: 23 tokens, 12 blocks; padded: 20 blocks
    with torch.no_grad():
        got = packed(input_ids=ids, attention_mask=mask).last_hidden_state
        alone = packed(input_ids=ids[1:, :23]).last_hidden_state
        padded = ours.eval()(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (got[1, :23] - alone[0]).abs().max() <= TOL
    assert (padded[1, :23] - alone[0]).abs().max() > 1e-3  # the batch's padding changed the real tokens' numbers


@pytest.mark.parametrize("length", [14, 15])  # at the full-attention limit: packed; one token past it: padded
def test_auto_packs_a_batch_short_enough_for_full_attention_as_transformers(tmp_path, length):
    """`packing: auto` decides per batch: padded to at most (5 + 2r)·bs tokens, attention is full and masked (as
    BERT's), so the batch packs with transformers' numbers; one token longer it stays padded, as transformers.
    Packed, padded (`never`) and transformers' BigBird (a fresh one: it switches to full attention for good after a
    short input) agree on the real tokens either way."""
    theirs, ours = _pair(tmp_path)
    padded = bertblocks.from_pretrained(tmp_path, overrides=["encoder.packing=never"]).eval()
    ours.eval()
    ids, mask = _batch(length, 5)  # the second row: 5 real tokens of 14 or 15
    with torch.no_grad():
        want = theirs.eval()(input_ids=ids, attention_mask=mask).last_hidden_state
        got = ours(input_ids=ids, attention_mask=mask).last_hidden_state
        never = padded(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    assert_close(got[real], want[real])
    assert_close(never[real], want[real])
    assert ours.auto_packs(length) == (length == 14)
    if length == 14:
        assert got[~real].abs().max() == 0  # packed: zeros at the padded positions
    else:
        assert_identical(got, never)  # not packed: the padded path itself (the same kernels on the same data)


@pytest.mark.parametrize(
    ("shift", "message"),
    [
        # declared from 8 (one past the limit of 7): the batch of 8 runs block-sparse, so packing changes it
        (1, r"packing changes the outputs at real tokens in a batch of 8 tokens.*threshold of 8 or more: lower it"),
        # declared from 6: the batch of 7 still attends in full, so the declaration turns packing off for nothing
        (-1, r"in a batch of 7 tokens, but the packed and padded paths agree.*raise reads_padded_positions_above to 7"),
    ],
)
def test_conformance_catches_a_wrong_full_attention_threshold(shift, message):
    """padding_declaration checks a length-dependent declaration at its threshold and one past it: the attention
    declaring its limit (7 with blocks of 1, one random block) passes (test_conformance_block_sparse), one off
    either way fails, saying which way to move it."""
    component = REGISTRY.get("attention", "block_sparse")

    def make(**kwargs):
        built = component.factory(**kwargs)
        built.reads_padded_positions_above = built.limit + shift
        return built

    variant = dataclasses.replace(component, name="shifted", provider="", factory=make, aliases=())
    registry = Registry(load_entry_points=False)
    registry.register(types.SimpleNamespace(bertblocks_register_components=lambda: [variant]), name="shifted")
    suite = ConformanceSuite(registry, options={("attention", "shifted"): {"block_size": 1, "num_random_blocks": 1}})
    (case,) = suite.cases(kinds=["attention"], names=["shifted"], include=["padding_declaration"])
    with pytest.raises(ConformanceError, match=message):
        case.check.run(case.subject)


@pytest.mark.compile
def test_compiled_auto_packs_up_to_the_limit_and_guards_on_the_length():
    """Compiled, `auto` packs every 2-D mask it may: the length-dependent declaration is one guard on the padded
    length, so batches of 10 to 14 tokens share one packed graph and 15 tokens get a padded one (the block-sparse
    path specialises on its block count past the limit, one graph per length there, as before packing), each equal
    to the eager model on real tokens."""
    config = {
        "vocab_size": 99,
        "hidden_size": 32,
        "max_position_embeddings": 64,
        "encoder": {
            "num_layers": 1,
            "attention": {"name": "block_sparse", "num_heads": 4, "block_size": 2, "num_random_blocks": 1},
            "feedforward": {"intermediate_size": 37},
        },
    }
    torch.manual_seed(0)
    model = bertblocks.create_model(config).eval()
    graphs: list[bool] = []  # per compiled graph: whether it packs

    def backend(gm, example_inputs):
        graphs.append(any(str(node.target).startswith("bertblocks.real_token_index") for node in gm.graph.nodes))
        return gm.forward

    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend=backend, dynamic=True)
        with torch.no_grad():
            for length in range(10, 16):
                ids, mask = _batch(length, length - 4)
                want, got = model(ids, mask).last_hidden_state, compiled(ids, mask).last_hidden_state
                real = mask.bool()
                assert_close(got[real], want[real])
                assert (got[~real].abs().max() == 0) == (length <= 14), length  # packed: zeros at padding
    finally:
        torch._dynamo.reset()
    assert graphs == [True, False], graphs  # packed for 10-14 (no recompilation), padded for 15
