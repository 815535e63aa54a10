"""Reading and writing HF BERT checkpoints: safetensors (single or sharded) first, ``pytorch_model.bin``
only through ``torch.load(weights_only=True)``.

Key handling, in one place:

* ``bert.`` prefix — task checkpoints prefix the backbone with ``bert.``; a backbone-only model strips it.
* legacy names — ``LayerNorm.gamma`` / ``LayerNorm.beta`` (old Google conversions) read as ``weight`` / ``bias``.
* stale buffers — ``embeddings.position_ids`` (written before transformers 4.31) is ignored.
* scheme leftovers — keys a position scheme declares unused (transformers 4.x writes an absolute position
  table even for relative models) are ignored.

Anything else that does not fit is reported by name: a backbone weight the config cannot use (say a
``distance_embedding`` while positions are absolute) or a tensor of the wrong shape is an error, never a
silently wrong model.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..atomic import Writer, finish_interrupted_save, replace_files
from ..errors import BertBlocksError, InputError
from .weight_files import WeightFileError, read_safetensors, read_weight_file, write_safetensors

logger = logging.getLogger("bertblocks")

SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
BIN_WEIGHTS = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"
#: buffers older transformers wrote to checkpoints; never weights
STALE_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
#: module prefixes of the backbone: a checkpoint key here that the model lacks means the architectures differ
BACKBONE_PREFIXES = ("embeddings.", "encoder.")


class CheckpointError(BertBlocksError, ValueError):
    """A checkpoint that does not fit the model built from its config; the message names every key."""


@dataclass
class LoadingInfo:
    """What happened to every key, as transformers' ``output_loading_info`` reports it.

    Attributes:
        missing_keys: model weights the checkpoint lacked (left as initialised).
        unexpected_keys: checkpoint weights the model has no place for (not loaded).
        mismatched_keys: ``(key, checkpoint shape, model shape)``.
        ignored_keys: known leftovers dropped on purpose (stale buffers, unused scheme tables).
    """

    missing_keys: list[str] = field(default_factory=list)
    unexpected_keys: list[str] = field(default_factory=list)
    mismatched_keys: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    ignored_keys: list[str] = field(default_factory=list)


class WeightsNotFoundError(BertBlocksError, FileNotFoundError):
    """A checkpoint directory without weight files, or whose shard index names shards that are missing."""


def find_weights(directory: Path) -> list[Path]:
    """The weight files of a checkpoint directory, safetensors preferred; shards in index order.

    A save that was interrupted after its commit is finished first
    (:func:`bertblocks.atomic.finish_interrupted_save`), so the files found are those of one checkpoint.

    Raises:
        WeightsNotFoundError: no weights, or an index naming a shard that is missing.
        CheckpointError: an index that is not one (malformed, a tensor named twice, a shard that is not a
            plain file name, or a ``.safetensors`` index naming a shard of another format).
    """
    finish_interrupted_save(directory)
    for name, index in ((SAFE_WEIGHTS, SAFE_INDEX), (BIN_WEIGHTS, BIN_INDEX)):
        if (directory / name).is_file():
            return [directory / name]
        if (directory / index).is_file():
            try:
                weight_map = json.loads((directory / index).read_text(), object_pairs_hook=_unique_keys)["weight_map"]
                shards = list(dict.fromkeys(weight_map.values()))
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise CheckpointError(f"{directory / index} is not a shard index with a weight_map ({e})") from None
            # a shard is a file beside the index, never a path out of the checkpoint (`../../secret`)
            outside = [s for s in shards if not isinstance(s, str) or Path(s).name != s or s in ("", ".", "..")]
            if outside:
                raise CheckpointError(f"{directory / index} names shards that are not file names: {outside}")
            if index == SAFE_INDEX:
                # a safetensors index never leads to unpickling: every shard must be safetensors
                foreign = [s for s in shards if not s.endswith(".safetensors")]
                if foreign:
                    raise CheckpointError(
                        f"{directory / index} names shards that are not .safetensors files: {foreign}; refused "
                        "(a .bin shard would be unpickled)"
                    )
            missing = [s for s in shards if not (directory / s).is_file()]
            if missing:
                raise WeightsNotFoundError(f"{directory / index} names shards that are missing: {missing}")
            return [directory / s for s in shards]
    raise WeightsNotFoundError(
        f"no weights in {directory}: expected {SAFE_WEIGHTS}, {SAFE_INDEX}, {BIN_WEIGHTS} or {BIN_INDEX}"
    )


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise InputError(f"{key!r} is named twice")
        out[key] = value
    return out


def read_state_dict(files: Iterable[Path]) -> dict[str, torch.Tensor]:
    """Every tensor of the given files: safetensors validated and memory-mapped, ``.bin`` through ``torch.load``
    with ``weights_only=True`` (no code runs); see :mod:`bertblocks.hf.weight_files`.

    Shards (several files) must be safetensors or ``.bin`` throughout, as their suffix says: a ``.safetensors``
    file is always read as safetensors, never unpickled.

    Raises:
        CheckpointError: a damaged, malformed or refused file, naming the file and the tensor; or a tensor
            found in two files, naming both.
    """
    state: dict[str, torch.Tensor] = {}
    where: dict[str, Path] = {}
    for path in files:
        try:
            tensors = read_weight_file(path)
        except WeightFileError as e:
            raise CheckpointError(str(e)) from e
        twice = [name for name in tensors if name in where]
        if twice:
            raise CheckpointError(
                f"tensor {twice[0]!r} is in two shards, {where[twice[0]]} and {path}"
                + (f" (and {len(twice) - 1} more tensors)" if len(twice) > 1 else "")
                + "; a checkpoint holds each tensor once"
            )
        state.update(tensors)
        where.update(dict.fromkeys(tensors, path))
    return state


def map_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, its header validated first, as views of a private memory map of it
    (no copy; see :func:`bertblocks.hf.weight_files.read_safetensors`).

    Raises:
        CheckpointError: a file that is not valid safetensors (naming the file and the tensor).
    """
    try:
        return read_safetensors(path)
    except WeightFileError as e:
        raise CheckpointError(str(e)) from e


