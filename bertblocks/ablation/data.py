"""Training data for a study: the corpus, a WordPiece tokenizer trained on it, and token tensors.

The data are prepared once, in the process that runs the study, and handed to every run (local worker or
Ray task) as plain tensors: runs never read files, so a Ray worker on another machine needs none of them.

Masked-LM sequences pack consecutive sentences (``[CLS] s1 [SEP] s2 [SEP] …``) into blocks of
``seq_len`` tokens, so no step is wasted on padding; classification sequences are one review each,
``[CLS] text [SEP]`` padded to ``seq_len``.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from ..errors import InputError
from ..readers import ReadError, read_text
from .corpus import generate_labelled, generate_sentences, read_labelled, read_sentences
from .study import Study, StudyError, fingerprint

logger = logging.getLogger("bertblocks")

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


@dataclass
class PreparedData:
    """Token tensors of one study, identical for every run.

    Attributes:
        task: ``mlm`` or ``classification``.
        train_ids, eval_ids: ``[n, seq_len]`` token ids.
        train_mask, eval_mask: ``[n, seq_len]`` 1 for tokens, 0 for padding.
        train_labels, eval_labels: ``[n]`` class labels (classification), else ``None``.
        vocab_size: the tokenizer's vocabulary size (what every variant's ``vocab_size`` is set to).
        pad_id, cls_id, sep_id, mask_id: special token ids.
    """

    task: str
    train_ids: torch.Tensor
    train_mask: torch.Tensor
    eval_ids: torch.Tensor
    eval_mask: torch.Tensor
    train_labels: torch.Tensor | None
    eval_labels: torch.Tensor | None
    vocab_size: int
    pad_id: int
    cls_id: int
    sep_id: int
    mask_id: int

    @property
    def special_ids(self) -> list[int]:
        return [self.pad_id, self.cls_id, self.sep_id, self.mask_id]


def _bert_tokenizer(vocab: dict[str, int], lowercase: bool) -> Tokenizer:
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tokenizer


def train_tokenizer(texts: list[str], vocab_size: int, lowercase: bool = True, trainer: str = "frequency") -> Tokenizer:
    """A BERT-style WordPiece tokenizer (``tokenizers``) for ``texts``; ``[PAD]`` is id 0.

    Args:
        texts: the corpus.
        vocab_size: the largest vocabulary.
        lowercase: BERT's uncased normalisation.
        trainer: ``frequency`` (default): the special tokens, every character (as a word start and as a
            ``##`` continuation, so any word can be spelt), then whole words by frequency (ties
            alphabetical) up to ``vocab_size``. A pure function of the corpus. ``wordpiece``: the
            ``tokenizers`` WordPiece trainer, which learns sub-word merges but breaks ties between equally
            frequent merges in hash order, so two trainings on one corpus can differ (we saw 5 of 6 differ):
            runs on different executors would then not see the same token ids.
    """
    if trainer == "wordpiece":
        tokenizer = _bert_tokenizer({"[UNK]": 0}, lowercase)
        wordpiece = trainers.WordPieceTrainer(
            vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False
        )
        tokenizer.train_from_iterator(texts, wordpiece)
        return tokenizer
    probe = _bert_tokenizer({"[UNK]": 0}, lowercase)
    counts: Counter[str] = Counter()
    for text in texts:
        normal = probe.normalizer.normalize_str(text)  # type: ignore[union-attr]
        counts.update(word for word, _ in probe.pre_tokenizer.pre_tokenize_str(normal))  # type: ignore[union-attr]
    letters = sorted({ch for word in counts for ch in word})
    tokens = [*SPECIAL_TOKENS, *letters, *(f"##{ch}" for ch in letters)]
    if len(tokens) > vocab_size:
        raise InputError(f"vocab_size {vocab_size} is below the {len(tokens)} special and character tokens")
    seen = set(tokens)
    for word, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        if len(tokens) >= vocab_size:
            break
        if word not in seen:
            tokens.append(word)
            seen.add(word)
    return _bert_tokenizer({token: i for i, token in enumerate(tokens)}, lowercase)


def load_texts(study: Study) -> tuple[list[str], list[int] | None]:
    """The corpus of ``study``: texts, and labels for classification.

    Raises:
        StudyError: a corpus file that is missing or malformed.
    """
    spec = study.spec
    task = spec.train.task if spec.train else "mlm"
    corpus = spec.corpus
    if corpus.kind == "generated":
        if task == "classification":
            pairs = generate_labelled(corpus.sentences, corpus.seed)
            return [t for t, _ in pairs], [y for _, y in pairs]
        return generate_sentences(corpus.sentences, corpus.seed), None
    assert corpus.path is not None
    path = study.resolve(corpus.path)
    try:
        if task == "classification":
            pairs = read_labelled(path)
            return [t for t, _ in pairs], [y for _, y in pairs]
        return read_sentences(path), None
    except FileNotFoundError:
        raise StudyError.single("corpus.path", f"file not found: {path}", study) from None
    except ValueError as e:
        raise StudyError.single("corpus.path", str(e), study) from None


def tokenizer_key(study: Study, texts: list[str]) -> str:
    """What a trained tokenizer is a function of: the tokenizer settings and the corpus text."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8", "surrogatepass") + b"\0")
    return fingerprint({"tokenizer": study.spec.tokenizer.model_dump(mode="json"), "corpus": digest.hexdigest()})


