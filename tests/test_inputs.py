"""Bad inputs get an error naming the argument and the fix: forward inputs (shapes, dtypes, ranges, empty
batches, RoBERTa-style positions past the table, output_attentions a backend cannot honour), max lengths,
non-UTF-8 input files, non-finite weights and embeddings; dtype="auto" follows the checkpoint exactly.
Outputs read by attribute, key and index."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import bertblocks
from bertblocks import cli
from tests.conftest import TINY, batch


@pytest.fixture(scope="module")
def model() -> bertblocks.BertModel:
    torch.manual_seed(0)
    return bertblocks.create_model(TINY).eval()


@pytest.fixture(scope="module")
def relative() -> bertblocks.BertModel:
    torch.manual_seed(0)
    return bertblocks.create_model(TINY, ["position=relative_key"]).eval()


IDS = batch()["input_ids"]  # [3, 9]
LONG = torch.ones(1, 65, dtype=torch.long)  # max_position_embeddings is 64


def _raises(model: bertblocks.BertModel, message: str, **inputs: object) -> None:
    with pytest.raises(ValueError, match=re.escape(message)), torch.no_grad():
        model(**inputs)


# ------------------------------------------------------------------------------------------ input_ids
@pytest.mark.parametrize("bad", [-1, 99, 10_000])
def test_input_ids_outside_the_vocabulary(model, bad: int):
    ids = IDS.clone()
    ids[1, 4] = bad
    _raises(model, f"input_ids hold {bad}, outside the vocabulary [0, 99) of this model", input_ids=ids)


def test_float_input_ids(model):
    _raises(model, "input_ids must be an integer tensor; got torch.float32", input_ids=IDS.float())


def test_input_ids_of_the_wrong_rank(model):
    _raises(model, "input_ids must be [batch, seq]; got shape (9,)", input_ids=IDS[0])


def test_neither_or_both_of_input_ids_and_inputs_embeds(model):
    _raises(model, "give exactly one of input_ids and inputs_embeds")
    _raises(model, "give exactly one of input_ids and inputs_embeds", input_ids=IDS, inputs_embeds=torch.ones(3, 9, 32))


def test_inputs_embeds_of_the_wrong_width(model):
    _raises(model, "inputs_embeds must be [batch, seq, 32]; got (3, 9, 31)", inputs_embeds=torch.ones(3, 9, 31))


@pytest.mark.parametrize("which", ["absolute", "relative"])
def test_sequence_longer_than_max_position_embeddings(model, relative, which: str):
    chosen = model if which == "absolute" else relative
    message = "sequence length 65 exceeds max_position_embeddings=64 of this model"
    _raises(chosen, message, input_ids=LONG)
    _raises(chosen, message, inputs_embeds=torch.zeros(1, 65, 32))
    with torch.no_grad():  # the longest allowed sequence runs
        assert chosen(input_ids=LONG[:, :64]).last_hidden_state.shape == (1, 64, 32)


# -------------------------------------------------------------------------------------- attention_mask
def test_two_d_mask_of_the_wrong_length(model):
    _raises(
        model,
        "attention_mask has shape (3, 8) but the input needs (3, 9)",
        input_ids=IDS,
        attention_mask=torch.ones(3, 8, dtype=torch.long),
    )
    _raises(
        model,
        "attention_mask has shape (2, 9) but the input needs (3, 9)",
        input_ids=IDS,
        attention_mask=torch.ones(2, 9, dtype=torch.long),
    )


def test_three_d_mask_of_the_wrong_shape(model):
    _raises(
        model,
        "attention_mask has shape (3, 8, 9) but the input needs (3, 9, 9)",
        input_ids=IDS,
        attention_mask=torch.ones(3, 8, 9),
    )


def test_four_d_mask(model):
    _raises(
        model,
        "attention_mask must be 2-D [batch, key_len] or 3-D [batch, query_len, key_len]; got 4-D with shape "
        "(3, 1, 1, 9)",
        input_ids=IDS,
        attention_mask=torch.ones(3, 1, 1, 9),
    )


@pytest.mark.parametrize(
    "mask",
    [
        torch.zeros(3, 9) - 10000.0,  # an additive mask passed where a padding mask belongs
        torch.where(torch.arange(9) < 6, 0.0, torch.finfo(torch.float32).min).expand(3, 9),
        torch.full((3, 9), 2, dtype=torch.long),  # not 0/1 either: (1 - 2) * min is a huge positive bias
    ],
)
def test_additive_or_non_binary_mask(model, mask: torch.Tensor):
    _raises(model, "attention_mask holds values outside [0, 1]", input_ids=IDS, attention_mask=mask)


@pytest.mark.parametrize("dtype", [torch.bool, torch.long, torch.float32])
def test_zero_one_masks_of_every_dtype_agree(model, dtype: torch.dtype):
    mask = batch()["attention_mask"]
    with torch.no_grad():
        expected = model(input_ids=IDS, attention_mask=mask).last_hidden_state
        got = model(input_ids=IDS, attention_mask=mask.to(dtype)).last_hidden_state
    assert torch.equal(got, expected)  # every dtype becomes the same additive mask: same kernels, same data


# ------------------------------------------------------------------------------ token types, positions
def test_token_type_ids_out_of_range(model):
    types = torch.zeros(3, 9, dtype=torch.long)
    types[0, 0] = 2
    _raises(model, "token_type_ids must lie in [0, 2) (type_vocab_size)", input_ids=IDS, token_type_ids=types)
    _raises(model, "token_type_ids must lie in [0, 2)", input_ids=IDS, token_type_ids=types - 3)


def test_token_type_ids_of_the_wrong_shape_or_dtype(model):
    _raises(
        model,
        "token_type_ids must have the input's shape (3, 9); got (3, 8)",
        input_ids=IDS,
        token_type_ids=torch.zeros(3, 8, dtype=torch.long),
    )
    _raises(
        model,
        "token_type_ids must be an integer tensor; got torch.float32",
        input_ids=IDS,
        token_type_ids=torch.zeros(3, 9),
    )


def test_position_ids_out_of_range_shape_or_dtype(model):
    _raises(
        model,
        "position_ids must lie in [0, 64) (max_position_embeddings)",
        input_ids=IDS,
        position_ids=torch.arange(56, 65)[None],
    )
    _raises(model, "position_ids must lie in [0, 64)", input_ids=IDS, position_ids=torch.arange(-1, 8)[None])
    _raises(
        model,
        "position_ids must be [batch or 1, 9]; got shape (2, 9)",
        input_ids=IDS,
        position_ids=torch.arange(9).expand(2, 9),
    )
    _raises(
        model,
        "position_ids must be an integer tensor; got torch.float32",
        input_ids=IDS,
        position_ids=torch.arange(9.0)[None],
    )


@pytest.mark.parametrize("shape", [(3,), (5,), (3, 4), (2, 3), (2, 4, 1)])
def test_head_mask_of_the_wrong_shape(model, shape: tuple[int, ...]):
    _raises(
        model,
        f"head_mask must be [num_heads] = [4] or [num_layers, num_heads] = [2, 4]; got shape {shape}",
        input_ids=IDS,
        head_mask=torch.ones(shape),
    )


# ------------------------------------------------------------------------------------------------ outputs
def test_outputs_read_by_attribute_key_and_index(model):
    with torch.no_grad():
        out = model(**batch(), output_hidden_states=True, output_attentions=True)
    assert out["last_hidden_state"] is out.last_hidden_state is out[0]
    assert out["pooler_output"] is out.pooler_output is out[1]
    assert out["hidden_states"] is out.hidden_states is out[2]
    assert out["attentions"] is out.attentions is out[3]
    assert out.keys() == ["last_hidden_state", "pooler_output", "hidden_states", "attentions"]
    assert list(out) == out.keys()
    assert "past_key_values" not in out
    assert len(out.hidden_states) == 3
    assert out.attentions[0].shape == (3, 4, 9, 9)
    with pytest.raises(KeyError, match="no field 'logits' set"):
        out["logits"]
    first, pooled, *_ = out.to_tuple()
    assert first is out.last_hidden_state
    assert pooled is out.pooler_output


def test_return_dict_false_is_a_tuple_without_nones(model):
    inputs = batch()
    with torch.no_grad():
        out = model(**inputs)
        plain = model(**inputs, return_dict=False)
        with_hidden = model(**inputs, return_dict=False, output_hidden_states=True)
    assert type(plain) is tuple
    assert len(plain) == 2
    # the same forward pass, only packed differently: bit-equal
    assert torch.equal(plain[0], out.last_hidden_state)
    assert torch.equal(plain[1], out.pooler_output)
    assert len(with_hidden) == 3
    assert len(with_hidden[2]) == 3  # embeddings + 2 layers


# --------------------------------------------------------------------------- dtypes, empty batches, offsets
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16])
def test_ids_of_a_dtype_the_embedding_cannot_index(model, dtype: torch.dtype):
    _raises(
        model,
        f"input_ids must be torch.long or int; got {dtype} (convert with input_ids.long())",
        input_ids=IDS.to(dtype),
    )
    _raises(
        model,
        f"token_type_ids must be torch.long or int; got {dtype} (convert with token_type_ids.long())",
        input_ids=IDS,
        token_type_ids=torch.zeros(3, 9, dtype=dtype),
    )
    with torch.no_grad():  # int32 is what an embedding takes besides int64: the same numbers
        torch.testing.assert_close(model(input_ids=IDS.int()).last_hidden_state, model(input_ids=IDS).last_hidden_state)


def test_inputs_embeds_of_another_dtype(model):
    embeds = model.get_input_embeddings()(IDS)
    _raises(
        model,
        "inputs_embeds are torch.float64 but this model computes in torch.float32: pass "
        "inputs_embeds.to(torch.float32) (or convert the model with model.to(torch.float64))",
        inputs_embeds=embeds.double(),
    )
    _raises(
        model,
        "inputs_embeds must be a floating-point tensor in torch.float32; got torch.int64",
        inputs_embeds=IDS[..., None].expand(3, 9, 32),
    )
    with torch.no_grad():
        torch.testing.assert_close(
            model(inputs_embeds=embeds).last_hidden_state, model(input_ids=IDS).last_hidden_state
        )


@pytest.mark.parametrize("with_mask", [True, False])
def test_an_empty_batch(model, with_mask: bool):
    # without the check, a task model's loss over the empty outputs is NaN, silently
    mask = torch.zeros(0, 9, dtype=torch.long) if with_mask else None
    message = "input_ids is an empty batch (batch size 0); give at least one sequence, or skip the call"
    _raises(model, message, input_ids=IDS[:0], attention_mask=mask)
    _raises(model, message.replace("input_ids", "inputs_embeds"), inputs_embeds=torch.zeros(0, 9, 32))


@pytest.fixture(scope="module")
def roberta() -> bertblocks.BertModel:
    torch.manual_seed(0)
    config = bertblocks.load_config(
        {
            "model_type": "roberta",
            "vocab_size": 99,
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "intermediate_size": 37,
            "max_position_embeddings": 514,
            "pad_token_id": 1,
        }
    )
    return bertblocks.create_model(config).eval()


def test_roberta_positions_past_the_table_name_the_longest_input(roberta):
    # RoBERTa's positions start after pad_token_id: 514 positions hold 512 tokens (roberta-base gave a raw
    # IndexError at 513)
    message = (
        "sequence length 513 needs position 514, past the 514 positions of this model (max_position_embeddings=514); "
        "its positions start after pad_token_id=1, so it takes at most 512 tokens: truncate the input "
        "(e.g. tokenizer max_length=512)"
    )
    _raises(roberta, message, input_ids=torch.full((1, 513), 5))
    _raises(roberta, message, inputs_embeds=torch.zeros(1, 513, 32))
    with torch.no_grad():
        assert roberta(input_ids=torch.full((1, 512), 5)).last_hidden_state.shape == (1, 512, 32)
        # padding keeps position pad: a 513-long row with one padding token needs position 513 only
        padded = torch.full((2, 513), 5)
        padded[1, -1] = 1
        rows = roberta(input_ids=padded[1:], attention_mask=padded[1:].ne(1).long()).last_hidden_state
        alone = roberta(input_ids=padded[1:, :512]).last_hidden_state
        torch.testing.assert_close(rows[:, :512], alone, atol=1e-5, rtol=1e-5)


def test_roberta_offsets_agree_with_transformers_at_the_longest_input(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.RobertaConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=514,  # roberta-base's
    )
    torch.manual_seed(0)
    theirs = transformers.RobertaModel(config).eval()
    theirs.save_pretrained(tmp_path)
    ours = bertblocks.from_pretrained(tmp_path).eval()
    ids = torch.randint(3, 99, (1, 512))
    with torch.no_grad():
        torch.testing.assert_close(
            ours(input_ids=ids).last_hidden_state, theirs(input_ids=ids).last_hidden_state, atol=1e-5, rtol=1e-5
        )
        with pytest.raises((IndexError, RuntimeError)):  # transformers fails deep inside at 513; ours names the limit
            theirs(input_ids=torch.randint(3, 99, (1, 513)))
    _raises(ours, "so it takes at most 512 tokens", input_ids=torch.randint(3, 99, (1, 513)))


# ------------------------------------------------------------------------------ output_attentions capability
def test_output_attentions_on_a_backend_without_weights_is_refused():
    from bertblocks.core.capabilities import CapabilityError
    from bertblocks.core.interfaces import BackendCapabilities
    from bertblocks.plugins.backends import SdpaBackend

    class NoWeights(SdpaBackend):
        name = "no_weights"
        capabilities = BackendCapabilities(additive_mask=True, attention_weights=False, causal=True, dropout=True)

        def __call__(self, query, key, value, **kwargs):
            return super().__call__(query, key, value, **{**kwargs, "need_weights": False})

    torch.manual_seed(0)
    subject = bertblocks.create_model(TINY).eval()
    for module in subject.modules():
        if hasattr(module, "backend"):
            module.backend = NoWeights()
    with torch.no_grad():
        assert subject(input_ids=IDS).attentions is None  # without output_attentions it runs as before
        for packing in ("never", "always"):
            subject.config.encoder.packing = packing
            with pytest.raises(
                ValueError,
                match=re.escape(
                    "output_attentions=True, but attention backend 'no_weights' cannot return attention weights"
                ),
            ) as info:
                subject(**batch(), output_attentions=True)
            assert "attn_implementation='eager'" in str(info.value)
            assert isinstance(info.value, CapabilityError)  # a BertBlocksError, as every refusal


# ---------------------------------------------------------------------------------------- max lengths
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "alpha", "beta", *[f"[unused{i}]" for i in range(92)]]


@pytest.mark.parametrize("bad", [-3, 0, True, 2.5])
def test_a_max_length_that_is_not_a_positive_count_is_named(bad):
    tokenizer = bertblocks.BertTokenizer.from_vocab(VOCAB)
    with pytest.raises(ValueError, match=re.escape(f"max_length must be a positive number of tokens; got {bad!r}")):
        tokenizer(["alpha beta"], max_length=bad)
    with pytest.raises(
        ValueError, match=re.escape(f"model_max_length must be a positive number of tokens; got {bad!r}")
    ):
        bertblocks.BertTokenizer.from_vocab(VOCAB, model_max_length=bad)
    assert tokenizer(["alpha beta alpha"], max_length=3)["input_ids"].tolist() == [[2, 5, 3]]


def test_a_negative_model_max_length_in_tokenizer_config_names_the_file(tmp_path):
    bertblocks.BertTokenizer.from_vocab(VOCAB).save_pretrained(tmp_path)
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "model_max_length": -5}))
    with pytest.raises(ValueError, match=re.escape(f"{config}: model_max_length is -5; it must be a positive number")):
        bertblocks.BertTokenizer.from_pretrained(tmp_path)


# --------------------------------------------------------------------------------- checkpoints and embed
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny model and its tokenizer, saved."""
    directory = tmp_path_factory.mktemp("tiny")
    bertblocks.BertTokenizer.from_vocab(VOCAB, model_max_length=64).save_pretrained(directory)
    torch.manual_seed(0)
    bertblocks.create_model(TINY).save_pretrained(directory)
    return directory


