"""An encoder feeding a decoder with cross-attention (BERT2BERT, RoBERTa2RoBERTa, …), built from one config.

Module names and the checkpoint layout are those of transformers' ``EncoderDecoderModel``: ``encoder.*`` (a bare
backbone), ``decoder.*`` (a causal-LM task model), ``enc_to_dec_proj`` when the widths differ, and a
``config.json`` with ``model_type: encoder-decoder`` holding both configs. Each side goes through its own family
(``config.family``): its key map (``decoder.roberta.*``, ``decoder.lm_head.*`` for RoBERTa; ``decoder.bert.*``,
``decoder.cls.*`` for BERT), its causal-LM head and its class names (``RobertaModel``, ``RobertaForCausalLM``), so
checkpoints move between the two unchanged.

Example config (YAML)::

    encoder: {vocab_size: 99, hidden_size: 32, encoder: {num_layers: 2, attention: {num_heads: 4}}}
    decoder: {vocab_size: 99, hidden_size: 32, encoder: {num_layers: 2, attention: {num_heads: 4}}}
    decoder_start_token_id: 101
    pad_token_id: 0
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from ..config import BertConfig
from ..config.flat_view import FlatConfigView
from ..config_files import apply_overrides, load_config
from ..core.encoder import EncoderModel
from ..core.outputs import ModelOutput
from ..errors import InputError, MissingFileError, UnsupportedError
from ..families.keymap import BACKBONE_PREFIX, KeyMap
from ..hf.config_json import config_to_hf
from ..hf.families import get_family
from ..readers import read_json, read_yaml
from ..registry import Registry, get_registry, validate_config
from .backbone import BertModel
from .generation import generate
from .pretrained import PretrainedModel, map_checkpoint_keys
from .surface import PretrainedSurface
from .task_models import BertTaskModel, task_model_class


class EncoderDecoderConfig(FlatConfigView, BaseModel):
    """Two BERT configs and the tokens that start and pad decoder inputs.

    The decoder is always built with ``is_decoder: true`` and ``add_cross_attention: true``. ``to_dict()``,
    ``get()`` and ``model_type`` read as transformers' ``EncoderDecoderConfig``.
    """

    # protected_namespaces=(): pydantic before 2.10 warns that the class attribute `model_type` (transformers'
    # name) shadows its `model_` namespace, although a ClassVar is no field
    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())
    model_type: ClassVar[str] = "encoder-decoder"
    flat_aliases: ClassVar[dict[str, str]] = {}
    is_encoder_decoder: ClassVar[bool] = True

    encoder: dict[str, Any] = Field(description="the encoder's config (ours or HF's config.json form)")
    decoder: dict[str, Any] = Field(description="the decoder's config (ours or HF's config.json form)")
    decoder_start_token_id: int = Field(description="first decoder input token (e.g. [CLS])")
    pad_token_id: int = Field(0, description="replaces -100 in labels shifted into decoder inputs")

    def to_dict(self) -> dict[str, Any]:
        """transformers' ``EncoderDecoderModel`` ``config.json``: both configs in HF's flat form, each written by
        its family (``RobertaModel`` + ``RobertaForCausalLM`` for RoBERTa)."""
        encoder = config_to_hf(load_config(self.encoder).model_copy(update={"head": None}))
        decoder = config_to_hf(decoder_config(self.decoder))
        return {
            "model_type": "encoder-decoder",
            "architectures": ["EncoderDecoderModel"],
            "is_encoder_decoder": True,
            "encoder": encoder,
            "decoder": decoder,
            "decoder_start_token_id": self.decoder_start_token_id,
            "pad_token_id": self.pad_token_id,
            "tie_encoder_decoder": False,
        }


@dataclass
class Seq2SeqLMOutput(ModelOutput):
    """transformers' ``Seq2SeqLMOutput`` fields, in its order."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    past_key_values: Any = None
    decoder_hidden_states: tuple[torch.Tensor, ...] | None = None
    decoder_attentions: tuple[torch.Tensor, ...] | None = None
    cross_attentions: tuple[torch.Tensor, ...] | None = None
    encoder_last_hidden_state: torch.Tensor | None = None
    encoder_hidden_states: tuple[torch.Tensor, ...] | None = None
    encoder_attentions: tuple[torch.Tensor, ...] | None = None


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Decoder inputs from labels: start token first, labels shifted right, ``-100`` replaced by padding."""
    shifted = labels.new_zeros(labels.shape)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


def causal_lm_head(family: str, registry: Registry | None = None) -> dict[str, Any]:
    """The head spec of ``family``'s causal-LM class, the class whose head is a causal LM (``causal_lm…``):
    ``RobertaForCausalLM`` → ``causal_lm_gelu``, ``BertGenerationDecoder`` → ``causal_lm_linear``; BERT's
    ``causal_lm`` for a family that has none."""
    known = get_family(family, registry, source=None)
    for architecture in known.architectures:
        spec = known.head_for(architecture)
        if spec is not None and str(spec["name"]).startswith("causal_lm"):
            return spec
    return {"name": "causal_lm"}


def decoder_config(
    decoder: Mapping[str, Any], overrides: Sequence[str] | Mapping[str, Any] = (), registry: Registry | None = None
) -> BertConfig:
    """The decoder side's config: ``is_decoder`` and ``add_cross_attention`` on, and a causal-LM head (its
    family's, unless the config already names a causal-LM head)."""
    reg = registry or get_registry()
    cfg = load_config({**decoder, "is_decoder": True, "add_cross_attention": True}, overrides, registry=reg)
    if cfg.head is not None and cfg.head.name.startswith("causal_lm"):
        return cfg
    return validate_config({**cfg.model_dump(), "head": causal_lm_head(cfg.family, reg)}, reg)


