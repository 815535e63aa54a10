"""Hugging Face interop: ``config.json`` translation, weight files, hub resolution, the tokenizer.

May import :mod:`bertblocks.core` and :mod:`bertblocks.registry`; nothing below it imports this package.
"""
