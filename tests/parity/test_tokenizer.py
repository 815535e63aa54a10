"""The WordPiece tokenizer against transformers' BertTokenizerFast on the same files: same ids, token types and
masks for single texts and pairs, cased and uncased, from a vocab.txt written here and from MiniLM's
tokenizer.json."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
import transformers

import bertblocks
from bertblocks.hf.tokenizer import BertTokenizer, TokenizerFilesNotFoundError
from bertblocks.sentence import minilm_path

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# Enough pieces to exercise lower-casing, accents, Chinese characters, punctuation and ## continuations.
WORDS = [
    "hello", "Hello", "world", "World", "cafe", "café", "Café", "na", "##ive", "##ïve", "the", "The", "cat", "sat",
    "on", "mat", "run", "##ning", "##s", "un", "##believ", "##able", "北", "京", "欢", "迎", ",", ".", "!", "?", "'",
    "-", "a", "A", "pair", "second", "segment", "is", "longer", "than", "first", "x", "##x",
]  # fmt: skip
TEXTS = [
    "Hello, World! The cat sat on the mat.",
    "Café naïve unbelievable runnings",
    "北京欢迎你 hello",
    "  spaced\tout \n text with [MASK] and unknown zzz tokens  ",
    "a",
    "",
]
PAIRS = ["the second segment is longer than the first", "x", "A pair?", "hello world", "", "cat"]
KEYS = ("input_ids", "token_type_ids", "attention_mask")


@pytest.fixture(params=["uncased", "cased"])
def vocab_dir(request, tmp_path) -> Path:
    (tmp_path / "vocab.txt").write_text("\n".join(SPECIALS + WORDS) + "\n", encoding="utf-8")
    config = {"do_lower_case": request.param == "uncased", "model_max_length": 512}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    return minilm_path()


def _hf(directory: Path) -> transformers.PreTrainedTokenizerBase:
    logging.getLogger("transformers").setLevel(logging.ERROR)
    return transformers.BertTokenizerFast.from_pretrained(directory)


def _same(ours: dict, theirs) -> None:
    for key in KEYS:
        assert torch.equal(ours[key], theirs[key]), key


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"max_length": 9},
        {"padding": "max_length", "max_length": 24},
        {"truncation": "only_second", "max_length": 20},
    ],
    ids=["longest", "truncated", "max_length", "only_second"],
)
def test_vocab_txt_tokenizer_matches_transformers(vocab_dir, kwargs):
    ours, theirs = BertTokenizer.from_pretrained(vocab_dir), _hf(vocab_dir)
    hf_kwargs = {"padding": True, "truncation": True, **kwargs}
    if "only_second" not in str(kwargs):
        _same(ours(TEXTS, **kwargs), theirs(TEXTS, return_tensors="pt", **hf_kwargs))
    _same(ours(TEXTS, PAIRS, **kwargs), theirs(TEXTS, PAIRS, return_tensors="pt", **hf_kwargs))


def test_cased_and_uncased_vocabularies_tokenize_differently(vocab_dir):
    """Guards the comparison above: the config's do_lower_case must reach the normaliser."""
    tokens = BertTokenizer.from_pretrained(vocab_dir).tokenize("Hello Café naïve")
    cased = json.loads((vocab_dir / "tokenizer_config.json").read_text())["do_lower_case"] is False
    assert tokens == (["Hello", "Café", "na", "##ïve"] if cased else ["hello", "cafe", "na", "##ive"])


def test_minilm_tokenizer_json_matches_transformers(minilm_dir):
    ours, theirs = BertTokenizer.from_pretrained(minilm_dir), _hf(minilm_dir)
    _same(ours(TEXTS), theirs(TEXTS, padding=True, truncation=True, return_tensors="pt"))
    _same(
        ours(TEXTS, PAIRS, max_length=10),
        theirs(TEXTS, PAIRS, padding=True, truncation=True, max_length=10, return_tensors="pt"),
    )


