"""Every family on the paths beyond plain loading: the packed encoder path, ``torch.compile``, sentence
embeddings (``bertblocks.sentence.encode`` and ``bertblocks embed``) with the family's own tokenizer.json, and
the CLI commands (build, validate, diagram, trace, convert) on its checkpoint, and an ablation study based on it.

Each case is a tiny random backbone saved by transformers' own class of the family (the row of
``tests/families/reference.py`` that has the family's ``tokenizer``), with a tokenizer.json of the family's kind
(WordPiece, BPE or Unigram, trained in the test) beside it; the reference numbers are that transformers model's on
the ids of transformers' tokenizer class of the family on the same files. A family transformers has no class for
(remote code only) is a row of :data:`REMOTE` instead: its own test file writes a checkpoint in the published
format and gives the float64 reference of the published equations as the model to compare with.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers

import bertblocks
from bertblocks import BertTokenizer, cli, sentence
from tests.families import test_gte, test_jina_v2, test_neobert
from tests.families import test_tokenizers as toks
from tests.families.reference import FAMILIES, Tokenizing, rows, save_hf, save_tokenizer
from tests.tolerances import assert_close

TEXTS = ["the quick brown fox", "a tiny corpus for tokenizer tests, with punctuation!", "dog", "save them again"]


@dataclass(frozen=True)
class Remote:
    """A family transformers has no class for (remote code only), on the same paths.

    Attributes:
        tokenizer: the family's tokenizer (transformers' ``tokenizer_class`` gives the reference ids).
        pad: the padding index.
        token_types: whether the family's tokenizer frames a pair with token types (then the CLI traces a pair).
        checkpoint: writes a published-format backbone checkpoint (config.json and weights, ``vocab_size`` words,
            hidden size 32) to a directory and returns the reference: a module called like a model that returns
            ``last_hidden_state`` (the family's float64 equations) and whose parameters are the checkpoint's tensors.
    """

    tokenizer: Tokenizing
    pad: int
    token_types: bool
    checkpoint: Callable[[Path, int], torch.nn.Module]


#: families with no transformers class, one row each (the reference lives in the family's test file)
REMOTE: dict[str, Remote] = {
    # GTE's published format (model_type new): BERT's WordPiece convention (the English models' vocabulary)
    "new": Remote(
        Tokenizing(toks.wordpiece, toks.bert_processor, "BertTokenizer"),
        pad=0,
        token_types=True,
        checkpoint=test_gte.published_reference,
    ),
    # NeoBERT: BERT's WordPiece (bert-base-uncased's vocabulary), no token types
    "neobert": Remote(
        Tokenizing(toks.wordpiece, toks.bert_processor, "BertTokenizer"),
        pad=0,
        token_types=False,
        checkpoint=test_neobert.published_reference,
    ),
    # Jina-embeddings-v2 (model_type bert, remote JinaBert classes): BERT's WordPiece with token types
    "jina_bert": Remote(
        Tokenizing(toks.wordpiece, toks.bert_processor, "BertTokenizer"),
        pad=0,
        token_types=True,
        checkpoint=test_jina_v2.published_reference,
    ),
}
#: the rows of the family table with the family's tokenizer: one per family, its backbone (``classes[0]``) on every
#: path (a new family joins by giving its row of tests/families/reference.py a ``tokenizer``); then :data:`REMOTE`
CASES = [*rows(lambda family: family.tokenizer is not None), *REMOTE]


@dataclass
class Checkpoint:
    directory: Path
    reference: torch.nn.Module  # the transformers model that wrote it (or a remote family's written-out equations)
    tokenizer: BertTokenizer
    batch: dict[str, torch.Tensor]  # transformers' tokenizer of the family on its texts, padded
    token_types: bool  # whether the family's tokenizer gives a pair token types
    texts: list[str]  # the family's kind of text (TEXTS, or its own: ESM's protein sequences)
    extra: dict[str, torch.Tensor]  # the row's extra_inputs for the batch (LayoutLM's bbox); {}: none


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Checkpoint]:
    """Made once per family on first use: a transformers backbone and the family's tokenizer.json."""
    made: dict[str, Checkpoint] = {}

    def get(name: str) -> Checkpoint:
        if name not in made:
            remote = REMOTE.get(name)
            tokenizing = FAMILIES[name].tokenizer if remote is None else remote.tokenizer
            assert tokenizing is not None
            directory = tmp_path_factory.mktemp(name)
            tok = tokenizing.train()
            tok.post_processor = tokenizing.processor(tok)
            # the model's vocabulary is the one the tokenizer learnt
            if remote is None:
                family = FAMILIES[name]
                size = "dim" if family.model_type == "distilbert" else "hidden_size"
                assert family.settings[size] == 32
                reference = save_hf(family, family.classes[0], directory, vocab_size=tok.get_vocab_size())
                pad, token_types = family.pad, family.token_types
            else:
                reference = remote.checkpoint(directory, tok.get_vocab_size())
                pad, token_types = remote.pad, remote.token_types
            save_tokenizer(directory, tokenizing, tok)
            texts = list(tokenizing.texts or TEXTS)
            if remote is None:
                theirs = transformers.AutoTokenizer.from_pretrained(directory)
            else:  # config.json names remote classes: transformers' tokenizer class of the family, named
                theirs = getattr(transformers, tokenizing.tokenizer_class).from_pretrained(directory)
            batch = dict(theirs(texts, padding=True, return_tensors="pt"))
            tokenizer = BertTokenizer.from_pretrained(directory)
            if not token_types:  # a family without token types: its tokenizer returns none (BertTokenizer does)
                assert "token_type_ids" not in tokenizer(texts)
                batch.pop("token_type_ids", None)
            assert tokenizer.pad_token_id == pad  # padding positions are the family's padding index
            make_extra = FAMILIES[name].extra_inputs if remote is None else None
            extra = make_extra(tuple(batch["input_ids"].shape)) if make_extra is not None else {}
            made[name] = Checkpoint(directory, reference, tokenizer, batch, token_types, texts, extra)
        return made[name]

    return get  # type: ignore[return-value]


def _padded_batch(checkpoint: Checkpoint) -> dict[str, torch.Tensor]:
    """The family's tokenizer on texts of very different lengths: a third of the batch is padding or more; with the
    row's extra inputs (a packed batch carries them with its tokens)."""
    mask = checkpoint.batch["attention_mask"]
    assert (mask == 0).float().mean() > 0.3  # above packing_threshold: `auto` packs
    return {**checkpoint.batch, **checkpoint.extra}


def _reference(checkpoint: Checkpoint, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return checkpoint.reference(**batch).last_hidden_state


def _reference_each_alone(checkpoint: Checkpoint, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The reference on each sequence of the (right-padded) batch alone, without padding; zeros at padding."""
    mask = batch["attention_mask"]
    want = torch.zeros(*mask.shape, _reference(checkpoint, batch).shape[-1])
    for i, length in enumerate(mask.sum(1).tolist()):
        alone = {key: value[i : i + 1, :length] for key, value in batch.items()}
        want[i, :length] = _reference(checkpoint, alone)[0]
    return want


def _assert_close_on_real_tokens(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> None:
    real = mask.bool()
    assert_close(a[real], b[real])


# --------------------------------------------------------------------------------------------------- packing
@pytest.mark.parametrize("packing", ["auto", "always"])
@pytest.mark.parametrize("name", CASES)
def test_packed_path_equals_transformers_on_a_padded_batch(checkpoints, name, packing):
    checkpoint = checkpoints(name)
    batch = _padded_batch(checkpoint)
    want = _reference(checkpoint, batch)
    model = bertblocks.from_pretrained(checkpoint.directory, [f"encoder.packing={packing}"]).eval()
    # a family whose components declare reads_padded_positions (ConvBERT's convolutions): `auto` never packs it, and
    # `always` packs it anyway, each sequence then computed as transformers computes it alone (nothing to read past
    # its end)
    reason = model.packing_off_reason
    if reason is not None and packing == "always":
        want = _reference_each_alone(checkpoint, batch)
    with torch.no_grad():
        got = model(**batch, output_hidden_states=True)
    _assert_close_on_real_tokens(got.last_hidden_state, want, batch["attention_mask"])
    padded_positions = got.last_hidden_state[batch["attention_mask"] == 0].abs().max()
    if reason is not None and packing == "auto":
        assert "reads_padded_positions" in reason
        assert padded_positions > 0  # the padded path: transformers' values at padded positions too
    else:
        # the run really was packed: padded positions hold zeros (documented), which the padded path never gives
        assert padded_positions == 0
    # the embeddings and every layer, through the packed path as well
    assert len(got.hidden_states) == model.config.encoder.num_layers + 1


# --------------------------------------------------------------------------------------------------- compile
@pytest.mark.compile
@pytest.mark.parametrize("name", CASES)
def test_compiled_model_equals_transformers(checkpoints, name):
    checkpoint = checkpoints(name)
    batch = _padded_batch(checkpoint)
    want = _reference(checkpoint, batch)
    model = bertblocks.from_pretrained(checkpoint.directory).eval()
    torch._dynamo.reset()
    try:
        # aot_eager: dynamo and AOT autograd without C++ code generation; fullgraph: no graph break anywhere
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        with torch.no_grad():
            got = compiled(**batch).last_hidden_state
    finally:
        torch._dynamo.reset()
    _assert_close_on_real_tokens(got, want, batch["attention_mask"])


# -------------------------------------------------------------------------------------- sentence embeddings
def _mean_pooled_reference(checkpoint: Checkpoint) -> torch.Tensor:
    batch = checkpoint.batch
    hidden = _reference(checkpoint, batch)
    weights = batch["attention_mask"][..., None].float()
    return F.normalize((hidden * weights).sum(1) / weights.sum(1), dim=-1)


@pytest.mark.parametrize("name", CASES)
def test_sentence_encode_embed_and_similarity_commands_on_the_family_checkpoint(checkpoints, tmp_path, capsys, name):
    checkpoint = checkpoints(name)
    want = _mean_pooled_reference(checkpoint)
    model = bertblocks.from_pretrained(checkpoint.directory).eval()
    tokenizer = BertTokenizer.from_pretrained(checkpoint.directory)  # the family's template from config.json
    texts = checkpoint.texts
    # a model that reads padded positions (ConvBERT) gives embeddings that depend on the padding of their batch, as
    # transformers' do: compared in one batch, padded as the reference's; packed, each text's embedding is that of
    # the text alone, whatever the batch
    batch_size = len(texts) if model.packing_off_reason is not None else 3
    got = sentence.encode(model, tokenizer, texts, batch_size=batch_size)
    assert_close(got, want)
    if model.packing_off_reason is not None:
        packed = bertblocks.from_pretrained(checkpoint.directory, ["encoder.packing=always"]).eval()
        hidden = _reference_each_alone(checkpoint, checkpoint.batch)
        weights = checkpoint.batch["attention_mask"][..., None].float()
        alone = F.normalize((hidden * weights).sum(1) / weights.sum(1), dim=-1)
        assert_close(sentence.encode(packed, tokenizer, texts, batch_size=2), alone)
    out = tmp_path / "embeddings.npy"
    embed_batch = str(len(texts) if model.packing_off_reason is not None else 2)
    code = cli.main(
        ["embed", "--model", str(checkpoint.directory), "--batch-size", embed_batch, "-o", str(out), *texts]
    )
    _, err = capsys.readouterr()
    assert code == 0, err
    written = torch.from_numpy(np.load(out))
    assert written.shape == (len(checkpoint.texts), 32)
    assert_close(written, want)
    scores = _json(capsys, "similarity", "--model", str(checkpoint.directory), *checkpoint.texts)["similarity"]
    assert_close(torch.tensor(scores), want @ want.T)


# ------------------------------------------------------------------------------------------------------ CLI
def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    code = cli.main([*argv, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("name", CASES)
def test_cli_commands_on_the_family_checkpoint(checkpoints, tmp_path, capsys, name):
    checkpoint = checkpoints(name)
    config_json = str(checkpoint.directory / "config.json")
    model = bertblocks.from_pretrained(checkpoint.directory)

    validated = _json(capsys, "validate", config_json)
    assert validated["valid"] is True
    # the row's family: its model_type (a REMOTE row is named by its family: jina_bert's files say model_type bert)
    assert validated["config"]["family"] == (FAMILIES[name].model_type if name in FAMILIES else name)

    built = _json(capsys, "build", config_json)
    assert built["parameters"]["unique"] == model.num_parameters()
    # ALBERT's shared layer counts once, as in transformers
    assert built["parameters"]["unique"] == sum(p.numel() for p in checkpoint.reference.parameters())

    diagram = _json(capsys, "diagram", config_json)["mermaid"]
    assert diagram.startswith("flowchart")
    # the token-type table and its input exactly where the family has one (DeBERTa-v3's and GTE's
    # type_vocab_size 0: none, and token_type_ids are ignored)
    types = model.config.type_vocab_size
    assert (f"type {types}×32" in diagram) == (types > 0)
    assert ("token_type_ids" in diagram) == (types > 0)
    assert "type 0×" not in diagram

    # trace on the checkpoint: its weights, its tokenizer.json, and the family's special tokens
    traced = _json(capsys, "trace", str(checkpoint.directory), "--text", checkpoint.texts[0])
    assert traced["input_ids"] == checkpoint.tokenizer(checkpoint.texts[0])["input_ids"][0].tolist()
    assert traced["steps"], "no step traced"
    assert traced["steps"][-1]["outputs"]
    if checkpoint.token_types:  # a pair gets the family's pair template
        first, second = checkpoint.texts[0], checkpoint.texts[2]
        pair = _json(capsys, "trace", str(checkpoint.directory), "--text", first, "--pair", second)
        assert pair["input_ids"] == checkpoint.tokenizer([first], [second])["input_ids"][0].tolist()

    yaml_path, back = tmp_path / "family.yaml", tmp_path / "back.json"
    assert cli.main(["convert", config_json, str(yaml_path)]) == 0
    assert cli.main(["convert", str(yaml_path), str(back)]) == 0
    capsys.readouterr()
    assert json.loads(back.read_text())["model_type"] == json.loads(Path(config_json).read_text())["model_type"]
    assert bertblocks.load_config(back) == bertblocks.load_config(config_json)


@pytest.mark.parametrize("name", CASES)
def test_an_ablation_study_runs_on_the_family(checkpoints, tmp_path, name):
    """`bertblocks ablate` with the family's config.json as the base: both variants build, train and are measured
    (the study's own tokenizer sets the vocabulary)."""
    import yaml

    from bertblocks.ablation import run_study

    study = {
        "name": f"{name}-backends",
        "base": str(checkpoints(name).directory / "config.json"),
        "vary": {"encoder.attention.backend": ["eager", "sdpa"]},
        "measure": {"batch": 2, "seq_len": 16, "repeats": 1, "warmup": 0},
        "train": {"task": "mlm", "steps": 3, "batch_size": 4, "seq_len": 16, "seeds": [0], "eval_batches": 1},
        "corpus": {"sentences": 100},
        "tokenizer": {"vocab_size": 120},
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    result = run_study(path, tmp_path / "out", workers=0, progress=False, echo=None)
    rows = {s.variant: s for s in result.summaries}
    assert len(rows) == 2
    for summary in rows.values():
        assert summary.mean["params"] > 0
        assert np.isfinite(summary.mean["eval_loss"])
    # the backend does not change the model: the same seed trains the same weights to the same loss
    eager, sdpa = rows.values()
    assert eager.mean["eval_loss"] == pytest.approx(sdpa.mean["eval_loss"], abs=1e-4)