@dataclass(frozen=True)
class _SidesKeyMap:
    """The encoder-decoder's key map: ``encoder.*`` through the encoder's map, ``decoder.*`` through the
    decoder's (each its family's), anything else (``enc_to_dec_proj``) as is."""

    sides: Mapping[str, PretrainedModel]

    def to_model(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for side, part in self._split(state).items():
            if side is None:
                out.update(part)
                continue
            model = self.sides[side]
            prefix, model_has_prefix = model.checkpoint_prefix()
            mapped = map_checkpoint_keys(
                part, model.checkpoint_key_map(), prefix=prefix, model_has_prefix=model_has_prefix
            )
            out.update({side + key: tensor for key, tensor in mapped.items()})
        return out

    def to_checkpoint(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for side, part in self._split(state).items():
            if side is None:
                out.update(part)
                continue
            stored = self.sides[side].checkpoint_key_map().to_checkpoint(part)
            out.update({side + key: tensor for key, tensor in stored.items()})
        return out

    def _split(self, state: Mapping[str, torch.Tensor]) -> dict[str | None, dict[str, torch.Tensor]]:
        parts: dict[str | None, dict[str, torch.Tensor]] = {}
        for key, tensor in state.items():
            side = next((s for s in self.sides if key.startswith(s)), None)
            parts.setdefault(side, {})[key[len(side) :] if side else key] = tensor
        return parts


class BertEncoderDecoder(PretrainedSurface, PretrainedModel):
    """An encoder-decoder: ``encoder`` (a :class:`BertModel`) and ``decoder`` (a causal-LM task model:
    :class:`~bertblocks.models.task_models.BertLMHeadModel` for BERT, the family's causal-LM head otherwise)."""

    #: its config is the pair's, not a BERT config: ``from_pretrained`` takes no config fields as keywords
    takes_config_keywords = False

    def __init__(self, config: EncoderDecoderConfig, encoder: BertModel, decoder: BertTaskModel) -> None:
        super().__init__()
        self.config = config
        self.encoder = encoder
        self.decoder = decoder
        enc_width, dec_width = encoder.config.hidden_size, decoder.config.hidden_size
        if enc_width != dec_width:
            self.enc_to_dec_proj = nn.Linear(enc_width, dec_width)  # HF's name and rule
            nn.init.normal_(self.enc_to_dec_proj.weight, std=decoder.config.initializer_range)
            nn.init.zeros_(self.enc_to_dec_proj.bias)
        self.projects = enc_width != dec_width

    # ------------------------------------------------------------------------------------------- building
    @classmethod
    def _from_config(
        cls,
        config: EncoderDecoderConfig | Mapping[str, Any] | str | Path,
        overrides: Sequence[str] | Mapping[str, Any] = (),
        *,
        registry: Registry | None = None,
    ) -> BertEncoderDecoder:
        """Build with fresh weights from one config (a mapping, a YAML/JSON file, a checkpoint directory, or an
        EncoderDecoderConfig).

        Args:
            config: the config.
            overrides: dotted overrides; ``encoder.…`` and ``decoder.…`` go to that side's config
                (``decoder.encoder.num_layers=2``), other keys (``pad_token_id=1``) to the top level.
            registry: where components are looked up.
        """
        sides, top = _split_overrides(overrides)
        cfg = _read_config(config, top)
        encoder_cfg = load_config(cfg.encoder, sides["encoder"], registry=registry)
        decoder_cfg = decoder_config(cfg.decoder, sides["decoder"], registry)
        encoder = BertModel._from_config(encoder_cfg, registry=registry)
        assert decoder_cfg.head is not None  # decoder_config always sets a causal-LM head
        decoder = task_model_class(decoder_cfg.head.name)._from_config(decoder_cfg, registry=registry)
        return cls(cfg, encoder, decoder)

    # ---------------------------------------------------------------------------------------- checkpoints
    # Loading and saving: PretrainedModel.from_pretrained / load_checkpoint / save_pretrained (hub ids, the meta
    # device and the same report as every other model class). Checkpoints of transformers' EncoderDecoderModel
    # load unchanged, each side through its family's key map; what save_pretrained writes loads there unchanged.
    @classmethod
    def backend_overrides(
        cls, overrides: Sequence[str] | Mapping[str, Any], attn_implementation: str | None
    ) -> Sequence[str] | Mapping[str, Any]:
        """``attn_implementation`` sets the backend of both sides."""
        if attn_implementation is None:
            return overrides
        both = {f"{side}.encoder.attention.backend": attn_implementation for side in ("encoder", "decoder")}
        if isinstance(overrides, Mapping):
            return {**overrides, **both}
        return [*overrides, *(f"{key}={value}" for key, value in both.items())]

    def checkpoint_backbones(self) -> dict[str, EncoderModel]:
        # the model's own keys (after the key map): bertblocks keeps a task model's backbone under `bert.`
        return {"encoder.": self.encoder, f"decoder.{BACKBONE_PREFIX}.": self.decoder.bert}

    def checkpoint_key_map(self) -> KeyMap:
        """Each side's family key map under its prefix (``encoder.``, ``decoder.``)."""
        return _SidesKeyMap({"encoder.": self.encoder, "decoder.": self.decoder})

    def checkpoint_config(self) -> dict[str, Any]:
        """What transformers' ``EncoderDecoderModel.from_pretrained`` reads: each side's ``config.json`` as its
        family writes it (``RobertaModel`` + ``RobertaForCausalLM``, ``BertModel`` + ``BertLMHeadModel``)."""
        return {
            "model_type": "encoder-decoder",
            "architectures": ["EncoderDecoderModel"],
            "is_encoder_decoder": True,
            "encoder": self.encoder.checkpoint_config(),
            "decoder": self.decoder.checkpoint_config(),
            "decoder_start_token_id": self.config.decoder_start_token_id,
            "pad_token_id": self.config.pad_token_id,
            "tie_encoder_decoder": False,
        }

    def get_input_embeddings(self) -> nn.Embedding:
        """The encoder's token embeddings (transformers' ``EncoderDecoderModel`` answers the same)."""
        return self.encoder.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Module | None:
        """The decoder's LM decoder."""
        return self.decoder.get_output_embeddings()

    def tie_weights(self) -> None:
        self.decoder.tie_weights()

    def resize_token_embeddings(self, *args: Any, **kwargs: Any) -> nn.Embedding:
        """Not supported on the pair, as in transformers: resize ``model.encoder`` and ``model.decoder``.

        Raises:
            NotImplementedError: always.
        """
        raise UnsupportedError(
            "resizing the embeddings of an encoder-decoder model directly is not supported (as in transformers): "
            "call resize_token_embeddings on model.encoder and model.decoder"
        )

    def initializer_std(self) -> float:
        # the decoder's, as transformers initialises enc_to_dec_proj (the only module outside both sides)
        return self.decoder.config.initializer_range

    # ------------------------------------------------------------------------------------------- forward
    def encode(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
    ) -> tuple[torch.Tensor, Any]:
        """Run the encoder; returns the states the decoder attends to (projected if widths differ)."""
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        states = out.last_hidden_state
        return (self.enc_to_dec_proj(states) if self.projects else states), out

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        past_key_values: Any = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
    ) -> Seq2SeqLMOutput:
        """transformers' ``EncoderDecoderModel.forward``: with ``labels`` and no decoder inputs, the decoder reads
        the labels shifted right; the loss is cross-entropy of the logits against the labels (no further shift).
        """
        if input_ids is None:
            raise InputError("input_ids (the encoder's input) are required")
        shared = {"output_attentions": output_attentions, "output_hidden_states": output_hidden_states}
        states, encoded = self.encode(input_ids, attention_mask, **shared)
        if labels is not None and decoder_input_ids is None:
            decoder_input_ids = shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)
            if decoder_attention_mask is None:
                decoder_attention_mask = (decoder_input_ids != self.config.pad_token_id).long()
        if decoder_input_ids is None:
            raise InputError("give decoder_input_ids, or labels to derive them from")
        decoded = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=states,
            encoder_attention_mask=attention_mask,
            past_key_values=past_key_values,
            use_cache=use_cache,
            **shared,
        )
        loss = None
        if labels is not None:
            logits = decoded.logits
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        return Seq2SeqLMOutput(
            loss=loss,
            logits=decoded.logits,
            past_key_values=decoded.past_key_values,
            decoder_hidden_states=decoded.hidden_states,
            decoder_attentions=decoded.attentions,
            cross_attentions=decoded.cross_attentions,
            encoder_last_hidden_state=encoded.last_hidden_state,
            encoder_hidden_states=encoded.hidden_states,
            encoder_attentions=encoded.attentions,
        )

    @torch.no_grad()
    def generate(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
    ) -> torch.Tensor:
        """Encode once, then decode from ``decoder_start_token_id`` with the cache (cross K/V computed once).

        Keyword arguments are those of :func:`bertblocks.models.generation.generate`. Returns ``[b, 1 + n]``.
        """
        states, _ = self.encode(input_ids, attention_mask)
        start = torch.full((input_ids.shape[0], 1), self.config.decoder_start_token_id, device=input_ids.device)
        kwargs.setdefault("pad_token_id", self.config.pad_token_id)
        return generate(
            self.decoder, start, encoder_hidden_states=states, encoder_attention_mask=attention_mask, **kwargs
        )


