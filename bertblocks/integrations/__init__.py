"""Adapters for libraries of the Hugging Face ecosystem that cannot take a bertblocks model as it is.

- :mod:`bertblocks.integrations.trainer`: transformers' ``Trainer`` whose ``save_model`` writes ``config.json``.
- :mod:`bertblocks.integrations.sentence_transformers`: a bertblocks backbone as a ``SentenceTransformer`` module.

Each imports its library when imported itself; ``import bertblocks`` never does.
"""
