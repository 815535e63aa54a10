"""Any tokenizer.json through ``tokenizers`` with each family's special tokens and pair template: the same ids
as transformers' tokenizer class of that family on the same files (WordPiece, BPE and Unigram models, trained
in the test with ``tokenizers``' trainers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from bertblocks import BertTokenizer

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a tiny corpus for tokenizer tests, with punctuation!",
    "héllo wörld: accents and numbers 12345",
    "models load checkpoints and save them again",
] * 10
TEXTS = ["the quick fox", "hello tiny world, again!", "numbers 42 and accents é"]
PAIRS = ["a lazy dog", "checkpoints", "save them"]


def wordpiece() -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=200, special_tokens=specials))
    return tok


def mpnet_wordpiece() -> Tokenizer:
    """MPNet's kind: BERT's WordPiece pipeline, RoBERTa's special tokens, BERT's [UNK]."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    specials = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]
    tok.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=200, special_tokens=specials))
    return tok


def bpe() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def unigram() -> Tokenizer:
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    trainer = trainers.UnigramTrainer(vocab_size=150, special_tokens=specials, unk_token="<unk>")
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def albert_unigram() -> Tokenizer:
    tok = Tokenizer(models.Unigram())
    # the normaliser published ALBERT tokenizer.json files carry (lower-cased, accents stripped)
    tok.normalizer = normalizers.Sequence(
        [
            normalizers.Replace("``", '"'),
            normalizers.Replace("''", '"'),
            normalizers.NFKD(),
            normalizers.StripAccents(),
            normalizers.Lowercase(),
        ]
    )
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    specials = ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.UnigramTrainer(vocab_size=150, special_tokens=specials, unk_token="<unk>")
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def bert_processor(tok: Tokenizer) -> processors.TemplateProcessing:
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    return processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )


def roberta_processor(tok: Tokenizer) -> processors.PostProcessor:
    return processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")))


def xlmr_processor(tok: Tokenizer) -> processors.TemplateProcessing:
    s, e = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    return processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", s), ("</s>", e)]
    )


CASES = {
    "wordpiece-bert": (wordpiece, bert_processor, "BertTokenizer"),
    "wordpiece-distilbert": (wordpiece, bert_processor, "DistilBertTokenizer"),
    "bpe-roberta": (bpe, roberta_processor, "RobertaTokenizer"),
    "unigram-xlm-roberta": (unigram, xlmr_processor, "XLMRobertaTokenizer"),
    "unigram-albert": (albert_unigram, bert_processor, "AlbertTokenizer"),
    "wordpiece-mpnet": (mpnet_wordpiece, roberta_processor, "MPNetTokenizer"),
}


def save(directory: Path, tok: Tokenizer, tokenizer_class: str) -> Path:
    directory.mkdir(exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": tokenizer_class}))
    return directory


@pytest.mark.parametrize("case", list(CASES))
def test_ids_equal_transformers_tokenizer_of_the_family(tmp_path, case):
    train, processor, tokenizer_class = CASES[case]
    tok = train()
    tok.post_processor = processor(tok)
    directory = save(tmp_path, tok, tokenizer_class)
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    assert type(theirs).__name__ == tokenizer_class  # the family's own class read the files
    ours = BertTokenizer.from_pretrained(directory)
    for args in ((TEXTS,), (TEXTS, PAIRS)):
        expected = theirs(*args, padding=True, return_tensors="pt")
        got = ours(*args)
        assert sorted(got) == sorted(expected.keys())  # RoBERTa and DistilBERT return no token types
        for key in got:
            assert got[key].tolist() == expected[key].tolist(), key
    assert ours.pad_token_id == theirs.pad_token_id
    assert ours.mask_token_id == theirs.mask_token_id
    assert ours.unk_token_id == theirs.unk_token_id


def test_tokenizer_json_without_a_post_processor_gets_the_family_template(tmp_path):
    tok = bpe()
    directory = save(tmp_path / "t", tok, "RobertaTokenizer")
    (directory / "config.json").write_text(json.dumps({"model_type": "roberta"}))
    ours = BertTokenizer.from_pretrained(directory)
    framed = tok.encode("a lazy dog", "the fox")
    ids = ours("a lazy dog", "the fox", return_tensors=None)["input_ids"]
    s, e = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    a = tok.encode("a lazy dog", add_special_tokens=False).ids
    b = tok.encode("the fox", add_special_tokens=False).ids
    assert framed.ids == a + b  # the file itself frames nothing
    assert ids == [s, *a, e, e, *b, e]


def test_family_argument_wins_and_unknown_family_is_an_error(tmp_path):
    tok = wordpiece()
    tok.post_processor = bert_processor(tok)
    directory = save(tmp_path, tok, "BertTokenizer")
    assert "token_type_ids" not in BertTokenizer.from_pretrained(directory, family="distilbert")("a dog")
    with pytest.raises(ValueError, match="no model family handles 'gpt2'"):
        BertTokenizer.from_pretrained(directory, family="gpt2")