def _split_overrides(
    overrides: Sequence[str] | Mapping[str, Any],
) -> tuple[dict[str, list[str] | dict[str, Any]], list[str] | dict[str, Any]]:
    """Dotted overrides → those of each side (``encoder.x`` → ``x`` for the encoder) and the top-level rest,
    each in the form given (``key=value`` text, parsed later as YAML, or a mapping)."""
    if isinstance(overrides, Mapping):
        mapped: dict[str, dict[str, Any]] = {"encoder": {}, "decoder": {}, "": {}}
        for key, value in overrides.items():
            side, dot, rest = key.partition(".")
            if dot and side in ("encoder", "decoder"):
                mapped[side][rest] = value
            else:
                mapped[""][key] = value
        return {"encoder": mapped["encoder"], "decoder": mapped["decoder"]}, mapped[""]
    texts: dict[str, list[str]] = {"encoder": [], "decoder": [], "": []}
    for text in overrides:
        side, dot, rest = text.strip().partition(".")
        if dot and side in ("encoder", "decoder") and "=" in rest:
            texts[side].append(rest)
        else:
            texts[""].append(text)
    return {"encoder": texts["encoder"], "decoder": texts["decoder"]}, texts[""]


def _read_config(
    config: EncoderDecoderConfig | Mapping[str, Any] | str | Path,
    overrides: Sequence[str] | Mapping[str, Any] = (),
) -> EncoderDecoderConfig:
    if isinstance(config, EncoderDecoderConfig):
        if not overrides:
            return config
        config = config.model_dump()
    if isinstance(config, str | Path):
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise MissingFileError(f"encoder-decoder config not found: {path}")
        data = read_json(path) if path.suffix == ".json" else read_yaml(path)  # bounded; alias bombs refused
    else:
        data = dict(config)
    if data.get("model_type") == "encoder-decoder":  # transformers' config.json
        data = {
            "encoder": data["encoder"],
            "decoder": data["decoder"],
            "decoder_start_token_id": data.get("decoder_start_token_id"),
            "pad_token_id": data.get("pad_token_id", data["decoder"].get("pad_token_id", 0)),
        }
    if overrides:
        data = apply_overrides(data, overrides)
    return EncoderDecoderConfig.model_validate(data)


__all__ = ["BertConfig", "BertEncoderDecoder", "EncoderDecoderConfig", "Seq2SeqLMOutput", "shift_tokens_right"]
