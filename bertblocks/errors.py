"""The one base class of every error bertblocks raises on purpose.

Callers (the command line, a service wrapping bertblocks) catch :class:`BertBlocksError` to tell a refused
input — a bad config, an unknown component, a checkpoint that does not match — from a bug. Each subclass also
derives from the built-in exception a Python user would expect (``ValueError``, ``LookupError``,
``FileNotFoundError``), so ``except ValueError`` keeps working.
"""

from __future__ import annotations


class BertBlocksError(Exception):
    """Something bertblocks refused, with a message that says what and where."""


__all__ = ["BertBlocksError"]
