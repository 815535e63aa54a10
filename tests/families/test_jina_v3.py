"""Jina-embeddings-v3 (``model_type: jina_embeddings_v3``), what only this family does: its config.json maps to
rotary positions without RoBERTa's position offset, a fused QKV projection and BERT's feed-forward, and its class
defaults fill a sparse config.json. Parity of every head, the padded and packed paths, hidden states, attention
probabilities, in-memory checkpoint names, the errors, the tokenizer convention and the preset: the tables of
``test_parity.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import bertblocks
from bertblocks.config import ConfigError
from bertblocks.hf.config_json import config_from_hf, config_to_hf
from bertblocks.hf.weights import CheckpointError
from tests.tolerances import assert_close

from .reference import FAMILIES

JINA = FAMILIES["jina_embeddings_v3"]


def test_config_maps_to_the_components_it_is_made_of():
    cfg = bertblocks.load_config(config_from_hf(JINA.hf_config()))
    assert cfg.position.name == "rope"
    assert cfg.position.options()["base"] == 30.0
    assert cfg.embedding.options().get("position_offset", "none") == "none"  # no RoBERTa offset: 0, 1, 2, …
    assert cfg.encoder.attention.options()["fused_qkv"] is True
    assert cfg.encoder.feedforward.name == "bert"
    assert cfg.pooler is not None  # JinaEmbeddingsV3Model has one
    back = config_to_hf(cfg)
    assert back["rope_parameters"] == {"rope_theta": 30.0, "rope_type": "default"}
    assert "bertblocks" not in back


def test_class_defaults_fill_a_sparse_config_json():
    cfg = bertblocks.load_config(config_from_hf({"model_type": "jina_embeddings_v3"}))
    theirs = transformers.JinaEmbeddingsV3Config()
    assert cfg.vocab_size == theirs.vocab_size
    assert cfg.hidden_size == theirs.hidden_size
    assert cfg.encoder.num_layers == theirs.num_hidden_layers
    assert cfg.pad_token_id == theirs.pad_token_id
    assert cfg.layer_norm_eps == theirs.layer_norm_eps
    assert cfg.position.options()["base"] == theirs.rope_parameters["rope_theta"]


# ------------------------------------------------------------------- the published format (XLMRobertaLoRA)
REMOTE = "jinaai/xlm-roberta-flash-implementation"
TASKS = ["retrieval.query", "retrieval.passage", "text-matching"]
#: jinaai/jina-embeddings-v3's config.json fields, at the test's tiny sizes (three of its five tasks)
PUBLISHED: dict[str, Any] = {
    "_name_or_path": "jinaai/jina-embeddings-v3",
    "architectures": ["XLMRobertaModel"],
    "attention_probs_dropout_prob": 0.1,
    "auto_map": {
        "AutoConfig": f"{REMOTE}--configuration_xlm_roberta.XLMRobertaFlashConfig",
        "AutoModel": f"{REMOTE}--modeling_lora.XLMRobertaLoRA",
        "AutoModelForMaskedLM": f"{REMOTE}--modeling_xlm_roberta.XLMRobertaForMaskedLM",
        "AutoModelForPreTraining": f"{REMOTE}--modeling_xlm_roberta.XLMRobertaForPreTraining",
    },
    "bos_token_id": 0,
    "classifier_dropout": None,
    "emb_pooler": None,
    "eos_token_id": 2,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 37,
    "layer_norm_eps": 1e-05,
    "load_trained_adapters": True,
    "lora_adaptations": TASKS,
    "lora_alpha": 3,
    "lora_dropout_p": 0.0,
    "lora_main_params_trainable": False,
    "lora_rank": 2,
    "matryoshka_dimensions": [8, 16, 32],
    "max_position_embeddings": 64,
    "model_type": "xlm-roberta",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_loras": 3,
    "output_past": True,
    "pad_token_id": 1,
    "position_embedding_type": "rotary",
    "rotary_emb_base": 30.0,  # far from the default 20000: a base read wrongly changes the numbers
    "task_instructions": {task: f"{task}: " for task in TASKS},
    "torch_dtype": "float32",
    "truncate_dim": None,
    "type_vocab_size": 1,
    "use_cache": True,
    "use_flash_attn": True,
    "use_reentrant": False,
    "vocab_size": 99,
}
#: modules the remote code parametrizes (every nn.Linear and nn.Embedding) → linear or embedding
LORA_MODULES = {
    "embeddings.word_embeddings": "embedding",
    "embeddings.token_type_embeddings": "embedding",
    "mixer.Wqkv": "linear",
    "mixer.out_proj": "linear",
    "mlp.fc1": "linear",
    "mlp.fc2": "linear",
    "pooler.dense": "linear",
}


def _native_weights(tmp_path: Path) -> dict[str, torch.Tensor]:
    """A tiny native model's weights under the names transformers saves (the remote code's own names)."""
    torch.manual_seed(0)
    fields = {k: PUBLISHED[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")}
    config = transformers.JinaEmbeddingsV3Config(
        **fields,
        intermediate_size=37,
        max_position_embeddings=64,
        pad_token_id=1,
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        initializer_range=0.2,  # sharp attention: a wrong weight shows in the numbers
        rope_parameters={"rope_theta": 30.0, "rope_type": "default"},
    )
    transformers.JinaEmbeddingsV3Model(config).save_pretrained(tmp_path / "native-init")
    return load_file(tmp_path / "native-init" / "model.safetensors")


def _published(native: dict[str, torch.Tensor], seed: int = 1) -> dict[str, torch.Tensor]:
    """The published checkpoint's layout: ``roberta.`` and, for every parametrized module, the weight as
    ``parametrizations.weight.original`` with one LoRA pair per task (random, so that every task differs)."""
    g = torch.Generator().manual_seed(seed)
    rank, tasks = PUBLISHED["lora_rank"], len(TASKS)
    out = {}
    for key, tensor in native.items():
        module = key.removesuffix(".weight")
        kind = next((k for suffix, k in LORA_MODULES.items() if module.endswith(suffix)), None)
        if kind is None or not key.endswith(".weight"):
            out[f"roberta.{key}"] = tensor
            continue
        rows, cols = tensor.shape
        if kind == "linear":  # A [tasks, r, in], B [tasks, out, r]
            a, b = torch.randn(tasks, rank, cols, generator=g), torch.randn(tasks, rows, rank, generator=g)
        else:  # embedding: A [tasks, rows, r], B [tasks, r, dim]
            a, b = torch.randn(tasks, rows, rank, generator=g), torch.randn(tasks, rank, cols, generator=g)
        out[f"roberta.{module}.parametrizations.weight.original"] = tensor
        out[f"roberta.{module}.parametrizations.weight.0.lora_A"] = a * 0.1
        out[f"roberta.{module}.parametrizations.weight.0.lora_B"] = b * 0.1
    return out


def _merged_reference(published: dict[str, torch.Tensor], task: str) -> dict[str, torch.Tensor]:
    """The remote code's ``W + (alpha / rank) · update`` for ``task`` in float64 (linear ``B @ A``, embedding
    ``A @ B``), under the native names: what transformers' native class must compute with."""
    t, scaling = TASKS.index(task), PUBLISHED["lora_alpha"] / PUBLISHED["lora_rank"]
    out = {}
    for key, tensor in published.items():
        name = key.removeprefix("roberta.")
        if ".parametrizations." not in name:
            out[name] = tensor
        elif name.endswith(".original"):
            module = name.removesuffix(".parametrizations.weight.original")
            a = published[f"roberta.{module}.parametrizations.weight.0.lora_A"][t].double()
            b = published[f"roberta.{module}.parametrizations.weight.0.lora_B"][t].double()
            kind = next(k for suffix, k in LORA_MODULES.items() if module.endswith(suffix))
            update = b @ a if kind == "linear" else a @ b
            out[f"{module}.weight"] = (tensor.double() + scaling * update).float()
    return out


