"""bertblocks: BERT assembled at run time from a validated config, out of plugin components.

Numerically identical to Hugging Face's BERT on the same weights; loads and saves HF checkpoints unchanged.

The public API is short: :func:`create_model` builds a model (from a preset, a YAML/JSON file, a dict or a
:class:`BertConfig`), :func:`from_pretrained` loads a checkpoint, :func:`load_config` / :func:`save_config` read
and write configs, and every error bertblocks raises on purpose is a :class:`BertBlocksError`. The rest lives in
its module: the registry and plugin hooks in :mod:`bertblocks.registry`, the specific errors beside what raises
them (:class:`bertblocks.config.ConfigError`, …), presets in :mod:`bertblocks.zoo`, sentence embeddings in
:mod:`bertblocks.sentence`.

Example:
    >>> import bertblocks
    >>> model = bertblocks.create_model("examples/configs/bert-mini-relative.yaml")
    >>> model = bertblocks.create_model("bert-tiny-uncased", {"encoder.attention.backend": "eager"})
    >>> model = bertblocks.from_pretrained("path/to/hf-bert-checkpoint")
    >>> bertblocks.list_presets("bert-*-uncased")
"""

from __future__ import annotations

import gc as _gc

# The cyclic garbage collector is paused while the package imports: its full passes over the millions of objects
# torch has already made cost ~0.1 s of the ~0.25 s bertblocks adds to `import torch` (measured interleaved, five
# runs each: 0.246–0.262 s with it, 0.153–0.183 s without). It is restored as it was, whatever happens.
_collecting = _gc.isenabled()
_gc.disable()
try:
    from . import sentence as sentence  # a submodule users reach as bertblocks.sentence
    from .config import BertConfig
    from .config_files import load_config, save_config
    from .errors import BertBlocksError
    from .hf.tokenizer import BertTokenizer
    from .models.auto import from_pretrained
    from .models.backbone import BertModel
    from .models.inference import optimize_for_inference
    from .models.quantize import quantize
    from .models.task_models import (
        BertForMaskedLM,
        BertForMultipleChoice,
        BertForNextSentencePrediction,
        BertForPreTraining,
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertForTokenClassification,
        BertLMHeadModel,
        BertTaskModel,
    )
    from .zoo import create_model, list_presets
finally:
    if _collecting:
        _gc.enable()
    del _collecting

__version__ = "0.1.0"


__all__ = [
    "BertBlocksError",
    "BertConfig",
    "BertForMaskedLM",
    "BertForMultipleChoice",
    "BertForNextSentencePrediction",
    "BertForPreTraining",
    "BertForQuestionAnswering",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertLMHeadModel",
    "BertModel",
    "BertTaskModel",
    "BertTokenizer",
    "__version__",
    "create_model",
    "from_pretrained",
    "list_presets",
    "load_config",
    "optimize_for_inference",
    "quantize",
    "save_config",
]