def _with_nan(checkpoint: Path, target: Path, name: str = "encoder.layer.0.attention.self.query.weight") -> Path:
    shutil.copytree(checkpoint, target)
    tensors = load_file(target / "model.safetensors")
    tensors[name][0, :3] = torch.tensor([float("nan"), float("inf"), 1.0])
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    return target


def test_non_finite_weights_are_named_at_load(checkpoint, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="bertblocks"):
        bertblocks.BertModel.from_pretrained(checkpoint)
    assert "non-finite" not in caplog.text
    damaged = _with_nan(checkpoint, tmp_path / "damaged")
    with caplog.at_level(logging.WARNING, logger="bertblocks"):
        bertblocks.BertModel.from_pretrained(damaged)
    assert "holds non-finite weights (NaN or inf)" in caplog.text
    assert "encoder.layer.0.attention.self.query.weight (2 values)" in caplog.text


def test_the_non_finite_count_is_exact_and_ignores_sums_that_merely_overflow():
    from bertblocks.models.meta_device import non_finite

    tensors = {
        "overflows": torch.full((10,), 6e4, dtype=torch.float16),  # sums to inf in float16, every value finite
        "damaged": torch.tensor([1.0, float("nan"), float("-inf"), 2.0, float("inf")]),
        "ids": torch.arange(3),
    }
    assert non_finite(tensors) == non_finite(tensors, chunk=2) == {"damaged": 3}


