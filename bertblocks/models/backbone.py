"""The public model class: an assembled backbone that loads and saves HF BERT checkpoints."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..config import BertConfig
from ..config_files import ConfigSource, load_config
from ..core.encoder import EncoderModel
from ..hf.config_json import config_to_hf
from ..hf.families import FamilyKeyMap
from ..registry import Registry, build_components, get_registry
from .pretrained import PretrainedModel
from .surface import PretrainedSurface
from .weight_init import init_weights


class BertModel(PretrainedSurface, EncoderModel, PretrainedModel):
    """A BERT backbone assembled from a config; a drop-in for transformers' ``BertModel``.

    Built by :func:`bertblocks.create_model` (a preset, a config file or dict) or loaded by ``from_pretrained``.

    Example:
        >>> model = BertModel.from_pretrained("path/to/bert")          # HF checkpoint directory
        >>> out = model(input_ids, attention_mask=mask)
        >>> out.last_hidden_state.shape
    """

    #: the registry the model was built from (``None``: the process-wide one); its family is looked up there
    registry: Registry | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._list_extra_inputs(self)  # forward's signature names the family's inputs (the Trainer keeps them)

    # loading and saving: PretrainedModel.from_pretrained / load_checkpoint / save_pretrained (one path for all)

    @classmethod
    def _from_config(
        cls,
        config: ConfigSource,
        overrides: Sequence[str] | Mapping[str, Any] = (),
        *,
        registry: Registry | None = None,
        add_pooling_layer: bool = True,
    ) -> BertModel:
        """Build a randomly initialised model (HF's initialisation) from a config, a file or a dict.

        Private, as transformers' ``PreTrainedModel._from_config``: :func:`bertblocks.create_model` is the way to
        build a model, and ``from_pretrained`` builds through this before loading weights.
        """
        cfg = load_config(config, overrides, registry)
        if not add_pooling_layer and cfg.pooler is not None:
            cfg = cfg.model_copy(update={"pooler": None})
        parts = build_components(cfg, registry or get_registry())
        model = cls(cfg, parts.embeddings, parts.encoder, parts.pooler, parts.position)
        model.registry = registry  # where its family is looked up when it loads and saves checkpoints
        init_weights(model, cfg.initializer_range)
        pruned = {int(k): list(v) for k, v in cfg.pruned_heads.items()}
        if pruned:
            model.prune_heads(pruned)
        return model

    def checkpoint_backbones(self) -> dict[str, EncoderModel]:
        return {"": self}

    def checkpoint_prefix(self) -> tuple[str, bool]:
        # a task checkpoint (`bert.encoder…`) loads into a bare backbone with its prefix stripped
        return f"{self.base_model_prefix}.", False

    def checkpoint_config(self) -> dict[str, Any]:
        # A backbone is saved as a backbone, whatever head its config names (a task model's `bert` shares it);
        # its family writes the config.json (RobertaModel's for a RoBERTa, …)
        return config_to_hf(self.config.model_copy(update={"head": None}), self.registry)

    def checkpoint_key_map(self) -> FamilyKeyMap:
        """The model family's key map (``config.family``): RoBERTa's, DistilBERT's, … or BERT's."""
        return FamilyKeyMap(self, self.config.model_copy(update={"head": None}), backbone=True, registry=self.registry)


__all__ = ["BertConfig", "BertModel"]
