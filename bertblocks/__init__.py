"""bertblocks: BERT assembled at run time from a validated config, out of plugin components.

Numerically identical to Hugging Face's BERT on the same weights; loads and saves HF checkpoints unchanged.

Example:
    >>> import bertblocks
    >>> model = bertblocks.build_model("examples/configs/bert-mini-relative.yaml")
    >>> model = bertblocks.from_pretrained("path/to/hf-bert-checkpoint")
"""

from __future__ import annotations

from .checkpoint import CheckpointError, LoadingInfo
from .configuration import apply_overrides, dump_yaml, load_config, save_config
from .core.config import BertConfig, ConfigError, ConfigIssue
from .core.outputs import ModelOutput, ModelOutputWithPooling
from .model import BertModel, build_model, from_pretrained
from .registry import (
    BuildError,
    Registry,
    UnknownComponentError,
    get_registry,
    hookimpl,
)

__version__ = "0.1.0"

__all__ = [
    "BertConfig",
    "BertModel",
    "BuildError",
    "CheckpointError",
    "ConfigError",
    "ConfigIssue",
    "LoadingInfo",
    "ModelOutput",
    "ModelOutputWithPooling",
    "Registry",
    "UnknownComponentError",
    "__version__",
    "apply_overrides",
    "build_model",
    "dump_yaml",
    "from_pretrained",
    "get_registry",
    "hookimpl",
    "load_config",
    "save_config",
]
