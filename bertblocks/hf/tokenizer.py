"""BERT's WordPiece tokenizer: a thin layer over the ``tokenizers`` library.

:meth:`BertTokenizer.from_pretrained` loads a ``tokenizer.json`` when the directory (or hub repository) has one,
and otherwise builds the same pipeline transformers builds from ``vocab.txt`` and ``tokenizer_config.json``:

* normaliser — ``BertNormalizer`` (clean text, Chinese characters split out, lower-casing and accent stripping
  as the config says: ``do_lower_case``, ``strip_accents``, ``tokenize_chinese_chars``);
* pre-tokeniser — ``BertPreTokenizer`` (whitespace and punctuation);
* model — ``WordPiece`` with ``##`` continuation pieces and ``[UNK]``;
* post-processor — ``[CLS] A [SEP]`` for single texts and ``[CLS] A [SEP] B [SEP]`` for pairs, token types
  0 for the first segment and 1 for the second;
* decoder — ``WordPiece`` (joins ``##`` pieces).

A shipped ``tokenizer.json`` can carry fixed padding and truncation (all-MiniLM-L6-v2's pads every text to
128); they are cleared on load, so that only the arguments of :meth:`BertTokenizer.__call__` decide.

Example:
    >>> tok = BertTokenizer.from_pretrained(bertblocks.sentence.minilm_path())
    >>> batch = tok(["A short text.", "A longer text, with a pair."], ["its pair", "the pair"])
    >>> model(**batch).last_hidden_state.shape
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from tokenizers import Encoding, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from ..atomic import Writer, reading, replace_files
from ..errors import BertBlocksError, InputError
from ..families.family import BERT_TOKENIZER, TokenizerConvention
from ..readers import ReadError, parse_json, read_json, read_lines, read_text
from .hub import resolve_tokenizer_files

TOKENIZER_JSON = "tokenizer.json"
VOCAB_TXT = "vocab.txt"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
#: BERT's special tokens and the names tokenizer_config.json / special_tokens_map.json give them
DEFAULT_SPECIAL_TOKENS = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}
#: transformers' stand-in for "no limit" (a very large int) in tokenizer_config.json
_NO_LIMIT = 10**20

Padding = bool | Literal["longest", "max_length", "do_not_pad"]
Truncation = bool | Literal["longest_first", "only_first", "only_second", "do_not_truncate"]


class TokenizerFilesNotFoundError(BertBlocksError, FileNotFoundError):
    """A tokenizer directory with neither ``tokenizer.json`` nor ``vocab.txt`` (or a vocabulary file missing)."""


class TokenizerFileError(BertBlocksError, ValueError):
    """A tokenizer file that cannot be used: not valid JSON, or special tokens missing from its vocabulary."""


def _token_count(name: str, value: Any) -> int:
    """``value`` as a length in tokens (an integer of at least 1), or a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{name} must be a positive number of tokens; got {value!r}")
    return value