def tied_parameters(model: torch.nn.Module) -> dict[str, str]:
    """Names under which a parameter appears a second time (tied weights) → its first name.

    ``{"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.bias":
    "cls.predictions.bias"}`` for a tied masked-LM model; first in state-dict order is the name that is stored.
    """
    first: dict[int, str] = {}
    tied: dict[str, str] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if id(parameter) in first:
            tied[name] = first[id(parameter)]
        else:
            first[id(parameter)] = name
    return tied


def untied_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` without the second names of tied parameters: what a checkpoint stores.

    transformers writes a tied masked-LM model without ``cls.predictions.decoder.{weight,bias}`` and re-ties
    them on load; so do we.
    """
    tied = tied_parameters(model)
    return {k: v for k, v in model.state_dict().items() if k not in tied}


def match_state_dict(
    model: torch.nn.Module,
    state: Mapping[str, torch.Tensor],
    ignorable: Iterable[str] = (),
    required_prefixes: tuple[str, ...] = BACKBONE_PREFIXES,
    strict: bool = True,
    *,
    prefix: str = "",
) -> tuple[dict[str, torch.Tensor], LoadingInfo]:
    """Decide, key by key, what of ``state`` goes into ``model``.

    Args:
        model: what the weights go into.
        state: the checkpoint's tensors, keys already normalised to the model's (legacy names, prefix).
        ignorable: keys known to be unused (a position scheme's leftovers), dropped without complaint.
        required_prefixes: the backbone's module prefixes, whose weights must all be present (``strict``).
        strict: missing backbone weights are an error.
        prefix: where the backbone sits in ``model`` (``"bert."`` in a task model); applied to the stale
            buffers and ``required_prefixes``.

    Tied parameters are loaded once, under their first name: a checkpoint need not hold the second name
    (transformers does not write it) and, if it does, that copy is ignored, as transformers re-ties after
    loading.

    Returns the tensors to load and a :class:`LoadingInfo`.

    Raises:
        CheckpointError: shape mismatches; backbone weights the model lacks (another architecture); and,
            when ``strict``, backbone weights missing from the checkpoint. Pooler or head weights that are
            missing or unexpected are only reported, as transformers does.
    """
    tied = tied_parameters(model)
    expected = {k: v for k, v in model.state_dict().items() if k not in tied}
    ignorable = set(ignorable) | {prefix + key for key in STALE_BUFFERS} | set(tied)
    required_prefixes = tuple(prefix + p for p in required_prefixes)
    info = LoadingInfo()
    loadable: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if key not in expected:
            (info.ignored_keys if key in ignorable else info.unexpected_keys).append(key)
        elif tuple(tensor.shape) != tuple(expected[key].shape):
            info.mismatched_keys.append((key, tuple(tensor.shape), tuple(expected[key].shape)))
        else:
            loadable[key] = tensor
    info.missing_keys = [k for k in expected if k not in state]

    problems = []
    if info.mismatched_keys:
        problems.append(
            "shape mismatch (checkpoint vs model): "
            + "; ".join(f"{k}: {tuple(a)} vs {tuple(b)}" for k, a, b in info.mismatched_keys)
        )
    foreign = [k for k in info.unexpected_keys if k.startswith(required_prefixes)]
    if foreign:
        problems.append("weights this config has no place for (is the architecture the same?): " + ", ".join(foreign))
    missing_backbone = [k for k in info.missing_keys if k.startswith(required_prefixes)]
    if strict and missing_backbone:
        problems.append("weights missing from the checkpoint: " + ", ".join(missing_backbone))
    if problems:
        raise CheckpointError("checkpoint does not fit the model:\n  " + "\n  ".join(problems))
    return loadable, info


def write_checkpoint(
    directory: Path,
    state: Mapping[str, torch.Tensor],
    config_json: Mapping[str, object],
    safe_serialization: bool = True,
    max_shard_size: int | None = None,
) -> list[Path]:
    """Write ``config.json`` and the weights (safetensors by default, sharded above ``max_shard_size`` bytes),
    replacing the checkpoint the folder held as one (:func:`bertblocks.atomic.replace_files`): after a kill
    at any step a load finds the old checkpoint or the new one, never a mix.

    Weight files of the earlier checkpoint that the new one does not use (a ``model.safetensors`` when
    saving sharded or as ``.bin``, shards of a larger earlier save) are removed, as transformers does, so
    that none of them is loaded instead of the new weights. Other files (a tokenizer, a README) stay.

    Tensors are written contiguous and unshared, as safetensors requires. Tied parameters should be left out
    by the caller (:func:`untied_state_dict`); any other tensors that still share storage are copied.

    Raises:
        WriteError: the folder is a file, or cannot be written (read-only, disk full); nothing changed.
    """
    owners = Counter(v.untyped_storage().data_ptr() for v in state.values())
    tensors = {
        k: v.detach().contiguous().clone() if owners[v.untyped_storage().data_ptr()] > 1 else v.detach().contiguous()
        for k, v in state.items()
    }
    shards = _split(tensors, max_shard_size)
    suffix = "safetensors" if safe_serialization else "bin"
    single = SAFE_WEIGHTS if safe_serialization else BIN_WEIGHTS
    files: dict[str, Writer] = {}
    weight_map = {}
    for i, shard in enumerate(shards):
        name = single if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.{suffix}"
        if not safe_serialization:
            name = name.replace("model-", "pytorch_model-") if len(shards) > 1 else name
        files[name] = _shard_writer(shard, safe_serialization)
        weight_map.update(dict.fromkeys(shard, name))
    config_text = json.dumps(dict(config_json), indent=2, sort_keys=True) + "\n"
    files["config.json"] = lambda f: f.write(config_text.encode("utf-8"))
    commit = single
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
            "weight_map": dict(sorted(weight_map.items())),
        }
        commit = SAFE_INDEX if safe_serialization else BIN_INDEX
        index_text = json.dumps(index, indent=2) + "\n"
        files[commit] = lambda f: f.write(index_text.encode("utf-8"))
    directory = Path(directory)
    if directory.is_dir():
        finish_interrupted_save(directory)  # what the folder holds now, before deciding what is stale
    old = weight_files_of(directory) if directory.is_dir() else []
    entry_points = [n for n in ENTRY_POINTS if n in old]
    written = replace_files(
        directory,
        files,
        commit=commit,
        remove_first=entry_points,
        remove_after=[n for n in old if n not in files and n not in entry_points],
    )
    return [path for path in written if path.name in weight_map.values()]


def _shard_writer(shard: Mapping[str, torch.Tensor], safe: bool) -> Writer:
    if safe:
        return lambda f: write_safetensors(f, shard, {"format": "pt"})
    return lambda f: torch.save(dict(shard), f)


#: the names a reader looks for first (transformers' order of preference)
ENTRY_POINTS = (SAFE_WEIGHTS, SAFE_INDEX, BIN_WEIGHTS, BIN_INDEX)
#: shard names transformers writes (``model-00001-of-00003.safetensors``, ``pytorch_model-00001-of-00003.bin``)
SHARD_NAME = re.compile(r"(model|pytorch_model)-\d{5}-of-\d{5}\.(safetensors|bin)")


def weight_files_of(directory: Path) -> list[str]:
    """The weight files a folder holds: the entry points, files named like shards, and the weight files its
    indexes name (plain ``.safetensors``/``.bin`` names beside them). What a new save replaces or removes."""
    found = [name for name in ENTRY_POINTS if (directory / name).is_file()]
    found += sorted(p.name for p in directory.iterdir() if SHARD_NAME.fullmatch(p.name) and p.is_file())
    for index in (SAFE_INDEX, BIN_INDEX):
        try:
            named = json.loads((directory / index).read_text(encoding="utf-8"))["weight_map"].values()
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        found += [
            n
            for n in named
            if isinstance(n, str)
            and Path(n).name == n
            and n.endswith((".safetensors", ".bin"))
            and (directory / n).is_file()
        ]
    return list(dict.fromkeys(found))


def _split(tensors: Mapping[str, torch.Tensor], max_shard_size: int | None) -> list[dict[str, torch.Tensor]]:
    if not max_shard_size:
        return [dict(tensors)]
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_size:
            shards.append({})
            size = 0
        shards[-1][key] = tensor
        size += nbytes
    return shards
