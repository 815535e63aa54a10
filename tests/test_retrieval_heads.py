"""Retrieval heads (SPLADE, ColBERT, BGE-M3) against their equations written out here in float64, padded and
packed; BGE-M3 on a tiny XLM-RoBERTa checkpoint with its published head-file names; the scoring functions
against loops; a pickled head file refused."""

from __future__ import annotations

import logging
import math
import shutil
import string

import pytest
import torch
import transformers
from safetensors.torch import save_file

import bertblocks
from bertblocks import BertTokenizer
from bertblocks.errors import InputError, InputTypeError
from bertblocks.hf.weight_files import WeightFileError
from bertblocks.plugins.heads.retrieval import ColBERTOptions
from bertblocks.sentence import (
    colbert_inputs,
    cosine_score,
    dot_score,
    encode_colbert,
    maxsim_score,
    minilm_path,
    sparse_score,
)
from tests.conftest import TINY
from tests.tolerances import assert_close

PATHS = ["never", "always"]  # encoder.packing: padded, packed


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("bertblocks").setLevel(logging.ERROR)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 99, (3, 9), generator=g)
    ids[:, 0] = 0  # <s> / a start token
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, -3:] = 0
    mask[2, -6:] = 0
    ids[mask == 0] = 1  # the padding id
    ids[0, 4] = ids[0, 6]  # a repeated token: the max over its positions
    return ids, mask


# ---------------------------------------------------------------------------------------------------- SPLADE
@pytest.fixture(scope="module")
def splade_checkpoint(tmp_path_factory):
    """A BertForMaskedLM (what SPLADE checkpoints are), saved by transformers."""
    directory = tmp_path_factory.mktemp("splade")
    config = transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37
    )
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(config).eval()
    with torch.no_grad():
        model.cls.predictions.bias.normal_()  # not the zeros it starts as: the bias must load
    model.save_pretrained(directory)
    return directory, model


@pytest.mark.parametrize("packing", PATHS)
def test_splade_equals_its_equation_on_a_bert_masked_lm_checkpoint(splade_checkpoint, packing):
    directory, reference = splade_checkpoint
    model, info = bertblocks.from_pretrained(
        directory, [f"encoder.packing={packing}"], head="splade", output_loading_info=True
    )
    assert info.missing_keys == []
    assert info.unexpected_keys == []
    ids, mask = _batch()
    got = model.eval()(input_ids=ids, attention_mask=mask).sparse_embedding  # [b, vocab]
    with torch.no_grad():
        logits = reference.double()(input_ids=ids, attention_mask=mask).logits  # [b, q, vocab] float64
    reference.float()
    expected = torch.zeros(3, 99, dtype=torch.float64)
    for b in range(3):
        for v in range(99):  # max over the real tokens of log(1 + relu(logit))
            expected[b, v] = max(math.log1p(max(logits[b, t, v].item(), 0.0)) for t in range(9) if mask[b, t])
    assert got.shape == (3, 99)
    assert_close(got.double(), expected, what="sparse_embedding")


def test_splade_ignores_what_padding_holds(splade_checkpoint):
    model = bertblocks.from_pretrained(splade_checkpoint[0], head="splade").eval()
    ids, mask = _batch()
    other = ids.clone()
    other[mask == 0] = 7
    a = model(input_ids=ids, attention_mask=mask).sparse_embedding
    b = model(input_ids=other, attention_mask=mask).sparse_embedding
    assert_close(a, b)


# --------------------------------------------------------------------------------------------------- ColBERT
def _hidden64(model, ids, mask) -> torch.Tensor:
    """The backbone's last hidden states in float64 (the heads' equations are checked, not the backbone)."""
    backbone = model.bert
    with torch.no_grad():
        out = backbone.double()(input_ids=ids, attention_mask=mask).last_hidden_state
    backbone.float()
    return out