def _save_published(tmp_path: Path, state: dict[str, torch.Tensor], config: dict[str, Any] | None = None) -> Path:
    folder = tmp_path / "published"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or PUBLISHED))
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def _native_model(tmp_path: Path, state: dict[str, torch.Tensor], name: str) -> torch.nn.Module:
    folder = tmp_path / name
    folder.mkdir()
    native = json.loads((tmp_path / "native-init" / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(native))
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    return transformers.JinaEmbeddingsV3Model.from_pretrained(folder).eval()


def _inputs():
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 99, (2, 11), generator=g)
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, 7:] = 0
    ids[1, 7:] = 1
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("task", TASKS)
def test_published_checkpoint_with_a_task_equals_transformers_native_class_on_the_merged_weights(tmp_path, task):
    published = _published(_native_weights(tmp_path))
    folder = _save_published(tmp_path, published)
    ours, info = bertblocks.from_pretrained(folder, [f"hf.lora_task={task}"], output_loading_info=True)
    assert info.missing_keys == []
    assert info.unexpected_keys == []
    assert ours.config.family == "jina_embeddings_v3"
    merged = _merged_reference(published, task)
    theirs = _native_model(tmp_path, merged, "merged")
    x = _inputs()
    with torch.no_grad():
        a, b = ours.eval()(**x), theirs(**x)
    real = x["attention_mask"].bool()
    assert_close(a.last_hidden_state[real], b.last_hidden_state[real])
    assert_close(a.pooler_output, b.pooler_output)
    # the merge itself against the float64 formula (stored in float32: one rounding)
    word = ours.state_dict()["embeddings.word_embeddings.weight"]
    assert_close(word, merged["embeddings.word_embeddings.weight"], atol=1e-6)


def test_tasks_differ_and_none_keeps_the_weights_without_adapters(tmp_path):
    native = _native_weights(tmp_path)
    folder = _save_published(tmp_path, _published(native))
    x = _inputs()
    out = {}
    for task in (*TASKS[:2], "none"):
        with torch.no_grad():
            out[task] = bertblocks.from_pretrained(folder, [f"hf.lora_task={task}"]).eval()(**x).last_hidden_state
    assert (out[TASKS[0]] - out[TASKS[1]]).abs().max() > 1e-3  # the adapters change the model
    plain = _native_model(tmp_path, native, "plain")
    with torch.no_grad():
        want = plain(**x).last_hidden_state
    real = x["attention_mask"].bool()
    assert_close(out["none"][real], want[real])


