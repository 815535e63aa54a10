"""The model classes and their one load/save path: backbone, task models, encoder-decoder, generation.

May import :mod:`bertblocks.core`, :mod:`bertblocks.registry`, :mod:`bertblocks.hf` and
:mod:`bertblocks.config_files`.
"""