@pytest.mark.parametrize("packing", PATHS)
def test_colbert_equals_its_equation(packing):
    torch.manual_seed(0)
    model = bertblocks.create_model(
        {**TINY, "head": {"name": "colbert", "dim": 16}, "encoder": {**TINY["encoder"], "packing": packing}}
    ).eval()
    assert model.linear.bias is None
    assert tuple(model.linear.weight.shape) == (16, 32)
    ids, mask = _batch()
    out = model(input_ids=ids, attention_mask=mask)
    hidden = _hidden64(model, ids, mask)
    weight = model.linear.weight.double()
    expected = torch.zeros(3, 9, 16, dtype=torch.float64)
    for b in range(3):
        for t in range(9):
            if mask[b, t]:
                v = weight @ hidden[b, t]
                expected[b, t] = v / v.norm()
    assert_close(out.token_embeddings.double(), expected, what="token_embeddings")
    assert torch.equal(out.token_mask, mask)
    assert sorted(k for k in model.state_dict() if not k.startswith("bert.")) == ["linear.weight"]


def test_retrieval_heads_refuse_labels():
    model = bertblocks.create_model({**TINY, "head": "colbert"})
    ids, mask = _batch()
    with pytest.raises(ValueError, match="takes"):
        model(input_ids=ids, attention_mask=mask, labels=ids)


# ---------------------------------------------------------------------------------------------------- BGE-M3
SPECIAL = (0, 1, 2, 3)  # XLM-R: <s>, <pad>, </s>, <unk>


@pytest.fixture(scope="module")
def bge_m3_checkpoint(tmp_path_factory):
    """A tiny XLMRobertaModel saved by transformers, with BGE-M3's head files beside it (published names)."""
    directory = tmp_path_factory.mktemp("bge-m3")
    config = transformers.XLMRobertaConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=40,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    backbone = transformers.XLMRobertaModel(config, add_pooling_layer=False).eval()
    backbone.save_pretrained(directory)
    colbert = {"weight": torch.randn(32, 32) * 0.2, "bias": torch.randn(32) * 0.1}
    sparse = {"weight": torch.randn(1, 32) * 0.3, "bias": torch.tensor([0.05])}
    save_file(colbert, str(directory / "colbert_linear.safetensors"))
    save_file(sparse, str(directory / "sparse_linear.safetensors"))
    return directory, backbone, colbert, sparse


def _published_bge_m3(backbone, colbert, sparse, ids, mask) -> dict[str, torch.Tensor]:
    """FlagEmbedding's BGEM3Model equations (dense: cls; sparse: relu(sparse_linear) scattered per token id, max
    over the sequence, the unused tokens zeroed; colbert: colbert_linear on tokens after the first, masked, then
    normalised), in float64."""
    with torch.no_grad():
        h = backbone.double()(input_ids=ids, attention_mask=mask).last_hidden_state  # [b, q, H]
    backbone.float()
    dense = torch.nn.functional.normalize(h[:, 0], dim=-1)
    token_weights = torch.relu(h @ sparse["weight"].double().T + sparse["bias"].double())  # [b, q, 1]
    scattered = torch.zeros(ids.shape[0], ids.shape[1], 99, dtype=torch.float64)
    scattered = torch.scatter(scattered, dim=-1, index=ids.unsqueeze(-1), src=token_weights)
    lexical = torch.max(scattered, dim=1).values
    lexical[:, list(SPECIAL)] *= 0.0
    vecs = h[:, 1:] @ colbert["weight"].double().T + colbert["bias"].double()
    vecs = vecs * mask[:, 1:][:, :, None].double()
    vecs = torch.nn.functional.normalize(vecs, dim=-1)
    return {"dense_embedding": dense, "sparse_embedding": lexical, "colbert_embedding": vecs}