def test_adapters_without_a_task_are_refused_naming_how_to_choose(tmp_path):
    folder = _save_published(tmp_path, _published(_native_weights(tmp_path)))
    with pytest.raises(CheckpointError, match=r"LoRA adapters for the tasks retrieval\.query, retrieval\.passage, "):
        bertblocks.from_pretrained(folder)
    with pytest.raises(CheckpointError, match=r"hf\.lora_task=<task>"):
        bertblocks.from_pretrained(folder)
    with pytest.raises(CheckpointError, match=r"lora_task 'classification' has no adapter"):
        bertblocks.from_pretrained(folder, ["hf.lora_task=classification"])
    with pytest.raises(ConfigError, match=r"lora_task is 'classification'"):  # in config.json: at config time
        bertblocks.load_config(config_from_hf({**PUBLISHED, "lora_task": "classification"}))


def test_merged_model_saves_in_transformers_native_format(tmp_path):
    folder = _save_published(tmp_path, _published(_native_weights(tmp_path)))
    ours = bertblocks.from_pretrained(folder, [f"hf.lora_task={TASKS[1]}"]).eval()
    ours.save_pretrained(tmp_path / "saved")
    written = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert written["model_type"] == "jina_embeddings_v3"
    for field in ("auto_map", "lora_adaptations", "lora_task", "lora_rank", "task_instructions", "rotary_emb_base"):
        assert field not in written, field
    assert written["rope_parameters"] == {"rope_theta": 30.0, "rope_type": "default"}
    assert "bertblocks" not in written
    theirs, info = transformers.JinaEmbeddingsV3Model.from_pretrained(tmp_path / "saved", output_loading_info=True)
    assert not info["missing_keys"]
    assert not info["unexpected_keys"]
    x = _inputs()
    with torch.no_grad():
        a, b = ours(**x).last_hidden_state, theirs.eval()(**x).last_hidden_state
    real = x["attention_mask"].bool()
    assert_close(a[real], b[real])


def test_published_config_translates_to_the_native_family():
    cfg = bertblocks.load_config(config_from_hf(PUBLISHED))
    assert cfg.family == "jina_embeddings_v3"
    assert cfg.position.name == "rope"
    assert cfg.position.options()["base"] == 30.0
    assert cfg.layer_norm_eps == 1e-5
    assert cfg.hf["lora_adaptations"] == TASKS
    assert cfg.hf["task_instructions"]["retrieval.query"] == "retrieval.query: "  # for the caller's texts
    assert "auto_map" not in cfg.hf


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"position_embedding_type": "absolute"}, "position_embedding_type is 'absolute'"),
        ({"window_size": [8, 8]}, r"window_size is \[8, 8\]"),
        ({"lora_adaptations": "retrieval.query"}, "lora_adaptations is 'retrieval.query'"),
        ({"lora_rank": 0}, "lora_rank is 0"),
    ],
)
def test_published_switches_the_native_architecture_lacks_are_errors(change, match):
    with pytest.raises(ConfigError, match=match):
        bertblocks.load_config(config_from_hf({**PUBLISHED, **change}))


def test_other_remote_code_under_xlm_roberta_stays_refused():
    other = {k: v.replace(REMOTE, "someone/other-implementation") for k, v in PUBLISHED["auto_map"].items()}
    with pytest.raises(ConfigError, match=r"auto_map: names remote-code classes \(someone/other-implementation--"):
        bertblocks.load_config(config_from_hf({**PUBLISHED, "auto_map": other}))


def test_bfloat16_adapters_merge_without_rounding_the_sum_to_bfloat16(tmp_path):
    """The published weights are bfloat16: the merged weight keeps float32 precision (the float64 sum, rounded
    once to float32), not the sum rounded back to bfloat16."""
    published = {k: v.to(torch.bfloat16) for k, v in _published(_native_weights(tmp_path)).items()}
    folder = _save_published(tmp_path, published, {**PUBLISHED, "torch_dtype": "bfloat16"})
    ours = bertblocks.from_pretrained(folder, [f"hf.lora_task={TASKS[0]}"], dtype=torch.float32)
    merged = _merged_reference(published, TASKS[0])  # float64 sum of the bfloat16 tensors, in float32
    got = ours.state_dict()["encoder.layer.0.attention.self.Wqkv.weight"]
    assert got.dtype == torch.float32
    assert_close(got, merged["encoder.layers.0.mixer.Wqkv.weight"], atol=1e-6)
    rounded = merged["encoder.layers.0.mixer.Wqkv.weight"].to(torch.bfloat16).float()
    assert (rounded - merged["encoder.layers.0.mixer.Wqkv.weight"]).abs().max() > 1e-4  # what bfloat16 would lose