class BertTokenizer:
    """Encode texts and text pairs into the tensors a BERT takes (``model(**tokenizer(texts))``).

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` holding the WordPiece pipeline; its padding and truncation
            settings are cleared (they are chosen per call).
        model_max_length: the longest input the model takes; the default ``max_length`` for truncation.
        special_tokens: ``unk_token``, ``sep_token``, ``pad_token``, ``cls_token``, ``mask_token``.
        model_input_names: what a call returns (RoBERTa's and DistilBERT's tokenizers return no
            ``token_type_ids``).

    Attributes:
        pad_token_id, cls_token_id, sep_token_id, unk_token_id, mask_token_id: ids of the special tokens.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        model_max_length: int = 512,
        special_tokens: Mapping[str, str] | None = None,
        model_input_names: Sequence[str] = ("input_ids", "token_type_ids", "attention_mask"),
    ) -> None:
        self.backend = tokenizer
        self.backend.no_padding()
        self.backend.no_truncation()
        self.model_max_length = _token_count("model_max_length", model_max_length)
        self.model_input_names = tuple(model_input_names)
        self.special_tokens = {**DEFAULT_SPECIAL_TOKENS, **(special_tokens or {})}
        ids = {}
        for key, token in self.special_tokens.items():
            token_id = tokenizer.token_to_id(token)
            if token_id is None:
                raise TokenizerFileError(f"special token {key}={token!r} is not in the vocabulary")
            ids[key] = token_id
        self.unk_token_id = ids["unk_token"]
        self.sep_token_id = ids["sep_token"]
        self.pad_token_id = ids["pad_token"]
        self.cls_token_id = ids["cls_token"]
        self.mask_token_id = ids["mask_token"]

    # ----------------------------------------------------------------------------------------- loading
    @classmethod
    def from_pretrained(
        cls,
        path_or_id: str | Path,
        *,
        revision: str | None = None,
        cache_dir: str | Path | None = None,
        local_files_only: bool = False,
        token: str | bool | None = None,
        do_lower_case: bool | None = None,
        family: str | None = None,
    ) -> BertTokenizer:
        """Load from a directory or hub repository with ``tokenizer.json``, or ``vocab.txt`` (+ configs).

        Args:
            path_or_id: a directory, or a hub id resolved as :func:`bertblocks.hf.hub.resolve_pretrained` does.
            revision: hub branch, tag or commit.
            cache_dir: hub cache directory.
            local_files_only: use the hub cache only (``HF_HUB_OFFLINE=1`` does the same).
            token: hub token for private repositories.
            do_lower_case: overrides ``tokenizer_config.json`` when building from ``vocab.txt`` (default:
                the config's value, else ``True``). Ignored for a ``tokenizer.json``, which fixes it.
            family: the model family (``roberta``, …) whose special tokens, pair template and returned inputs
                apply; default: the ``model_type`` of a ``config.json`` beside the tokenizer, else the family
                whose tokenizer class ``tokenizer_config.json`` names, else BERT.

        Raises:
            TokenizerFilesNotFoundError: the directory has neither ``tokenizer.json`` nor ``vocab.txt``.
            FileNotFoundError: ``path_or_id`` is neither a directory nor a hub repository that can be found.
        """
        directory = resolve_tokenizer_files(
            path_or_id, revision=revision, cache_dir=cache_dir, local_files_only=local_files_only, token=token
        )
        with reading(directory):  # every file of one generation of the folder (no save swaps it meanwhile)
            return cls._from_files(directory, do_lower_case, family)

    @classmethod
    def _from_files(cls, directory: Path, do_lower_case: bool | None, family: str | None) -> BertTokenizer:
        """:meth:`from_pretrained` once the folder is found: read its files (and nothing else: no writes)."""
        config = _read_json(directory / TOKENIZER_CONFIG)
        convention = tokenizer_convention(family, _read_json(directory / "config.json"), config)
        special = dict(convention.special_tokens)
        special.update({k: _token_text(v) for k, v in _read_json(directory / SPECIAL_TOKENS_MAP).items()})
        special.update({k: _token_text(config[k]) for k in DEFAULT_SPECIAL_TOKENS if config.get(k) is not None})
        special = {k: v for k, v in special.items() if k in DEFAULT_SPECIAL_TOKENS}
        max_length = config.get("model_max_length") or 512
        if not isinstance(max_length, int) or max_length >= _NO_LIMIT:
            max_length = 512
        if isinstance(max_length, bool) or max_length < 1:  # a negative length would fail in the backend, unnamed
            raise InputError(
                f"{directory / TOKENIZER_CONFIG}: model_max_length is {max_length!r}; it must be a positive number "
                "of tokens (fix the file, or remove the field for the default 512)"
            )
        if (directory / TOKENIZER_JSON).is_file():
            try:  # read by the bounded reader (size, UTF-8, NUL bytes); parsed by the tokenizers library
                backend = Tokenizer.from_str(read_text(directory / TOKENIZER_JSON))
            except ReadError as e:
                raise TokenizerFileError(str(e)) from None
            except Exception as e:  # the tokenizers library raises a bare Exception for a malformed file
                raise TokenizerFileError(f"{directory / TOKENIZER_JSON} is not a valid tokenizer file ({e})") from None
            if backend.post_processor is None:  # the framing is the tokenizer class's: the family's template
                backend.post_processor = family_template(backend, convention, special)
        elif (directory / VOCAB_TXT).is_file() and convention.from_vocab is not None:
            # the family's own split (ESM: one token per residue), not BERT's lower-cased WordPiece
            vocab = read_vocab(directory / VOCAB_TXT)
            missing = [token for token in special.values() if token not in vocab]
            if missing:
                raise TokenizerFileError(f"special tokens {missing} are not in {directory / VOCAB_TXT}")
            backend = convention.from_vocab(vocab, special)
            backend.post_processor = family_template(backend, convention, special)
        elif (directory / VOCAB_TXT).is_file():
            lower = config.get("do_lower_case", True) if do_lower_case is None else do_lower_case
            backend = build_wordpiece(
                read_vocab(directory / VOCAB_TXT),
                lowercase=bool(lower),
                strip_accents=config.get("strip_accents"),
                handle_chinese_chars=bool(config.get("tokenize_chinese_chars", True)),
                special_tokens={**DEFAULT_SPECIAL_TOKENS, **special},
            )
        else:
            present = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
            raise TokenizerFilesNotFoundError(
                f"no tokenizer in {directory}: expected {TOKENIZER_JSON} or {VOCAB_TXT} "
                f"(found: {', '.join(present) or 'nothing'})"
            )
        return cls(
            backend,
            model_max_length=max_length,
            special_tokens=special,
            model_input_names=convention.model_input_names,
        )

    @classmethod
    def from_vocab(
        cls,
        vocab: str | Path | Sequence[str],
        *,
        lowercase: bool = True,
        strip_accents: bool | None = None,
        handle_chinese_chars: bool = True,
        model_max_length: int = 512,
    ) -> BertTokenizer:
        """Build the WordPiece tokenizer from a ``vocab.txt`` file or a list of tokens (line i = id i)."""
        tokens = read_vocab(Path(vocab)) if isinstance(vocab, str | Path) else dict(_enumerate(vocab))
        backend = build_wordpiece(
            tokens, lowercase=lowercase, strip_accents=strip_accents, handle_chinese_chars=handle_chinese_chars
        )
        return cls(backend, model_max_length=model_max_length)

    # ------------------------------------------------------------------------------------------ saving
    def save_pretrained(self, save_directory: str | Path, **kwargs: Any) -> list[Path]:
        """Write ``tokenizer.json``, ``vocab.txt``, ``tokenizer_config.json`` and ``special_tokens_map.json``: what
        :meth:`from_pretrained` and transformers' ``AutoTokenizer`` read (what Trainer's ``save_model`` calls).

        The four replace those the folder held as one (:func:`bertblocks.atomic.replace_files`): a kill leaves
        the old tokenizer or the new one; other files (a checkpoint) stay. Returns the files written.
        """
        vocab = sorted(self.backend.get_vocab().items(), key=lambda item: item[1])
        normalizer = parse_json(self.backend.to_str(), "the tokenizer's JSON").get("normalizer") or {}
        config = {
            "tokenizer_class": "BertTokenizer",
            "model_max_length": self.model_max_length,
            "do_lower_case": bool(normalizer.get("lowercase", False)),
            **self.special_tokens,
        }
        texts = {
            TOKENIZER_JSON: self.backend.to_str(pretty=True),
            VOCAB_TXT: "".join(f"{token}\n" for token, _ in vocab),
            TOKENIZER_CONFIG: json.dumps(config, indent=2, sort_keys=True) + "\n",
            SPECIAL_TOKENS_MAP: json.dumps(self.special_tokens, indent=2, sort_keys=True) + "\n",
        }
        files: dict[str, Writer] = {name: _text_writer(text) for name, text in texts.items()}
        return replace_files(Path(save_directory), files, commit=TOKENIZER_JSON)

    # ---------------------------------------------------------------------------------------- encoding
    def __call__(
        self,
        text: str | Sequence[str],
        text_pair: str | Sequence[str] | None = None,
        *,
        padding: Padding = True,
        truncation: Truncation = True,
        max_length: int | None = None,
        return_tensors: Literal["pt"] | None = "pt",
        add_special_tokens: bool = True,
    ) -> dict[str, Any]:
        """Encode one text, a batch of texts, or pairs (``text[i]`` with ``text_pair[i]``).

        Args:
            text: a string or a list of strings.
            text_pair: the second segment(s), matching ``text`` (token type 1).
            padding: ``True``/``"longest"`` pads to the longest in the batch; ``"max_length"`` pads to
                ``max_length`` (default: ``model_max_length``); ``False``/``"do_not_pad"`` leaves lengths as
                they are (then a batch of unequal lengths cannot become one tensor).
            truncation: ``True``/``"longest_first"`` shortens the longer segment first to fit ``max_length``
                (default: ``model_max_length``); ``"only_first"``/``"only_second"`` cut that segment only;
                ``False`` keeps everything.
            max_length: the length for padding to ``"max_length"`` and for truncation (special tokens
                included).
            return_tensors: ``"pt"`` for ``torch.long`` tensors of shape ``[batch, length]`` (a single text
                gives a batch of one); ``None`` for lists (a single text gives flat lists).
            add_special_tokens: add ``[CLS]``/``[SEP]``.

        Returns:
            ``input_ids``, ``token_type_ids`` and ``attention_mask``: what ``model(**batch)`` takes.

        Raises:
            ValueError: unknown padding/truncation/return_tensors values, pairs that do not match the texts,
                or unequal lengths without padding when tensors are asked for.
        """
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        if not all(isinstance(t, str) for t in texts):
            raise InputError("text must be a string or a list of strings")
        pairs: list[str] | None = None
        if text_pair is not None:
            pairs = [text_pair] if isinstance(text_pair, str) else list(text_pair)
            if isinstance(text_pair, str) != single or len(pairs) != len(texts):
                raise InputError(f"text_pair must match text: {len(texts)} text(s) but {len(pairs)} pair(s)")
        if return_tensors not in ("pt", None):
            raise InputError(f"return_tensors must be 'pt' or None, got {return_tensors!r}")
        limit = self.model_max_length if max_length is None else _token_count("max_length", max_length)
        encodings = self._encode(texts, pairs, padding, truncation, limit, add_special_tokens)
        out = {
            "input_ids": [e.ids for e in encodings],
            "token_type_ids": [e.type_ids for e in encodings],
            "attention_mask": [e.attention_mask for e in encodings],
        }
        out = {key: value for key, value in out.items() if key in self.model_input_names}
        if return_tensors == "pt":
            lengths = {len(ids) for ids in out["input_ids"]}
            if len(lengths) > 1:
                raise InputError(
                    f"texts encode to different lengths {sorted(lengths)}; pass padding=True to make one tensor"
                )
            return {key: torch.tensor(value, dtype=torch.long) for key, value in out.items()}
        return {key: value[0] for key, value in out.items()} if single else out

    def _encode(
        self,
        texts: list[str],
        pairs: list[str] | None,
        padding: Padding,
        truncation: Truncation,
        max_length: int,
        add_special_tokens: bool,
    ) -> list[Encoding]:
        backend = self.backend
        strategy = {True: "longest_first", False: None, "do_not_truncate": None}.get(truncation, truncation)  # type: ignore[call-overload]
        if strategy not in (None, "longest_first", "only_first", "only_second"):
            raise InputError(
                f"truncation must be True, False, 'longest_first', 'only_first' or 'only_second', got {truncation!r}"
            )
        pad = {True: "longest", False: None, "do_not_pad": None}.get(padding, padding)  # type: ignore[call-overload]
        if pad not in (None, "longest", "max_length"):
            raise InputError(f"padding must be True, False, 'longest' or 'max_length', got {padding!r}")
        # The backend's settings are set for this call and cleared after, so nothing leaks between calls.
        try:
            if strategy is not None:
                backend.enable_truncation(max_length, strategy=strategy)
            if pad is not None:
                backend.enable_padding(
                    pad_id=self.pad_token_id,
                    pad_type_id=0,
                    pad_token=self.special_tokens["pad_token"],
                    length=max_length if pad == "max_length" else None,
                )
            inputs: list[Any] = texts if pairs is None else list(zip(texts, pairs, strict=True))
            try:
                return backend.encode_batch(inputs, add_special_tokens=add_special_tokens)
            except Exception as e:  # tokenizers raises a bare Exception for impossible truncation
                if "truncat" not in str(e).lower():
                    raise
                raise InputError(
                    f"cannot truncate to max_length={max_length} with truncation={truncation!r}: {e}"
                ) from None
        finally:
            backend.no_padding()
            backend.no_truncation()

    def tokenize(self, text: str) -> list[str]:
        """The WordPiece tokens of ``text``, without special tokens."""
        return self.backend.encode(text, add_special_tokens=False).tokens

    # ---------------------------------------------------------------------------------------- decoding
    def decode(self, ids: Iterable[int] | torch.Tensor, skip_special_tokens: bool = False) -> str:
        """Text from token ids (``##`` pieces joined); ``skip_special_tokens`` drops ``[CLS]``, ``[PAD]``, …"""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def batch_decode(
        self, batch: Iterable[Iterable[int]] | torch.Tensor, skip_special_tokens: bool = False
    ) -> list[str]:
        """:meth:`decode` for each row of a batch (a ``[batch, length]`` tensor or a list of id lists)."""
        if isinstance(batch, torch.Tensor):
            batch = batch.tolist()
        return self.backend.decode_batch([list(ids) for ids in batch], skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        """Number of tokens in the vocabulary."""
        return self.backend.get_vocab_size()

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"BertTokenizer(vocab_size={self.vocab_size}, model_max_length={self.model_max_length})"


def build_wordpiece(
    vocab: Mapping[str, int],
    *,
    lowercase: bool = True,
    strip_accents: bool | None = None,
    handle_chinese_chars: bool = True,
    special_tokens: Mapping[str, str] = DEFAULT_SPECIAL_TOKENS,
) -> Tokenizer:
    """The BERT WordPiece pipeline over ``vocab``, as transformers builds it from ``vocab.txt``.

    ``strip_accents=None`` follows ``lowercase`` (BERT's uncased models strip accents, cased ones keep them).

    Raises:
        ValueError: a special token is missing from the vocabulary.
    """
    missing = [t for t in special_tokens.values() if t not in vocab]
    if missing:
        raise TokenizerFileError(f"special tokens {missing} are not in the vocabulary")
    unk, cls, sep = special_tokens["unk_token"], special_tokens["cls_token"], special_tokens["sep_token"]
    tokenizer = Tokenizer(models.WordPiece(dict(vocab), unk_token=unk, max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=handle_chinese_chars, strip_accents=strip_accents, lowercase=lowercase
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])],
    )
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    # Special tokens written in a text ("[MASK]") stay whole instead of being split as punctuation.
    tokenizer.add_special_tokens(list(dict.fromkeys(special_tokens.values())))
    return tokenizer


def read_vocab(path: Path) -> dict[str, int]:
    """``vocab.txt``: one token per line, the line number is the id (as transformers reads it).

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line that is not UTF-8, naming the file, the line and the byte.
    """
    if not path.is_file():
        raise TokenizerFilesNotFoundError(f"vocabulary file not found: {path}")
    try:
        lines = read_lines(path)
    except ReadError as e:
        raise TokenizerFileError(str(e)) from None
    return dict(_enumerate(line for _, line in lines))


def _enumerate(tokens: Iterable[str]) -> Iterable[tuple[str, int]]:
    # a token listed twice keeps its last id, as transformers' load_vocab does
    return ((token, i) for i, token in enumerate(tokens))


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = read_json(path)
    except ReadError as e:
        raise TokenizerFileError(str(e)) from None
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str:
    # special_tokens_map.json may hold {"content": "[CLS]", ...} (an AddedToken) instead of a plain string
    return str(value["content"]) if isinstance(value, Mapping) else str(value)


def _text_writer(text: str) -> Writer:
    return lambda f: f.write(text.encode("utf-8"))


__all__ = ["BertTokenizer", "TokenizerFilesNotFoundError", "build_wordpiece", "read_vocab"]


def tokenizer_convention(
    family: str | None, model_config: Mapping[str, Any], tokenizer_config: Mapping[str, Any]
) -> TokenizerConvention:
    """The family convention a tokenizer follows: ``family`` if given, else ``config.json``'s ``model_type``,
    else the family whose tokenizer class ``tokenizer_config.json`` names, else BERT's."""
    from .families import get_family, known_families

    if family is None and isinstance(model_config.get("model_type"), str):
        family = model_config["model_type"]
    if family is not None:
        return get_family(family, source=None).tokenizer
    tokenizer_class = tokenizer_config.get("tokenizer_class")
    for candidate in known_families():
        if tokenizer_class in candidate.tokenizer.tokenizer_classes:
            return candidate.tokenizer
    return BERT_TOKENIZER


def family_template(
    backend: Tokenizer, convention: TokenizerConvention, special: Mapping[str, str]
) -> processors.TemplateProcessing:
    """The family's single/pair templates as a ``tokenizers`` post-processor (for a ``tokenizer.json`` without one)."""
    names = {"cls_token", "sep_token"}
    tokens = [(special[name], backend.token_to_id(special[name])) for name in sorted(names)]
    missing = [text for text, token_id in tokens if token_id is None]
    if missing:
        raise TokenizerFileError(f"special tokens {missing} of the tokenizer's family are not in its vocabulary")
    return processors.TemplateProcessing(
        single=_with_specials(convention.single, convention.special_tokens, special),
        pair=_with_specials(convention.pair, convention.special_tokens, special),
        special_tokens=tokens,
    )


def _with_specials(template: str, defaults: Mapping[str, str], special: Mapping[str, str]) -> str:
    """A convention's template with the configured texts of the special tokens it names."""
    out = []
    for piece in template.split():
        text, _, type_id = piece.partition(":")
        for name, default in defaults.items():
            if text == default:
                text = special.get(name, text)
        out.append(f"{text}:{type_id}" if type_id else text)
    return " ".join(out)