@pytest.mark.parametrize("packing", PATHS)
def test_bge_m3_three_outputs_equal_the_published_equations(bge_m3_checkpoint, packing):
    directory, backbone, colbert, sparse = bge_m3_checkpoint
    model, info = bertblocks.from_pretrained(
        directory, [f"encoder.packing={packing}"], head="bge_m3", output_loading_info=True
    )
    model.eval()
    assert info.missing_keys == []  # the head files beside model.safetensors were read
    ids, mask = _batch()
    ids[:, 0] = 0
    ids[0, 8] = 2  # </s>: a special token, weight 0
    out = model(input_ids=ids, attention_mask=mask)
    expected = _published_bge_m3(backbone, colbert, sparse, ids, mask)
    for field, value in expected.items():
        assert_close(getattr(out, field).double(), value, what=field)
    assert torch.equal(out.colbert_mask, mask[:, 1:])
    assert out.sparse_embedding[:, list(SPECIAL)].abs().sum() == 0
    assert (out.sparse_embedding > 0).any()  # the test would pass vacuously on all zeros


def _backbone_with(directory, tmp_path, files: dict[str, dict[str, torch.Tensor] | None]):
    """A copy of the backbone checkpoint in ``tmp_path`` with the given head files (name → tensors)."""
    tmp_path.mkdir(exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(directory / name, tmp_path / name)
    for name, tensors in files.items():
        save_file(tensors, str(tmp_path / name))
    return tmp_path


def test_bge_m3_head_file_in_pt_name_loads_when_it_is_safetensors(bge_m3_checkpoint, tmp_path):
    directory, _, colbert, sparse = bge_m3_checkpoint
    # the published names, safetensors content
    folder = _backbone_with(directory, tmp_path, {"colbert_linear.pt": colbert, "sparse_linear.pt": sparse})
    model = bertblocks.from_pretrained(folder, head="bge_m3")
    assert torch.equal(model.colbert_linear.weight, colbert["weight"])
    assert torch.equal(model.sparse_linear.bias, sparse["bias"])


def test_without_head_files_the_head_is_reported_missing(bge_m3_checkpoint, tmp_path):
    folder = _backbone_with(bge_m3_checkpoint[0], tmp_path, {})
    _, info = bertblocks.from_pretrained(folder, head="bge_m3", output_loading_info=True)
    assert sorted(info.missing_keys) == [
        f"{m}.{k}" for m in ("colbert_linear", "sparse_linear") for k in ("bias", "weight")
    ]


@pytest.mark.parametrize("legacy", [False, True])
def test_a_pickled_head_file_is_refused(bge_m3_checkpoint, tmp_path, legacy):
    directory, _, colbert, sparse = bge_m3_checkpoint
    marker = tmp_path / "unpickled"

    class Trap:  # unpickling it would create the marker file
        def __reduce__(self):
            return (open, (str(marker), "w"))

    folder = _backbone_with(directory, tmp_path / "ckpt", {"sparse_linear.safetensors": sparse})
    torch.save({**colbert, "trap": Trap()}, folder / "colbert_linear.pt", _use_new_zipfile_serialization=not legacy)
    with pytest.raises(
        WeightFileError,
        match=r"pickled PyTorch file.*save\(torch.load\('colbert_linear.pt', weights_only=True\), "
        r"'colbert_linear.safetensors'\)",
    ):
        bertblocks.from_pretrained(folder, head="bge_m3")
    assert not marker.exists()


def test_a_head_file_with_other_keys_or_shapes_is_refused(bge_m3_checkpoint, tmp_path):
    directory, _, colbert, sparse = bge_m3_checkpoint
    files = {"colbert_linear.safetensors": {"linear.weight": colbert["weight"]}, "sparse_linear.safetensors": sparse}
    folder = _backbone_with(directory, tmp_path, files)
    with pytest.raises(WeightFileError, match=r"holds \['linear.weight'\]; the colbert_linear module's file holds"):
        bertblocks.from_pretrained(folder, head="bge_m3")
    save_file({"weight": torch.zeros(4, 32), "bias": torch.zeros(4)}, str(folder / "colbert_linear.safetensors"))
    with pytest.raises(WeightFileError, match=r"shape \(4(, 32)?,?\), but the model's colbert_linear\.(weight|bias)"):
        bertblocks.from_pretrained(folder, head="bge_m3")


def test_bge_m3_needs_input_ids(bge_m3_checkpoint):
    model = bertblocks.from_pretrained(bge_m3_checkpoint[0], head="bge_m3")
    with pytest.raises(ValueError, match="needs input_ids"):
        model(inputs_embeds=torch.randn(1, 4, 32))


# --------------------------------------------------------------------------------------------------- scoring
def test_dense_and_sparse_scores_equal_loops():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 8, generator=g, dtype=torch.float64), torch.randn(5, 8, generator=g, dtype=torch.float64)
    dots = dot_score(a, b)
    cosines = cosine_score(a, b)
    for i in range(3):
        for j in range(5):
            d = sum(a[i, k].item() * b[j, k].item() for k in range(8))
            assert dots[i, j].item() == pytest.approx(d)
            assert cosines[i, j].item() == pytest.approx(d / (a[i].norm().item() * b[j].norm().item()))
    sa, sb = torch.relu(a), torch.relu(b)  # sparse: the shared entries' products
    lexical = sparse_score(sa, sb)
    for i in range(3):
        for j in range(5):
            shared = [k for k in range(8) if sa[i, k] > 0 and sb[j, k] > 0]
            assert lexical[i, j].item() == pytest.approx(sum(sa[i, k].item() * sb[j, k].item() for k in shared))
    assert dot_score(a[0], b[0]).shape == (1, 1)
    with pytest.raises(ValueError, match="width 8 with width 7"):
        dot_score(a, b[:, :7])