def test_embed_refuses_to_write_nan_vectors(checkpoint, tmp_path, capsys):
    damaged = _with_nan(checkpoint, tmp_path / "damaged")
    output = tmp_path / "out.npy"
    code = cli.main(["embed", "--model", str(damaged), "--output", str(output), "alpha beta", "beta"])
    assert code == 1
    err = capsys.readouterr().err
    assert (
        "non-finite embeddings (NaN or inf) for 2 of 2 texts (first: text 1, 'alpha beta'); nothing was written" in err
    )
    assert not output.exists()
    assert cli.main(["embed", "--model", str(checkpoint), "--output", str(output), "alpha beta"]) == 0
    assert np.isfinite(np.load(output)).all()


def test_embed_names_the_line_that_is_not_utf8(checkpoint, tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"alpha\nbeta\nalpha \xff beta\n")
    assert cli.main(["embed", "--model", str(checkpoint), "--input", str(corpus)]) == 1
    err = capsys.readouterr().err
    assert f"{corpus}, line 3: not UTF-8 text (byte 0xff at column 7)" in err
    assert "bug" not in err
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_bytes(b'{"text": "alpha"}\n{"text": "b\xe9ta"}\n')
    assert cli.main(["embed", "--model", str(checkpoint), "--input", str(jsonl)]) == 1
    assert f"{jsonl}, line 2: not UTF-8 text (byte 0xe9 at column 12)" in capsys.readouterr().err


