"""Jina-embeddings-v3 (``model_type: jina_embeddings_v3``): XLM-RoBERTa's vocabulary, heads and checkpoint prefix
with rotary positions instead of a position table.

What differs from BERT, as components: position ``rope`` (halves, whole head, ``θ = rope_theta``, 20000 by
default), no position table and no position offset (positions 0, 1, 2, … as transformers' class counts them,
padding included); attention ``fused_qkv`` (with biases); BERT's feed-forward and post-LN layers. Heads are
XLM-RoBERTa's (a gelu ``lm_head``, a ``dense → tanh → out_proj`` classifier).

The checkpoint is what transformers writes (its ``save_pretrained`` reverts to Jina's original names):
``roberta.emb_ln``, ``roberta.encoder.layers.{i}.mixer.Wqkv`` (query, key, value rows), ``mixer.out_proj``,
``norm1``, ``mlp.fc1``, ``mlp.fc2``, ``norm2``; one under transformers' in-memory names
(``save_original_format=False``: ``layers.{i}.self_attn.q_proj``, …) loads too.

**The published format** (``jinaai/jina-embeddings-v3`` itself): ``model_type: xlm-roberta`` with an ``auto_map``
to ``jinaai/xlm-roberta-flash-implementation``'s ``XLMRobertaLoRA``, ``position_embedding_type: rotary`` with
``rotary_emb_base``, and per-task LoRA adapters (``lora_adaptations``, ``lora_rank``, ``lora_alpha``,
``task_instructions``). This family claims that config.json (its fields translated, nothing imported) and its
weights: every linear and embedding weight ``W`` is stored as ``….parametrizations.weight.original`` beside
``….parametrizations.weight.0.lora_A`` / ``lora_B`` holding one low-rank pair per task. bertblocks merges the
pair of **one chosen task** into the weights at load, in float64, stored in at least float32
(``scaling = lora_alpha / lora_rank``)::

    linear    W [out, in]    A [tasks, r, in]    B [tasks, out, r]    W + scaling · B[t] @ A[t]
    embedding W [rows, dim]  A [tasks, rows, r]  B [tasks, r, dim]    W + scaling · A[t] @ B[t]

The task is the config's ``hf.lora_task`` (``from_pretrained(path, ["hf.lora_task=retrieval.query"])``, or a
``lora_task`` field in config.json); ``none`` keeps the weights without adapters (the remote code's ``task=None``).
Loading the adapters without a task is refused, naming the tasks and how to pick one. The merged model is the
native architecture, so it saves in transformers' native format (``model_type: jina_embeddings_v3``, no
adapters, no ``auto_map``), which transformers' own class loads. The task instructions (``task_instructions``, the
prefixes the remote ``encode()`` puts before texts) are kept in ``config.hf`` for the caller; the model does not
add them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

from bertblocks.config import BertConfig
from bertblocks.core.component import Component
from bertblocks.families.family import Family, RemoteCode
from bertblocks.families.fields import HFField
from bertblocks.families.keymap import Join, KeyMap, KeyMapError, Rename

from ..errors import InputError
from ._rotary_config import ROPE_FIELDS, ROPE_FIXED, rope_from_hf, rope_to_hf
from .bertlike import BERT_FIELDS, bert_fields_from_hf, bert_fields_to_hf
from .roberta import LM_HEAD_RULES, roberta_tokenizer

#: transformers' JinaEmbeddingsV3Config.default_theta
DEFAULT_THETA = 20000.0
#: JinaEmbeddingsV3Config's defaults where they differ from BERT's (a config.json may leave them out)
DEFAULTS: dict[str, Any] = {
    "vocab_size": 250002,
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
    "max_position_embeddings": 8194,
    "type_vocab_size": 1,
    "layer_norm_eps": 1e-5,
    "pad_token_id": 1,
}

_L, _N, _O = "roberta.encoder.layers.{i}", "roberta.layers.{i}", "bert.encoder.layer.{i}"
KEY_MAP = KeyMap(
    prefix="roberta",
    rules=(
        Rename("roberta.emb_ln", "bert.embeddings.LayerNorm"),
        Rename(f"{_L}.mixer.Wqkv", f"{_O}.attention.self.Wqkv"),
        Rename(f"{_L}.mixer.out_proj", f"{_O}.attention.output.dense"),
        Rename(f"{_L}.norm1", f"{_O}.attention.output.LayerNorm"),
        Rename(f"{_L}.mlp.fc1", f"{_O}.intermediate.dense"),
        Rename(f"{_L}.mlp.fc2", f"{_O}.output.dense"),
        Rename(f"{_L}.norm2", f"{_O}.output.LayerNorm"),
        *LM_HEAD_RULES,
        # transformers' own names, in checkpoints saved with save_original_format=False: read, never written
        # (the rules above match every model key first)
        Join(tuple(f"{_N}.self_attn.{p}_proj" for p in "qkv"), f"{_O}.attention.self.Wqkv"),
        Rename(f"{_N}.self_attn.o_proj", f"{_O}.attention.output.dense"),
        Rename(f"{_N}.post_attention_layernorm", f"{_O}.attention.output.LayerNorm"),
        Rename(f"{_N}.mlp.fc1", f"{_O}.intermediate.dense"),
        Rename(f"{_N}.mlp.fc2", f"{_O}.output.dense"),
        Rename(f"{_N}.post_mlp_layernorm", f"{_O}.output.LayerNorm"),
    ),
    head_prefixes=("lm_head.", "classifier.", "qa_outputs."),
)

FIXED: dict[str, Any] = {
    **ROPE_FIXED,
    "encoder.layer.name": "post_ln",
    "encoder.attention.name": "bert",
    "encoder.attention.fused_qkv": True,
    "encoder.attention.qkv_bias": True,
    "encoder.attention.output_bias": True,
    "encoder.feedforward.name": "bert",
    "encoder.feedforward.bias": True,
    "is_decoder": False,
    "add_cross_attention": False,
}


# ------------------------------------------------------------------------------------ the published format
#: the published remote code this family's published format names
REMOTE_REPOSITORY = "jinaai/xlm-roberta-flash-implementation"
#: its classes whose modelling the native architecture (plus merged LoRA adapters) reproduces
REMOTE_CLASSES = frozenset(
    {
        "configuration_xlm_roberta.XLMRobertaFlashConfig",
        "modeling_lora.XLMRobertaLoRA",
        "modeling_xlm_roberta.XLMRobertaModel",
        "modeling_xlm_roberta.XLMRobertaForMaskedLM",
        "modeling_xlm_roberta.XLMRobertaForPreTraining",
    }
)
#: the published config.json's fields for its adapters, kept in ``config.hf`` to merge the chosen task at load and
#: never written in the native format (the merged model has no adapters)
LORA_FIELDS = ("lora_adaptations", "lora_rank", "lora_alpha", "task_instructions", "lora_task")
#: kernels, training conveniences and encode()-time options of the published config: no effect on the numbers
REMOTE_IGNORED = (
    "auto_map",
    "use_flash_attn",
    "lora_dropout_p",
    "lora_main_params_trainable",
    "load_trained_adapters",
    "num_loras",
    "matryoshka_dimensions",
    "truncate_dim",
    "emb_pooler",
    "output_past",
    "use_reentrant",
)
#: the task choice that keeps the weights without adapters
NO_TASK = "none"
_PARAMETRIZED = ".parametrizations.weight."


#: what a published config.json's ``auto_map`` may name for this family to read it
REMOTE_CODE = RemoteCode(REMOTE_REPOSITORY, REMOTE_CLASSES)


def is_published(hf: Mapping[str, Any]) -> bool:
    """Whether a config.json is the published Jina-embeddings-v3 format: its ``auto_map`` names only
    ``jinaai/xlm-roberta-flash-implementation``'s classes (the tokenizer aside)."""
    return JINA_EMBEDDINGS_V3.reads_remote(hf)


