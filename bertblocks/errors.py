"""The one base class of every error bertblocks raises on purpose, and the general errors built on it.

Callers (the command line, a service wrapping bertblocks) catch :class:`BertBlocksError` to tell a refused
input — a bad config, an unknown component, a checkpoint that does not match, a tensor of the wrong shape —
from a bug. Each subclass also derives from the built-in exception a Python user would expect
(``ValueError``, ``TypeError``, ``LookupError``, ``FileNotFoundError``), so ``except ValueError`` keeps working.

The guarantee is structural: ``tests/test_errors.py`` walks the package's source and fails on any ``raise``
of a built-in exception class (and on any exception class not derived from :class:`BertBlocksError`), so a
new module cannot slip a plain ``ValueError`` past the command line, whose exit code 4 means "a bug".
Modules with errors of their own (:class:`~bertblocks.config.ConfigError`, ``CheckpointError``, …) use
those; the general classes below are for a bad argument anywhere else.

The "did you mean" hint every message about an unknown name ends with is built here too, once
(:func:`did_you_mean`, :func:`close_matches`): this module is the one every group may import.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

#: how alike (difflib's ratio) a known name must be to an unknown one to be offered as "did you mean"
HINT_CUTOFF = 0.5


class BertBlocksError(Exception):
    """Something bertblocks refused, with a message that says what and where."""


class InputError(BertBlocksError, ValueError):
    """A bad argument or input value: a tensor of the wrong shape, an id outside the vocabulary, a sequence past
    the model's positions, an option out of range."""


class InputTypeError(BertBlocksError, TypeError):
    """An argument of the wrong type, or a plugin hook that returned the wrong kind of object."""


class MissingFileError(BertBlocksError, FileNotFoundError):
    """A file or folder bertblocks was asked to read (or to write into) does not exist."""


class MissingKeyError(BertBlocksError, KeyError):
    """A name that is not there (``output["logits"]`` of an output without logits)."""

    def __str__(self) -> str:
        # KeyError quotes its argument (it is usually the bare key); this one carries a sentence
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


class MissingAttributeError(BertBlocksError, AttributeError):
    """An attribute that is not there (``hasattr`` and ``getattr(…, default)`` still see an AttributeError)."""


class UnsupportedError(BertBlocksError, NotImplementedError):
    """A well-formed request that bertblocks does not implement: said, rather than done some other way."""


def close_matches(name: str, candidates: Iterable[str], n: int = 1, cutoff: float = HINT_CUTOFF) -> list[str]:
    """The (at most ``n``) candidates most like ``name``, best first; empty when none is close enough."""
    return difflib.get_close_matches(name, list(candidates), n=n, cutoff=cutoff)


def did_you_mean(name: str, candidates: Iterable[str], cutoff: float = HINT_CUTOFF) -> str:
    """The suffix ``" (did you mean 'x'?)"`` naming the candidate most like ``name``, or ``""`` when none is
    close: a message about an unknown name appends it as it is."""
    hint = close_matches(name, candidates, n=1, cutoff=cutoff)
    return f" (did you mean {hint[0]!r}?)" if hint else ""


__all__ = [
    "BertBlocksError",
    "InputError",
    "InputTypeError",
    "MissingAttributeError",
    "MissingFileError",
    "MissingKeyError",
    "UnsupportedError",
    "close_matches",
    "did_you_mean",
]