def test_embed_refuses_a_negative_max_length(checkpoint, capsys):
    assert cli.main(["embed", "--model", str(checkpoint), "--max-length", "-4", "alpha"]) == 1
    assert "--max-length must be at least 1 token, got -4" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- dtype="auto"
@pytest.fixture(scope="module")
def float64_checkpoint(tmp_path_factory) -> tuple[Path, Any]:
    """transformers' BERT in float64, saved without a dtype in config.json: only the weights say float64."""
    transformers = pytest.importorskip("transformers")
    directory = tmp_path_factory.mktemp("f64")
    config = transformers.BertConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        initializer_range=0.2,
    )
    torch.manual_seed(0)
    theirs = transformers.BertModel(config).double().eval()
    with torch.no_grad():  # values float32 cannot hold (initialised in float32, they all could)
        for parameter in theirs.parameters():
            parameter.add_(torch.randn_like(parameter) * 1e-6)
    theirs.save_pretrained(directory)
    data = json.loads((directory / "config.json").read_text())
    data.pop("dtype", None)
    data.pop("torch_dtype", None)
    (directory / "config.json").write_text(json.dumps(data))
    return directory, theirs


@pytest.mark.parametrize("dtype", ["auto", torch.float64, "float64"])
def test_a_float64_checkpoint_loads_exactly(float64_checkpoint, dtype):
    directory, theirs = float64_checkpoint
    ours = bertblocks.BertModel.from_pretrained(directory, dtype=dtype).eval()
    assert ours.dtype == torch.float64
    state = load_file(directory / "model.safetensors")
    mapped = {k.removeprefix("bert."): v for k, v in state.items()}
    for name, tensor in ours.state_dict().items():
        if name in mapped:  # not one bit lost (through float32, a weight moved by up to ~1e-7)
            assert torch.equal(tensor, mapped[name]), name
    ids = torch.randint(0, 99, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(
            ours(input_ids=ids).last_hidden_state, theirs(input_ids=ids).last_hidden_state, atol=1e-12, rtol=0
        )


def test_auto_follows_config_json_before_the_weights(float64_checkpoint, tmp_path):
    directory, _ = float64_checkpoint
    shutil.copytree(directory, tmp_path / "c")
    data = json.loads((tmp_path / "c" / "config.json").read_text())
    (tmp_path / "c" / "config.json").write_text(json.dumps({**data, "torch_dtype": "bfloat16"}))
    assert bertblocks.BertModel.from_pretrained(tmp_path / "c", dtype="auto").dtype == torch.bfloat16
    # without dtype=, a model loads in float32 whatever the checkpoint holds (transformers 4's default)
    assert bertblocks.BertModel.from_pretrained(directory).dtype == torch.float32


def test_tokenizer_files_that_are_not_utf8_name_the_file_and_line(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_bytes(b"[PAD]\n[UNK]\nca\xeff\n")
    with pytest.raises(ValueError, match=re.escape(f"{vocab}, line 3: not UTF-8 text (byte 0xef at column 3)")):
        bertblocks.BertTokenizer.from_vocab(vocab)
    bertblocks.BertTokenizer.from_vocab(VOCAB).save_pretrained(tmp_path / "saved")
    config = tmp_path / "saved" / "tokenizer_config.json"
    config.write_bytes(b'{"model_max_length": 5\xff}')
    with pytest.raises(ValueError, match=re.escape(f"{config}, line 1: not UTF-8 text (byte 0xff at column 23)")):
        bertblocks.BertTokenizer.from_pretrained(tmp_path / "saved")