def published_to_native(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The published config.json's fields → the native ``JinaEmbeddingsV3Config``'s, the adapter fields kept.

    Raises:
        ValueError: a switch the native architecture does not implement (named), or adapter fields that do not
            describe a task list.
    """
    src = dict(hf)
    problems = []
    position = src.pop("position_embedding_type", "rotary")
    if position != "rotary":
        problems.append(f"position_embedding_type is {position!r} (the native architecture is rotary)")
    window = src.pop("window_size", None)
    if window not in (None, [-1, -1]):
        problems.append(f"window_size is {window!r} (local attention; the native architecture attends globally)")
    adaptations = src.get("lora_adaptations")
    if adaptations is not None and not (
        isinstance(adaptations, list) and adaptations and all(isinstance(a, str) for a in adaptations)
    ):
        problems.append(f"lora_adaptations is {adaptations!r}, not a list of task names")
    for field in ("lora_rank", "lora_alpha"):
        value = src.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
            problems.append(f"{field} is {value!r}, not a positive number")
    task = src.get("lora_task")
    if task is not None and task != NO_TASK and isinstance(adaptations, list) and task not in adaptations:
        problems.append(f"lora_task is {task!r}; the adapters are {', '.join(map(str, adaptations))} (or {NO_TASK!r})")
    if problems:
        raise InputError("cannot read the published Jina-embeddings-v3 config.json: " + "; ".join(problems))
    theta = src.pop("rotary_emb_base", DEFAULT_THETA)
    src["rope_parameters"] = {"rope_theta": theta, "rope_type": "default"}
    for key in REMOTE_IGNORED:
        src.pop(key, None)
    src["model_type"] = "jina_embeddings_v3"
    return src


def merge_lora(state: Mapping[str, Any], config: BertConfig) -> dict[str, Any]:
    """The published checkpoint's tensors with the chosen task's LoRA pair merged into every parametrized weight
    (``….parametrizations.weight.original`` + ``….0.lora_A`` / ``lora_B`` → ``….weight``); a checkpoint without
    adapters passes through.

    Raises:
        KeyMapError: adapters but no task chosen (naming the tasks and how to choose), a task the adapters lack, or
            an adapter whose shapes fit neither a linear nor an embedding weight.
    """
    hf = config.hf
    tasks = hf.get("lora_adaptations")
    task = hf.get("lora_task")
    if not any(_PARAMETRIZED in key for key in state):
        if task is not None and task != NO_TASK:
            # the output would be the weights' own, whatever task was asked for: say so rather than ignore it
            raise KeyMapError(
                f"lora_task {task!r} was chosen, but the checkpoint holds no LoRA adapters "
                "(….parametrizations.weight.0.lora_A/lora_B) to merge; its weights are one model for every task. "
                f"Leave lora_task out (or set it to {NO_TASK!r}) to load them as they are"
            )
        return dict(state)
    if not isinstance(tasks, list):
        raise KeyMapError(
            "the checkpoint holds LoRA adapters (….parametrizations.weight.0.lora_A/lora_B) but config.json lists no "
            "lora_adaptations"
        )
    if task is None:
        raise KeyMapError(
            f"the checkpoint holds LoRA adapters for the tasks {', '.join(map(str, tasks))}; choose the one to merge "
            "into the weights: from_pretrained(path, ['hf.lora_task=<task>']) (or a lora_task field in config.json); "
            f"'hf.lora_task={NO_TASK}' keeps the weights without adapters"
        )
    if task != NO_TASK and task not in tasks:
        raise KeyMapError(f"lora_task {task!r} has no adapter; the adapters are {', '.join(map(str, tasks))}")
    index = None if task == NO_TASK else tasks.index(task)
    scaling = _scaling(hf.get("lora_alpha", 1), hf.get("lora_rank", 4))
    out: dict[str, Any] = {}
    for key, tensor in state.items():
        if _PARAMETRIZED not in key:
            out[key] = tensor
            continue
        module, _, part = key.partition(_PARAMETRIZED)
        if part != "original":
            continue  # lora_A / lora_B: merged with their weight below
        if tensor.dim() != 2:
            raise KeyMapError(
                f"{key}: a parametrized weight of shape {tuple(tensor.shape)}; LoRA adapters merge into 2-D "
                "weights only (a linear [out, in] or an embedding [rows, dim])"
            )
        out[f"{module}.weight"] = tensor if index is None else _merged(module, tensor, state, index, scaling)
    return out


def _scaling(alpha: Any, rank: Any) -> float:
    """``lora_alpha / lora_rank``, refused unless a finite positive number (a huge alpha or a tiny rank overflows)."""
    try:
        scaling = float(alpha) / float(rank)
    except (TypeError, ValueError, OverflowError, ZeroDivisionError):
        scaling = float("nan")
    if not math.isfinite(scaling) or scaling <= 0:
        raise KeyMapError(
            f"lora_alpha {alpha!r} / lora_rank {rank!r} is no finite positive scaling of the LoRA update; "
            "the published checkpoints say lora_alpha 1, lora_rank 4"
        )
    return scaling


def _merged(module: str, weight: Any, state: Mapping[str, Any], index: int, scaling: float) -> Any:
    """``weight`` plus this task's low-rank update, computed in float64 and stored in at least float32 (the
    published weights are bfloat16: rounding the sum back to it would throw away most of the update's precision;
    the load casts to the model's dtype afterwards)."""
    a_key, b_key = f"{module}{_PARAMETRIZED}0.lora_A", f"{module}{_PARAMETRIZED}0.lora_B"
    if a_key not in state or b_key not in state:
        raise KeyMapError(f"{module}: a parametrized weight without its LoRA pair ({a_key}, {b_key})")
    a, b = state[a_key], state[b_key]
    if a.dim() != 3 or b.dim() != 3 or index >= min(a.shape[0], b.shape[0]):
        raise KeyMapError(
            f"{module}: LoRA tensors of shapes {tuple(a.shape)}, {tuple(b.shape)} hold no adapter {index} "
            "([tasks, …, …] each)"
        )
    a, b = a[index].double(), b[index].double()
    rows, cols = weight.shape
    if a.shape[1] == cols and b.shape[0] == rows and a.shape[0] == b.shape[1]:  # linear: B @ A is [out, in]
        update = b @ a
    elif a.shape[0] == rows and b.shape[1] == cols and a.shape[1] == b.shape[0]:  # embedding: A @ B is [rows, dim]
        update = a @ b
    else:
        raise KeyMapError(
            f"{module}: LoRA pair of shapes {tuple(a.shape)}, {tuple(b.shape)} fits neither a linear nor an "
            f"embedding weight of shape {tuple(weight.shape)}"
        )
    merged = (weight.double() + scaling * update).to(torch.promote_types(weight.dtype, torch.float32))
    if not bool(torch.isfinite(merged).all()):
        # an update that overflows (a huge lora_alpha, adapters of huge values) would load as inf/NaN silently
        bad = int(merged.numel() - torch.isfinite(merged).sum())
        raise KeyMapError(
            f"{module}.weight: merging the LoRA adapter {index} gives {bad} non-finite values (inf or NaN); check "
            "lora_alpha / lora_rank and the adapter tensors"
        )
    return merged


def _from_hf(hf: Any) -> dict[str, Any]:
    if is_published(hf):
        hf = published_to_native(hf)
    src = {**DEFAULTS, **hf}
    position = rope_from_hf(src, DEFAULT_THETA)
    for absent in ("is_decoder", "add_cross_attention"):  # JinaEmbeddingsV3Config has neither
        src.pop(absent, None)
    data = bert_fields_from_hf(src)
    data["position"] = position
    return data  # the rest of the scheme and the fused QKV: FIXED, applied by the translator


def _to_hf(config: BertConfig) -> dict[str, Any]:
    dropped = ("position_embedding_type", "is_decoder", "add_cross_attention", *LORA_FIELDS)
    out = bert_fields_to_hf(config, dropped=dropped)  # a merged published model saves as the native one
    out.update(rope_to_hf(config))
    return out


#: JinaEmbeddingsV3Config's fields, and those of the published format (translated to them first); the ignored
#: switches of the remote code take any value. The adapter fields stay in ``config.hf`` for the merge, which checks
#: them (lora_adaptations, lora_rank, lora_alpha: :func:`published_to_native`, :func:`merge_lora`)
FIELDS = {
    **BERT_FIELDS,
    **ROPE_FIELDS,
    "window_size": HFField(list, items=int, nullable=True),
    "rotary_emb_base": HFField(float, gt=0),
    "lora_task": HFField(str, nullable=True),
    "task_instructions": HFField(dict, nullable=True),
    **{field: HFField(object, nullable=True, doc="no effect on the numbers") for field in REMOTE_IGNORED},
}

JINA_EMBEDDINGS_V3 = Family(
    model_type="jina_embeddings_v3",
    config_from_hf=_from_hf,
    config_to_hf=_to_hf,
    fields=FIELDS,
    key_map=KEY_MAP,
    architectures={
        "JinaEmbeddingsV3ForMaskedLM": "masked_lm_gelu",
        "JinaEmbeddingsV3ForSequenceClassification": {"name": "dense_classification", "activation": "tanh"},
        "JinaEmbeddingsV3ForTokenClassification": "token_classification",
        "JinaEmbeddingsV3ForQuestionAnswering": "question_answering",
    },
    base_architecture="JinaEmbeddingsV3Model",
    fixed=FIXED,
    description="Jina-embeddings-v3: XLM-RoBERTa with RoPE instead of a position table, fused QKV",
    # transformers maps jina_embeddings_v3 to XLMRobertaTokenizer; chosen by model_type only (the xlm-roberta
    # family claims that class name)
    tokenizer=replace(roberta_tokenizer("XLMRoberta"), tokenizer_classes=()),
    # the published format (model_type xlm-roberta, auto_map to XLMRobertaLoRA) is translated, its adapters merged
    remote_code=(REMOTE_CODE,),
    remote_model_types=("xlm-roberta",),
    prepare_checkpoint=merge_lora,
)


def bertblocks_register_components() -> list[Component]:
    return [
        Component(
            "family",
            "jina_embeddings_v3",
            lambda **_: JINA_EMBEDDINGS_V3,
            description=JINA_EMBEDDINGS_V3.description,
        )
    ]
