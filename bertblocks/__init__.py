"""bertblocks: BERT assembled at run time from a validated config, out of plugin components.

Numerically identical to Hugging Face's BERT on the same weights; loads and saves HF checkpoints unchanged.

Example:
    >>> import bertblocks
    >>> model = bertblocks.build_model("examples/configs/bert-mini-relative.yaml")
    >>> model = bertblocks.from_pretrained("path/to/hf-bert-checkpoint")
    >>> bertblocks.list_presets("bert-*-uncased")
    >>> model = bertblocks.create_model("bert-tiny-uncased", overrides={"encoder.attention.backend": "eager"})
"""

from __future__ import annotations

from . import sentence
from .config import BertConfig, ConfigError, ConfigIssue
from .config.limits import LimitError
from .config_files import apply_overrides, dump_yaml, load_config, save_config
from .core.component import Preset
from .core.outputs import ModelOutput, ModelOutputWithPooling
from .errors import BertBlocksError
from .hf.hub import PretrainedNotFoundError, resolve_pretrained
from .hf.tokenizer import BertTokenizer, TokenizerFilesNotFoundError
from .hf.weight_files import WeightFileError
from .hf.weights import CheckpointError, LoadingInfo
from .models.auto import from_pretrained
from .models.backbone import BertModel, build_model
from .models.inference import optimize_for_inference, restore_eager
from .models.quantize import quantize as quantize
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
from .registry import (
    BuildError,
    Registry,
    UnknownComponentError,
    UnknownPresetError,
    get_registry,
    hookimpl,
)
from .zoo import create_model, get_preset, list_presets

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
    "BuildError",
    "CheckpointError",
    "ConfigError",
    "ConfigIssue",
    "LimitError",
    "LoadingInfo",
    "ModelOutput",
    "ModelOutputWithPooling",
    "Preset",
    "PretrainedNotFoundError",
    "Registry",
    "TokenizerFilesNotFoundError",
    "UnknownComponentError",
    "UnknownPresetError",
    "WeightFileError",
    "__version__",
    "apply_overrides",
    "build_model",
    "create_model",
    "dump_yaml",
    "from_pretrained",
    "get_preset",
    "get_registry",
    "hookimpl",
    "list_presets",
    "load_config",
    "optimize_for_inference",
    "resolve_pretrained",
    "restore_eager",
    "save_config",
    "sentence",
]
