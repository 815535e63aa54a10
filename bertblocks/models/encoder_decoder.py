"""A BERT encoder feeding a BERT decoder with cross-attention (BERT2BERT), built from one config.

Module names and the checkpoint layout are those of transformers' ``EncoderDecoderModel`` (``encoder.*``,
``decoder.bert.*``, ``decoder.cls.*``, ``enc_to_dec_proj`` when the widths differ, and a ``config.json`` with
``model_type: encoder-decoder`` holding both configs), so checkpoints move between the two unchanged.

Example config (YAML)::

    encoder: {vocab_size: 99, hidden_size: 32, encoder: {num_layers: 2, attention: {num_heads: 4}}}
    decoder: {vocab_size: 99, hidden_size: 32, encoder: {num_layers: 2, attention: {num_heads: 4}}}
    decoder_start_token_id: 101
    pad_token_id: 0
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from ..config_files import load_config
from ..core.config import BertConfig
from ..core.outputs import ModelOutput
from ..hf.weights import (
    LoadingInfo,
    find_weights,
    match_state_dict,
    normalize_keys,
    read_state_dict,
    untied_state_dict,
    write_checkpoint,
)
from ..registry import Registry
from .backbone import BertModel
from .generation import generate
from .task_models import BertLMHeadModel


class EncoderDecoderConfig(BaseModel):
    """Two BERT configs and the tokens that start and pad decoder inputs.

    The decoder is always built with ``is_decoder: true`` and ``add_cross_attention: true``.
    """

    model_config = ConfigDict(extra="forbid")

    encoder: dict[str, Any] = Field(description="the encoder's config (ours or HF's config.json form)")
    decoder: dict[str, Any] = Field(description="the decoder's config (ours or HF's config.json form)")
    decoder_start_token_id: int = Field(description="first decoder input token (e.g. [CLS])")
    pad_token_id: int = Field(0, description="replaces -100 in labels shifted into decoder inputs")


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


class BertEncoderDecoder(nn.Module):
    """BERT2BERT: ``encoder`` (a :class:`BertModel`) and ``decoder`` (a :class:`BertLMHeadModel`)."""

    def __init__(self, config: EncoderDecoderConfig, encoder: BertModel, decoder: BertLMHeadModel) -> None:
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
    def from_config(
        cls, config: EncoderDecoderConfig | Mapping[str, Any] | str | Path, *, registry: Registry | None = None
    ) -> BertEncoderDecoder:
        """Build with fresh weights from one config (a mapping, a YAML/JSON file, or an EncoderDecoderConfig)."""
        cfg = _read_config(config)
        encoder_cfg = load_config(cfg.encoder, registry=registry)
        decoder_cfg = load_config({**cfg.decoder, "is_decoder": True, "add_cross_attention": True}, registry=registry)
        encoder = BertModel.from_config(encoder_cfg, registry=registry)
        decoder = BertLMHeadModel.from_config(decoder_cfg, registry=registry)
        return cls(cfg, encoder, decoder)

    @classmethod
    def from_pretrained(
        cls, path: str | Path, *, registry: Registry | None = None, output_loading_info: bool = False
    ) -> BertEncoderDecoder | tuple[BertEncoderDecoder, LoadingInfo]:
        """Load a checkpoint saved by transformers' ``EncoderDecoderModel`` (BERT both sides) or by us.

        Raises:
            FileNotFoundError: no config.json or weights.
            CheckpointError: weights that do not fit (shapes, foreign architecture, missing backbone weights).
        """
        directory = Path(path)
        model = cls.from_config(directory / "config.json", registry=registry)
        state = normalize_keys(read_state_dict(find_weights(directory)), "")
        ignorable = [f"encoder.{k}" for k in model.encoder.position_scheme.ignored_checkpoint_keys]
        ignorable += [f"decoder.bert.{k}" for k in model.decoder.bert.position_scheme.ignored_checkpoint_keys]
        loadable, info = match_state_dict(
            model,
            state,
            ignorable=ignorable,
            required_prefixes=(
                "encoder.embeddings.",
                "encoder.encoder.",
                "decoder.bert.embeddings.",
                "decoder.bert.encoder.",
            ),
        )
        model.load_state_dict(loadable, strict=False)
        return (model, info) if output_loading_info else model

    def save_pretrained(self, directory: str | Path, *, safe_serialization: bool = True) -> None:
        """Write what transformers' ``EncoderDecoderModel.from_pretrained`` reads."""
        directory = Path(directory)
        encoder_json = self.encoder.config.model_copy(update={"head": None}).to_hf()
        decoder_json = self.decoder.config.to_hf()
        config_json = {
            "model_type": "encoder-decoder",
            "architectures": ["EncoderDecoderModel"],
            "is_encoder_decoder": True,
            "encoder": encoder_json,
            "decoder": decoder_json,
            "decoder_start_token_id": self.config.decoder_start_token_id,
            "pad_token_id": self.config.pad_token_id,
            "tie_encoder_decoder": False,
        }
        write_checkpoint(directory, untied_state_dict(self), config_json, safe_serialization)

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
            raise ValueError("input_ids (the encoder's input) are required")
        shared = {"output_attentions": output_attentions, "output_hidden_states": output_hidden_states}
        states, encoded = self.encode(input_ids, attention_mask, **shared)
        if labels is not None and decoder_input_ids is None:
            decoder_input_ids = shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)
            if decoder_attention_mask is None:
                decoder_attention_mask = (decoder_input_ids != self.config.pad_token_id).long()
        if decoder_input_ids is None:
            raise ValueError("give decoder_input_ids, or labels to derive them from")
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

        Keyword arguments are those of :func:`bertblocks.generation.generate`. Returns ``[b, 1 + n]``.
        """
        states, _ = self.encode(input_ids, attention_mask)
        start = torch.full((input_ids.shape[0], 1), self.config.decoder_start_token_id, device=input_ids.device)
        kwargs.setdefault("pad_token_id", self.config.pad_token_id)
        return generate(
            self.decoder, start, encoder_hidden_states=states, encoder_attention_mask=attention_mask, **kwargs
        )


def _read_config(config: EncoderDecoderConfig | Mapping[str, Any] | str | Path) -> EncoderDecoderConfig:
    if isinstance(config, EncoderDecoderConfig):
        return config
    if isinstance(config, str | Path):
        path = Path(config)
        if not path.is_file():
            raise FileNotFoundError(f"encoder-decoder config not found: {path}")
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    else:
        data = dict(config)
    if data.get("model_type") == "encoder-decoder":  # transformers' config.json
        data = {
            "encoder": data["encoder"],
            "decoder": data["decoder"],
            "decoder_start_token_id": data.get("decoder_start_token_id"),
            "pad_token_id": data.get("pad_token_id", data["decoder"].get("pad_token_id", 0)),
        }
    return EncoderDecoderConfig.model_validate(data)


__all__ = ["BertConfig", "BertEncoderDecoder", "EncoderDecoderConfig", "Seq2SeqLMOutput", "shift_tokens_right"]