@pytest.mark.parametrize("normalize", [False, True])
def test_maxsim_equals_loops(normalize):
    g = torch.Generator().manual_seed(0)
    q, d = (
        torch.randn(2, 4, 6, generator=g, dtype=torch.float64),
        torch.randn(3, 5, 6, generator=g, dtype=torch.float64),
    )
    qmask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    dmask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    d[dmask == 0] = 100.0  # a padded document token that would win every max if it counted
    q[qmask == 0] = 100.0
    got = maxsim_score(q, d, qmask, dmask, normalize_by_query_length=normalize)
    assert got.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            total, count = 0.0, 0
            for s in range(4):
                if not qmask[i, s]:
                    continue
                count += 1
                total += max(float(q[i, s] @ d[j, t]) for t in range(5) if dmask[j, t])
            assert got[i, j].item() == pytest.approx(total / count if normalize else total)
    with pytest.raises(ValueError, match="query_mask must have shape"):
        maxsim_score(q, d, qmask[:, :3], dmask)


def test_a_saved_bge_m3_model_loads_back_with_its_heads(bge_m3_checkpoint, tmp_path):
    directory = bge_m3_checkpoint[0]
    model = bertblocks.from_pretrained(directory, head="bge_m3").eval()
    model.save_pretrained(tmp_path / "saved")  # the head's tensors go into model.safetensors with the backbone
    again, info = bertblocks.from_pretrained(tmp_path / "saved", head="auto", output_loading_info=True)
    assert info.missing_keys == []
    ids, mask = _batch()
    want, got = model(input_ids=ids, attention_mask=mask), again.eval()(input_ids=ids, attention_mask=mask)
    for field in ("dense_embedding", "sparse_embedding", "colbert_embedding"):
        assert torch.equal(got[field], want[field]), field


@pytest.mark.parametrize("normalize", [False, True])
def test_scores_equal_sentence_transformers_util(normalize):
    """sentence-transformers 6's own scoring functions (``util.maxsim``, ``util.dot_score``, ``util.cos_sim``) give
    the same scores, so embeddings scored by either library rank alike."""
    from sentence_transformers import util

    g = torch.Generator().manual_seed(3)
    q, d = torch.randn(2, 4, 6, generator=g), torch.randn(3, 5, 6, generator=g)
    qmask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    dmask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    want = util.maxsim(q, d, qmask.bool(), dmask.bool(), length_normalize=normalize)
    assert_close(maxsim_score(q, d, qmask, dmask, normalize_by_query_length=normalize), want)
    a, b = torch.relu(q[:, 0]), torch.relu(d[:, 0])
    assert_close(dot_score(a, b), util.dot_score(a, b))
    assert_close(sparse_score(a.to_sparse().to_dense(), b), util.dot_score(a, b))
    assert_close(cosine_score(a, b), util.cos_sim(a, b))