def test_shipped_padding_and_truncation_do_not_leak(minilm_dir):
    """MiniLM's tokenizer.json pads every text to 128 and truncates at 128; our defaults must decide instead."""
    shipped = json.loads((minilm_dir / "tokenizer.json").read_text(encoding="utf-8"))
    assert shipped["padding"]["strategy"] == {"Fixed": 128}
    assert shipped["truncation"]["max_length"] == 128
    ours = BertTokenizer.from_pretrained(minilm_dir)
    short = ours("hello world")
    assert short["input_ids"].shape == (1, len(ours.tokenize("hello world")) + 2)
    long_text = "word " * 600
    assert ours(long_text)["input_ids"].shape[1] == 512  # model_max_length, not the shipped 128
    assert ours(long_text, truncation=False)["input_ids"].shape[1] == 602
    # and nothing set by one call stays for the next
    ours(["a", "a b c"], padding="max_length", max_length=40)
    assert ours("a", return_tensors=None)["input_ids"] == ours.backend.encode("a").ids


def test_single_text_without_tensors_gives_flat_lists_like_transformers(vocab_dir):
    ours, theirs = BertTokenizer.from_pretrained(vocab_dir), _hf(vocab_dir)
    mine = ours(TEXTS[0], PAIRS[0], return_tensors=None)
    hf = theirs(TEXTS[0], PAIRS[0])
    assert {k: mine[k] for k in KEYS} == {k: hf[k] for k in KEYS}
    batch = ours(TEXTS[:2], padding=False, return_tensors=None)
    assert batch["input_ids"] == theirs(TEXTS[:2])["input_ids"]


def test_decode_matches_transformers(minilm_dir, vocab_dir):
    for directory in (minilm_dir, vocab_dir):
        ours, theirs = BertTokenizer.from_pretrained(directory), _hf(directory)
        ids = ours(TEXTS, PAIRS)["input_ids"]
        for skip in (False, True):
            assert ours.batch_decode(ids, skip_special_tokens=skip) == theirs.batch_decode(
                ids, skip_special_tokens=skip
            )
            assert ours.decode(ids[0], skip_special_tokens=skip) == theirs.decode(ids[0], skip_special_tokens=skip)


def test_the_batch_goes_straight_into_the_model(minilm_dir):
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    model = bertblocks.create_model("bert-tiny-uncased", overrides={"encoder.num_layers": 1}).eval()
    inputs = tokenizer(TEXTS, PAIRS)
    with torch.no_grad():
        out = model(**inputs)
    assert out.last_hidden_state.shape == (len(TEXTS), inputs["input_ids"].shape[1], 128)


def test_from_vocab_builds_the_same_tokenizer(vocab_dir):
    lower = json.loads((vocab_dir / "tokenizer_config.json").read_text())["do_lower_case"]
    built = BertTokenizer.from_vocab(SPECIALS + WORDS, lowercase=lower)
    loaded = BertTokenizer.from_pretrained(vocab_dir)
    _same(built(TEXTS, PAIRS), loaded(TEXTS, PAIRS))


def test_a_directory_without_vocabulary_files_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(TokenizerFilesNotFoundError) as err:
        BertTokenizer.from_pretrained(tmp_path)
    assert isinstance(err.value, FileNotFoundError)
    assert "expected tokenizer.json or vocab.txt (found: config.json)" in str(err.value)


def test_a_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        BertTokenizer.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="vocabulary file not found"):
        BertTokenizer.from_vocab(tmp_path / "vocab.txt")


def test_a_vocabulary_without_the_special_tokens_is_refused(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n")
    with pytest.raises(ValueError, match="are not in the vocabulary") as err:
        BertTokenizer.from_pretrained(tmp_path)
    assert all(token in str(err.value) for token in ("[CLS]", "[SEP]", "[MASK]"))
    assert "[PAD]" not in str(err.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"padding": "longer"}, "padding must be"),
        ({"truncation": "shortest"}, "truncation must be"),
        ({"return_tensors": "np"}, "return_tensors must be 'pt' or None"),
        ({"padding": False}, "pass padding=True"),
        ({"text_pair": ["only one"]}, "text_pair must match text: 2 text"),
        ({"text_pair": ["a", "b"], "truncation": "only_second", "max_length": 4}, "cannot truncate to max_length=4"),
    ],
)
def test_bad_arguments_are_clear_errors(minilm_dir, kwargs, message):
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    with pytest.raises(ValueError, match=message):
        tokenizer(["one text", "and a longer second text"], **kwargs)
