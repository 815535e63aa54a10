"""Nomic's original ``config.json`` (the remote-code ``NomicBertConfig``, a GPT-2 config with Nomic's switches) →
the fields of transformers' ``NomicBertConfig``.

The published checkpoints (``nomic-ai/nomic-embed-text-v1.5`` …) carry this format; transformers' own config class
does not read it (it would build a default-sized model). Their weights are already in the names transformers'
``save_pretrained`` writes (``emb_ln``, ``encoder.layers.{i}.attn.Wqkv``, ``mlp.fc11``/``fc12``/``fc2``, …), so only
the config needs translating. Switches that change the numbers are accepted only at the values transformers'
class implements (post-norm, no projection biases, whole-head halves RoPE, no RoPE scaling); anything else is an
error naming the field, never a silently different model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..errors import InputError
from .fields import HFField

#: Nomic's field → transformers' (and the GPT-2 default the remote-code class inherits)
RENAMES: dict[str, tuple[str, Any]] = {
    "n_embd": ("hidden_size", 768),
    "n_layer": ("num_hidden_layers", 12),
    "n_head": ("num_attention_heads", 12),
    "n_positions": ("max_position_embeddings", 1024),
    "layer_norm_epsilon": ("layer_norm_eps", 1e-5),
    "attn_pdrop": ("attention_probs_dropout_prob", 0.1),
}
#: switches transformers' NomicBert classes implement at one value only: field → (required, the remote-code default)
REQUIRED: dict[str, tuple[Any, Any]] = {
    "prenorm": (False, False),
    "parallel_block": (False, False),
    "use_rms_norm": (False, False),
    "causal": (False, False),
    "qkv_proj_bias": (False, True),
    "mlp_fc1_bias": (False, True),
    "mlp_fc2_bias": (False, True),
    "rotary_emb_fraction": (1.0, 0.0),
    "rotary_emb_interleaved": (False, False),
    "rotary_emb_scale_base": (None, None),
    "rotary_scaling_factor": (None, None),
    "scale_attn_weights": (True, True),
    "scale_attn_by_inverse_layer_idx": (False, False),
}
#: gated activations of Nomic's MLP (``fc11 · act(fc12)``) → transformers' hidden_act of the gate
GATED = {"swiglu": "silu", "geglu": "gelu"}
#: implementation switches (kernels, training conveniences, GPT-2 leftovers) with no effect on the numbers
IGNORED = (
    "auto_map",
    "fused_bias_fc",
    "fused_dropout_add_ln",
    "use_flash_attn",
    "use_xentropy",
    "dense_seq_output",
    "max_trained_positions",  # used only together with rotary_scaling_factor
    "parallel_block_tied_norm",
    "reorder_and_upcast_attn",
    "n_ctx",
    "summary_type",
    "summary_use_proj",
    "summary_activation",
    "summary_proj_to_labels",
    "summary_first_dropout",
)

_FLAG, _RATE = HFField(bool), HFField(float, ge=0, le=1)
#: the original format's fields, declared as the remote-code class types them (the ignored ones: any value)
ORIGINAL_FIELDS: dict[str, HFField] = {
    **{field: HFField(int, ge=1) for field in ("n_embd", "n_layer", "n_head", "n_positions")},
    "layer_norm_epsilon": HFField(float, gt=0),
    **dict.fromkeys(("attn_pdrop", "resid_pdrop", "embd_pdrop"), _RATE),
    **{field: _FLAG for field, (required, _) in REQUIRED.items() if isinstance(required, bool)},
    "rotary_emb_fraction": HFField(float, ge=0, le=1),
    "rotary_emb_scale_base": HFField(float, nullable=True),
    "rotary_scaling_factor": HFField(float, nullable=True),
    "activation_function": HFField(str),
    "rotary_emb_base": HFField(float, gt=0),
    "pad_vocab_size_multiple": HFField(int, ge=1, nullable=True),
    "n_inner": HFField(int, ge=1, nullable=True),
    **{field: HFField(object, nullable=True, doc="no effect on the numbers") for field in IGNORED},
}


def is_original(hf: Mapping[str, Any]) -> bool:
    """Whether a ``nomic_bert`` config.json is in Nomic's original format."""
    return "n_embd" in hf or "n_layer" in hf


def original_to_transformers(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The transformers ``NomicBertConfig`` fields of an original config.json.

    Raises:
        ValueError: a switch at a value transformers' NomicBert classes do not implement (naming the field and
            the value they need), or a non-gated activation.
    """
    src = dict(hf)
    out: dict[str, Any] = {}
    problems = []
    for field, (required, default) in REQUIRED.items():
        value = src.pop(field, default)
        if value != required:
            problems.append(f"{field} is {value!r} (transformers' NomicBert classes need {required!r})")
    activation = src.pop("activation_function", "gelu_new")
    if activation not in GATED:
        problems.append(f"activation_function is {activation!r}; NomicBERT's MLP is gated: {', '.join(GATED)}")
    dropouts = {key: src.pop(key, 0.1) for key in ("resid_pdrop", "embd_pdrop")}
    if len(set(dropouts.values())) > 1:
        problems.append(f"resid_pdrop and embd_pdrop differ ({dropouts}); transformers has one hidden_dropout_prob")
    if problems:
        raise InputError("cannot read Nomic's original config.json: " + "; ".join(problems))
    for field, (target, default) in RENAMES.items():
        out[target] = src.pop(field, default)
    n_inner = src.pop("n_inner", None)
    out["intermediate_size"] = n_inner if n_inner is not None else 4 * out["hidden_size"]
    out["hidden_act"] = GATED[activation]
    out["hidden_dropout_prob"] = dropouts["resid_pdrop"]
    out["rope_parameters"] = {"rope_theta": float(src.pop("rotary_emb_base", 1000.0)), "rope_type": "default"}
    # the remote-code model pads its vocabulary to a multiple (64 for the published ones): the table has that size
    multiple = src.pop("pad_vocab_size_multiple", 1) or 1
    vocab = src.pop("vocab_size", 50257)
    out["vocab_size"] = math.ceil(vocab / multiple) * multiple
    for key in IGNORED:
        src.pop(key, None)
    for key in ("resid_pdrop", "embd_pdrop"):
        src.pop(key, None)
    return {**src, **out}