def get_tokenizer(study: Study, texts: list[str], saved: Path | None = None) -> Tokenizer:
    """The study's tokenizer: ``tokenizer.path``, else the one ``saved`` by an earlier run of the same
    settings and corpus, else trained.

    An earlier tokenizer is reused only when its key (``tokenizer.key`` beside it, see
    :func:`tokenizer_key`) matches: a changed ``tokenizer.vocab_size`` or corpus trains a new one, and the
    runs that depend on it are redone.
    """
    spec = study.spec.tokenizer
    if spec.path:
        path = study.resolve(spec.path)
        if not path.is_file():
            raise StudyError.single("tokenizer.path", f"file not found: {path}", study)
        try:
            return Tokenizer.from_str(read_text(path))  # bounded: size, UTF-8, NUL bytes
        except ReadError as e:
            raise StudyError.single("tokenizer.path", str(e), study) from None
        except Exception as e:  # the tokenizers library raises a bare Exception for a malformed file
            raise StudyError.single("tokenizer.path", f"{path} is not a tokenizer.json file ({e})", study) from None
    key_file = saved.with_suffix(".key") if saved is not None else None
    if (
        saved is not None
        and key_file is not None
        and saved.is_file()
        and _read_key(key_file) == tokenizer_key(study, texts)
    ):
        try:
            return Tokenizer.from_str(read_text(saved))
        except Exception as e:  # a damaged file in the output folder: train again (the runs follow its fingerprint)
            logger.warning("%s is not a readable tokenizer (%s); training a new one", saved, e)
    try:
        return train_tokenizer(texts, spec.vocab_size, spec.lowercase, spec.trainer)
    except ValueError as e:
        raise StudyError.single("tokenizer.vocab_size", str(e), study) from None


def _read_key(path: Path) -> str | None:
    """The key saved beside a tokenizer; ``None`` (no match: train again) when it is not readable text."""
    try:
        return read_text(path, limit=2**16).strip()
    except (OSError, ReadError):
        return None


def prepare(study: Study, tokenizer: Tokenizer, texts: list[str], labels: list[int] | None) -> PreparedData:
    """Tokenise the corpus into train/eval tensors for ``study.spec.train``."""
    train = study.spec.train
    assert train is not None
    ids = {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS}
    missing = [tok for tok, i in ids.items() if i is None]
    if missing:
        raise StudyError.single("tokenizer", f"the tokenizer lacks the special tokens {missing}", study)
    n_eval = max(1, round(len(texts) * study.spec.corpus.eval_fraction))
    if len(texts) - n_eval < 1:
        raise StudyError.single("corpus", f"{len(texts)} sentences are too few to hold some out", study)
    encoded = [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    pad, cls, sep = ids["[PAD]"], ids["[CLS]"], ids["[SEP]"]
    length = train.seq_len
    if train.task == "mlm":
        train_ids = _pack(encoded[:-n_eval], cls, sep, length)
        eval_ids = _pack(encoded[-n_eval:], cls, sep, length)
        if not len(train_ids) or not len(eval_ids):
            raise StudyError.single("corpus", f"too little text for one block of {length} tokens", study)
        train_mask, eval_mask = torch.ones_like(train_ids), torch.ones_like(eval_ids)
        train_labels = eval_labels = None
    else:
        assert labels is not None
        if max(labels) >= train.num_labels:
            raise StudyError.single("train.num_labels", f"the corpus has label {max(labels)}", study)
        train_ids, train_mask = _pad([[cls, *e[: length - 2], sep] for e in encoded[:-n_eval]], pad, length)
        eval_ids, eval_mask = _pad([[cls, *e[: length - 2], sep] for e in encoded[-n_eval:]], pad, length)
        train_labels, eval_labels = torch.tensor(labels[:-n_eval]), torch.tensor(labels[-n_eval:])
    return PreparedData(
        task=train.task,
        train_ids=train_ids,
        train_mask=train_mask,
        eval_ids=eval_ids,
        eval_mask=eval_mask,
        train_labels=train_labels,
        eval_labels=eval_labels,
        vocab_size=tokenizer.get_vocab_size(),
        pad_id=pad,
        cls_id=cls,
        sep_id=sep,
        mask_id=ids["[MASK]"],
    )


def _pack(encoded: list[list[int]], cls: int, sep: int, length: int) -> torch.Tensor:
    stream = [token for sentence in encoded for token in (*sentence, sep)]
    body = length - 1  # each block starts with [CLS]
    blocks = [[cls, *stream[i : i + body]] for i in range(0, len(stream) - body + 1, body)]
    return torch.tensor(blocks, dtype=torch.long).reshape(len(blocks), length)


def _pad(rows: list[list[int]], pad: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(rows), length), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask
