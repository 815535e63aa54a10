"""Property-based fuzzing (hypothesis) of what a user or a file someone sends can feed bertblocks: configs,
the config.json fields of every family, YAML text, safetensors headers, shard indexes and forward inputs.
The property is always the same: the input is accepted and works, or it is refused with the documented
error type, never anything else (an ``IndexError``, a
``RecursionError``, a hang, a NaN output).

Runs are derandomised (the same cases every time, so CI is reproducible) and bounded: each test has a fixed
``max_examples`` and the whole file takes well under two minutes. Run with
``--hypothesis-show-statistics`` to see how many cases each test generated.
"""

from __future__ import annotations

import contextlib
import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from conftest import TINY
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

import bertblocks
from bertblocks.config import ConfigError
from bertblocks.config.limits import LimitError, check_size
from bertblocks.errors import BertBlocksError
from bertblocks.hf.weight_files import SAFETENSORS_DTYPES, WeightFileError, read_safetensors
from bertblocks.hf.weights import CheckpointError, find_weights, read_state_dict
from bertblocks.readers.bounded_yaml import load_yaml
from bertblocks.registry import RegistryError


def fuzz(max_examples: int) -> settings:
    """Settings of every fuzz test: ``max_examples`` cases, the same ones on every run."""
    return settings(
        max_examples=max_examples,
        deadline=None,  # a shared CI machine has slow moments; the bound is max_examples
        database=None,  # nothing written into the checkout
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


# ------------------------------------------------------------------------------------------------ configs
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 2, 3, 4, 12, 32, 64, 768, 10**9]),
)
scalars = st.one_of(numbers, st.booleans(), st.none(), st.text(max_size=12))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)
CONFIG_KEYS = [
    "vocab_size",
    "hidden_size",
    "max_position_embeddings",
    "type_vocab_size",
    "pad_token_id",
    "layer_norm_eps",
    "hidden_dropout_prob",
    "initializer_range",
    "is_decoder",
    "add_cross_attention",
    "num_labels",
    "id2label",
    "pruned_heads",
    "position",
    "pooler",
    "head",
    "encoder.num_layers",
    "encoder.attention.num_heads",
    "encoder.attention.dropout",
    "encoder.attention.backend",
    "encoder.feedforward.intermediate_size",
    "encoder.feedforward.activation",
    "encoder.chunk_size_feed_forward",
    "encoder.packing_threshold",
]
layer_specs = st.one_of(
    st.integers(min_value=-5, max_value=10**12),
    st.text(alphabet="0123456789-, ", max_size=24),
    st.lists(st.integers(min_value=-3, max_value=10**6), max_size=6),
)


@fuzz(300)
@given(
    changes=st.dictionaries(st.sampled_from(CONFIG_KEYS), values, max_size=5),
    layers=st.one_of(st.none(), layer_specs),
)
def test_any_config_validates_or_is_a_config_error(changes, layers):
    overrides = dict(changes)
    if layers is not None:
        overrides["encoder.overrides"] = [{"layers": layers, "attention": {"backend": "eager"}}]
    try:
        cfg = bertblocks.load_config(TINY, overrides)
    except (ConfigError, RegistryError):
        return
    # a config that validates is within the limits, or says by how much it is not, before building
    try:
        check_size(cfg)
    except LimitError:
        return
    assert cfg.encoder.num_layers >= 1


# --------------------------------------------------------------------------------------------------- YAML
YAML_TOKENS = [*"ab:-[]{}&*,'\"\n #!|>.0123456789\t", "&a ", "*a", "&b ", "*b", "<<: ", "!!python/object ", "key: "]
yaml_text = st.lists(st.sampled_from(YAML_TOKENS), max_size=40).map("".join)


@fuzz(400)
@given(text=st.one_of(yaml_text, st.text(max_size=60)))
def test_any_yaml_text_loads_or_is_a_yaml_error(text):
    try:
        data = load_yaml(text)
    except yaml.YAMLError:
        return
    json.dumps(data, default=str)  # what was built is finite: it can be walked


@fuzz(150)
@given(text=yaml_text)
def test_any_yaml_config_file_loads_or_is_a_config_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "config.yaml"
    path.write_text(text, encoding="utf-8")
    with contextlib.suppress(ConfigError, RegistryError):
        bertblocks.load_config(path)


@fuzz(60)
@given(width=st.integers(min_value=2, max_value=12), depth=st.integers(min_value=2, max_value=12))
def test_alias_trees_of_any_shape_load_only_when_small(width, depth):
    lines = ["l0: &l0 [" + ", ".join(["x"] * width) + "]"]
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, depth)]
    expanded = sum(width**i for i in range(2, depth + 1))  # leaves reached through aliases, at least
    try:
        load_yaml("\n".join(lines))
    except yaml.YAMLError:
        assert expanded > 1000  # refused only when really big
        return
    assert expanded < 10**6  # accepted only when bounded


# ---------------------------------------------------------------------------------------- weight headers
dtype_names = st.one_of(
    st.sampled_from(sorted(SAFETENSORS_DTYPES)), st.sampled_from(["F128", "", "f32", "Q4"]), st.integers()
)
dims = st.lists(
    st.one_of(st.integers(min_value=0, max_value=6), st.integers(min_value=-2, max_value=2**40), st.booleans()),
    max_size=3,
)
offsets = st.lists(st.integers(min_value=-2, max_value=200), min_size=0, max_size=3)
entries = st.fixed_dictionaries(
    {"dtype": dtype_names, "shape": dims, "data_offsets": offsets},
    optional={"extra": st.integers()},
)
headers = st.one_of(
    st.dictionaries(st.text(min_size=1, max_size=6), st.one_of(entries, scalars), max_size=4),
    st.lists(scalars, max_size=3),
    scalars,
)


@fuzz(400)
@given(
    header=headers,
    data=st.binary(max_size=160),
    lie=st.one_of(st.none(), st.integers(min_value=0, max_value=2**64 - 1)),
)
def test_any_safetensors_header_reads_like_the_reference_or_is_refused(tmp_path_factory, header, data, lie):
    text = json.dumps(header).encode()
    path = tmp_path_factory.mktemp("fuzz") / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(text) if lie is None else lie) + text + data)
    try:
        tensors = read_safetensors(path)
    except WeightFileError as e:
        refused = str(e)
    else:
        refused = None
    if refused is not None:
        assert refused.startswith(str(path))  # every refusal names the file
        return
    reference = load_file(path)  # what we accept, the safetensors library reads the same
    assert tensors.keys() == reference.keys()
    for name, tensor in tensors.items():
        assert tensor.dtype == reference[name].dtype
        assert tensor.shape == reference[name].shape
        assert torch.equal(
            tensor.view(torch.uint8) if tensor.numel() else tensor,
            reference[name].view(torch.uint8) if tensor.numel() else reference[name],
        )


tensor_layouts = st.lists(
    st.tuples(st.sampled_from(["F32", "F16", "I64", "U8", "BOOL", "BF16"]), st.lists(st.integers(0, 4), max_size=3)),
    min_size=1,
    max_size=3,
)
mutations = st.one_of(
    st.none(),
    st.tuples(st.just("shape"), st.integers(0, 2), st.integers(0, 9)),
    st.tuples(st.just("offset"), st.integers(0, 2), st.integers(-8, 8)),
    st.tuples(st.just("dtype"), st.integers(0, 2), st.sampled_from(["F64", "I8", "F128"])),
    st.tuples(st.just("cut"), st.integers(0, 2), st.integers(1, 16)),
)


@fuzz(300)
@given(layout=tensor_layouts, mutation=mutations)
def test_a_valid_file_with_one_field_changed_is_read_like_the_reference_or_refused(tmp_path_factory, layout, mutation):
    header: dict[str, Any] = {}
    position = 0
    for i, (dtype, shape) in enumerate(layout):
        size = int(torch.empty(shape, dtype=SAFETENSORS_DTYPES[dtype]).nbytes)
        header[f"t{i}"] = {"dtype": dtype, "shape": shape, "data_offsets": [position, position + size]}
        position += size
    data = bytes(range(256)) * (position // 256 + 1)
    data = data[:position]
    if mutation is not None:
        kind, which, amount = mutation
        entry = header[f"t{which % len(layout)}"]
        if kind == "shape":
            entry["shape"] = [*entry["shape"], amount]
        elif kind == "offset":
            entry["data_offsets"] = [max(0, entry["data_offsets"][0] + amount), entry["data_offsets"][1]]
        elif kind == "dtype":
            entry["dtype"] = amount
        else:
            data = data[: max(0, len(data) - amount)]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # aligned, as the safetensors writer pads
    path = tmp_path_factory.mktemp("fuzz") / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    try:
        tensors = read_safetensors(path)
    except WeightFileError:
        assert mutation is not None  # an unchanged valid file is always read
        with pytest.raises(Exception):  # noqa: B017, PT011 - the reference refuses it too, in its own words
            load_file(path)
        return
    reference = load_file(path)
    for name, tensor in tensors.items():
        assert torch.equal(tensor.view(-1).view(torch.uint8), reference[name].view(-1).view(torch.uint8))


@fuzz(150)
@given(blob=st.binary(max_size=300))
def test_any_bytes_as_a_weight_file_are_read_or_refused(tmp_path_factory, blob):
    path = tmp_path_factory.mktemp("fuzz") / "model.safetensors"
    path.write_bytes(blob)
    with contextlib.suppress(WeightFileError):
        read_safetensors(path)


# ------------------------------------------------------------------------------------------ forward inputs
@pytest.fixture(scope="module")
def tiny_model() -> Any:
    torch.manual_seed(0)
    return bertblocks.create_model(bertblocks.load_config(TINY)).eval()


mask_values = st.one_of(st.sampled_from([0.0, 1.0]), st.floats(allow_nan=True, allow_infinity=True, width=32))


@fuzz(150)
@given(
    batch=st.integers(min_value=1, max_value=3),
    length=st.integers(min_value=0, max_value=70),
    ids=st.lists(st.integers(min_value=-3, max_value=120), min_size=1, max_size=8),
    mask=st.one_of(st.none(), st.lists(mask_values, min_size=1, max_size=8), st.just("ints")),
    types=st.one_of(st.none(), st.integers(min_value=-1, max_value=3)),
)
def test_any_forward_input_gives_finite_outputs_or_a_value_error(tiny_model, batch, length, ids, mask, types):
    input_ids = torch.tensor((ids * (length // len(ids) + 1))[:length] * batch, dtype=torch.long).view(batch, length)
    kwargs: dict[str, Any] = {}
    if mask == "ints":
        kwargs["attention_mask"] = torch.ones(batch, length, dtype=torch.long)
    elif mask is not None:
        kwargs["attention_mask"] = torch.tensor((mask * (length // len(mask) + 1))[:length] * batch).view(batch, length)
    if types is not None:
        kwargs["token_type_ids"] = torch.full((batch, length), types, dtype=torch.long)
    try:
        with torch.no_grad():
            out = tiny_model(input_ids, **kwargs)
    except ValueError:
        return
    assert torch.isfinite(out.last_hidden_state).all()


def test_the_fuzz_suite_is_registered_in_the_test_extra():
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    constraints = (Path(__file__).parents[1] / "constraints.txt").read_text()
    assert '"hypothesis' in pyproject
    assert "hypothesis==" in constraints


# ------------------------------------------------------------------------------- config.json of every family
def _family_configs() -> dict[str, dict[str, Any]]:
    """Each family's default ``config.json`` (its own fields, as its translator writes them)."""
    from bertblocks.hf.config_json import config_to_hf
    from bertblocks.hf.families import known_families

    # fields a family's config.json must carry because their defaults live in remote code bertblocks never reads
    required = {"new": {"rope_theta": 500000.0}}
    return {
        f.model_type: config_to_hf(
            bertblocks.load_config({"model_type": f.model_type, **required.get(f.model_type, {})})
        )
        for f in known_families()
    }


FAMILY_CONFIGS = _family_configs()
#: fields some family reads that its default config.json does not spell out
EXTRA_FIELDS = ["layer_types", "embedding_size", "num_hidden_groups", "inner_group_num", "id2label", "label2id",
                "num_labels", "torch_dtype", "dtype", "position_embedding_type", "rope_theta", "rotary_emb_fraction",
                "global_attn_every_n_layers", "task_type_vocab_size", "use_task_id"]  # fmt: skip


@fuzz(400)
@given(family=st.sampled_from(sorted(FAMILY_CONFIGS)), data=st.data())
def test_any_config_json_field_of_any_family_loads_or_is_refused(family, data):
    base = FAMILY_CONFIGS[family]
    keys = sorted({*base, *EXTRA_FIELDS} - {"model_type"})
    changes = data.draw(st.dictionaries(st.sampled_from(keys), values, min_size=1, max_size=3))
    try:
        config = bertblocks.load_config({**base, **changes})
    except BertBlocksError:
        return  # ConfigError, LimitError: refused with the field
    with contextlib.suppress(LimitError):
        check_size(config)


# ------------------------------------------------------------------------------------------ weight indexes
index_values = st.one_of(
    values,
    st.fixed_dictionaries({"weight_map": st.dictionaries(st.text(max_size=8), values, max_size=4)}),
    st.fixed_dictionaries(
        {"weight_map": st.dictionaries(st.text(max_size=8), st.sampled_from(["model-1.safetensors", "x", "../a", ""]))}
    ),
)


@fuzz(150)
@given(index=st.one_of(index_values.map(json.dumps), st.binary(max_size=64)))
def test_any_shard_index_is_read_or_refused(tmp_path_factory, index):
    directory = tmp_path_factory.mktemp("index")
    save_file({"w": torch.ones(2)}, directory / "model-1.safetensors")
    path = directory / "model.safetensors.index.json"
    path.write_bytes(index if isinstance(index, bytes) else index.encode())
    try:
        tensors = read_state_dict(find_weights(directory))
    except (CheckpointError, FileNotFoundError):
        return
    assert set(tensors) <= {"w"}  # an empty weight_map names no shard: nothing read (loading reports it)
