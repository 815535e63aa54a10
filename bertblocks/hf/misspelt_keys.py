"""Misspelt keys in an HF ``config.json``: warned about with the closest known name.

HF's config files legitimately carry keys bertblocks does not model (``transformers_version``, a tokenizer
class, a family's own fields); they are kept in ``hf:`` and written back. transformers itself accepts any
key silently (it becomes an attribute), so an unknown key is not an error here either. But a key that is
*almost* one bertblocks reads (``num_hiden_layers``) is almost certainly a typo that would otherwise leave
the model silently at the default (12 layers): for those, and only those, an
:class:`UnknownConfigKeyWarning` names the key and the closest known one. Turn it into an error with
``warnings.simplefilter("error", UnknownConfigKeyWarning)`` (or ``python -W error::...``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

from ..errors import close_matches, did_you_mean

#: how alike a key must be to a known one to be called a misspelling (difflib ratio)
CUTOFF = 0.85
#: keys transformers' configs carry that are close to a BERT key but are no misspelling of it
LEGITIMATE = frozenset(
    {
        "bos_token_id",
        "eos_token_id",
        "sep_token_id",
        "cls_token_id",
        "decoder_start_token_id",
        "num_hidden_groups",
        "hidden_dropout",
        "attention_dropout",
        "max_length",
        "layer_norm_epsilon",
        "task_type_vocab_size",  # ERNIE's task-type table, carried in `hf:` when use_task_id is off
    }
)


class UnknownConfigKeyWarning(UserWarning):
    """A key of an HF ``config.json`` that bertblocks does not read, and that looks like one it does."""


def misspellings(keys: Iterable[str], known: Iterable[str]) -> list[tuple[str, str]]:
    """``(key, closest known key)`` for each of ``keys`` that is not known but very close to a known one."""
    known = list(known)
    out = []
    for key in keys:
        if not isinstance(key, str) or key in known or key in LEGITIMATE:
            continue
        match = close_matches(key, known, cutoff=CUTOFF)
        if match:
            out.append((key, match[0]))
    return out


def warn_misspelt_keys(keys: Iterable[str], known: Iterable[str], source: str = "config.json") -> None:
    """Warn (:class:`UnknownConfigKeyWarning`) about every likely misspelling among ``keys``."""
    for key, hint in misspellings(keys, known):
        warnings.warn(
            f"{source}: unknown key {key!r}{did_you_mean(key, [hint])}; it is kept in `hf:` but not used, so "
            f"{hint} keeps its value",
            UnknownConfigKeyWarning,
            stacklevel=4,
        )