def test_a_heads_options_come_as_overrides_and_a_mapping_head_is_refused(tmp_path):
    bertblocks.create_model(TINY).save_pretrained(tmp_path)
    model = bertblocks.from_pretrained(tmp_path, ["head.dim=16"], head="colbert")
    assert model.linear.out_features == 16
    with pytest.raises(InputTypeError, match=r"head must be a head name.*\['head.dim=16'\], head='colbert'"):
        bertblocks.from_pretrained(tmp_path, head={"name": "colbert", "dim": 16})


# ------------------------------------------------------------------------------- ColBERT's input convention
@pytest.fixture(scope="module")
def colbert_tokenizers() -> tuple[BertTokenizer, transformers.PreTrainedTokenizerBase]:
    """all-MiniLM-L6-v2's tokenizer (BERT's vocabulary: [unused0], [unused1], [MASK]), bertblocks' and transformers'."""
    return BertTokenizer.from_pretrained(minilm_path()), transformers.AutoTokenizer.from_pretrained(minilm_path())


COLBERT_TEXTS = ["what is late interaction?", "a much longer question, " * 12, "hi!"]


def _colbert_reference_inputs(
    hf: transformers.PreTrainedTokenizerBase, texts: list[str], *, is_query: bool, length: int, attend: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """stanford-futuredata/ColBERT's QueryTokenizer/DocTokenizer.tensorize, written out: a '. ' placeholder for the
    marker, truncated to the length, then the marker ([unused0] / [unused1]) over the placeholder; a query padded to
    the length with [PAD] turned into [MASK] (attended to only with attend_to_mask_tokens)."""
    padding = "max_length" if is_query else "longest"
    obj = hf([". " + t for t in texts], padding=padding, truncation=True, return_tensors="pt", max_length=length)
    ids, mask = obj["input_ids"], obj["attention_mask"]
    ids[:, 1] = hf.convert_tokens_to_ids("[unused0]" if is_query else "[unused1]")
    if is_query:
        ids[ids == hf.pad_token_id] = hf.mask_token_id
        if attend:
            mask[ids == hf.mask_token_id] = 1
    return ids, mask


def _colbert_reference_keep(
    hf: transformers.PreTrainedTokenizerBase, ids: torch.Tensor, is_query: bool
) -> torch.Tensor:
    """ColBERT's ``mask(input_ids, skiplist)``: not [PAD], and for documents (mask_punctuation) not the first token of
    any ``string.punctuation`` character."""
    skip = {hf.encode(c, add_special_tokens=False)[0] for c in string.punctuation} if not is_query else set()
    return torch.tensor([[int(t != hf.pad_token_id and t not in skip) for t in row] for row in ids.tolist()])


@pytest.mark.parametrize(("is_query", "attend"), [(True, False), (True, True), (False, False)])
def test_colbert_inputs_are_colberts_tokenization(colbert_tokenizers, is_query, attend):
    ours_tok, hf = colbert_tokenizers
    options = ColBERTOptions(query_length=12, document_length=10, attend_to_expansion_tokens=attend)
    got = colbert_inputs(ours_tok, COLBERT_TEXTS, is_query=is_query, options=options)
    ids, mask = _colbert_reference_inputs(
        hf, COLBERT_TEXTS, is_query=is_query, length=12 if is_query else 10, attend=attend
    )
    assert torch.equal(got["input_ids"], ids)
    assert torch.equal(got["attention_mask"], mask)
    # ColBERT keeps a vector for every token that is not [PAD] (all of an augmented query's), nor, in a document,
    # punctuation
    assert torch.equal(got["token_mask"], _colbert_reference_keep(hf, ids, is_query))


def test_colbert_inputs_without_markers_or_augmentation_are_plain_tokenization(colbert_tokenizers):
    ours_tok, _ = colbert_tokenizers
    options = ColBERTOptions(query_marker=None, query_augmentation=False, query_length=8, mask_punctuation=True)
    got = colbert_inputs(ours_tok, COLBERT_TEXTS, is_query=True, options=options)
    plain = ours_tok(COLBERT_TEXTS, padding=True, truncation=True, max_length=8)
    assert torch.equal(got["input_ids"], plain["input_ids"])
    assert torch.equal(got["attention_mask"], plain["attention_mask"])
    assert torch.equal(got["token_mask"], plain["attention_mask"])


def test_colbert_inputs_refuse_a_marker_the_vocabulary_lacks(colbert_tokenizers):
    with pytest.raises(InputError, match=r"head option document_marker: '\[D\] ' is not in the tokenizer's vocabulary"):
        colbert_inputs(colbert_tokenizers[0], ["x"], is_query=False, options=ColBERTOptions(document_marker="[D] "))
    with pytest.raises(InputError, match="head option query_length: 2 leaves no room"):
        colbert_inputs(colbert_tokenizers[0], ["x"], is_query=True, options=ColBERTOptions(query_length=2))


@pytest.mark.parametrize("packing", PATHS)
def test_encode_colbert_equals_a_written_out_colbert(colbert_tokenizers, packing):
    """ColBERT's ``query``/``doc`` on transformers' BERT with the same weights: ``normalize(linear(bert(ids,
    mask)) · (ids != [PAD]))``; the augmented query's [MASK] tokens attend to the real tokens and keep their
    vectors, packed or not; the late-interaction scores equal too."""
    ours_tok, hf = colbert_tokenizers
    overrides = ["head.dim=16", "head.query_length=12", "head.document_length=10", f"encoder.packing={packing}"]
    model = bertblocks.from_pretrained(minilm_path(), overrides, head="colbert").eval()
    torch.manual_seed(0)
    with torch.no_grad():
        model.linear.weight.normal_()
    bert = transformers.BertModel.from_pretrained(minilm_path()).eval()
    encoded = {}
    for is_query, length in ((True, 12), (False, 10)):
        ids, mask = _colbert_reference_inputs(hf, COLBERT_TEXTS, is_query=is_query, length=length, attend=False)
        with torch.no_grad():
            hidden = bert(input_ids=ids, attention_mask=mask).last_hidden_state
        keep = _colbert_reference_keep(hf, ids, is_query).float()[..., None]
        expected = torch.nn.functional.normalize((hidden @ model.linear.weight.detach().T) * keep, p=2, dim=-1)
        vectors, token_mask = encode_colbert(model, ours_tok, COLBERT_TEXTS, is_query=is_query, batch_size=2)
        assert torch.equal(token_mask, keep[..., 0].long())
        assert_close(vectors, expected, what="query vectors" if is_query else "document vectors")
        encoded[is_query] = (vectors, token_mask, expected)
    (q, qm, q_ref), (d, dm, d_ref) = encoded[True], encoded[False]
    # ColBERT's colbert_score: each query vector's best real document token (padding never wins), summed
    best = [
        [(qi @ dj[dmj.bool()].T).max(dim=-1).values.sum() for dj, dmj in zip(d_ref, dm, strict=True)] for qi in q_ref
    ]
    reference = torch.tensor(best)
    assert_close(maxsim_score(q, d, qm, dm), reference, what="maxsim")


def test_encode_colbert_needs_the_colbert_head(colbert_tokenizers):
    with pytest.raises(InputError, match="encode_colbert needs a model with the colbert head"):
        encode_colbert(bertblocks.create_model(TINY), colbert_tokenizers[0], ["x"], is_query=True)
