"""The root of the config: a whole BERT, its sizes, components, labels and family.

Structural validation (this package) and component validation (the registry) are two phases of the one
:func:`bertblocks.load_config`; both report every problem at once, each with its dotted location.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, field_validator, model_validator

from ..errors import InputError
from .errors import ConfigIssue, FieldError
from .flat_view import FlatConfigView
from .limits import label_limit_issue
from .overrides import OVERRIDABLE, EncoderConfig
from .specs import (
    DEFAULT_COMPONENTS,
    Count,
    EmbeddingSpec,
    Flag,
    HeadSpec,
    NonNegativeCount,
    PoolerSpec,
    PositionSpec,
    Probability,
    Real,
)


# ---------------------------------------------------------------------------------------------- the root
class BertConfig(FlatConfigView, BaseModel):
    """A whole BERT: vocabulary and sizes, the components and their options.

    Field names shared with HF's ``BertConfig`` keep HF's names (``vocab_size``, ``layer_norm_eps``, …);
    the components are nested. transformers' flat names (``num_hidden_layers``, ``to_dict()``, ``get()``,
    ``model_type``) read and write the same fields (:class:`~bertblocks.config.flat_view.FlatConfigView`).
    The config knows no checkpoint format: :func:`bertblocks.hf.config_json.config_from_hf` and
    :func:`~bertblocks.hf.config_json.config_to_hf` translate a ``config.json`` through the model's family.
    """

    # inf and NaN are never meaningful sizes, rates or epsilons (`layer_norm_eps: .inf` would give NaN outputs)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    vocab_size: Count = Field(30522, description="token vocabulary size")
    hidden_size: Count = Field(768, description="width of every hidden state")
    max_position_embeddings: Count = Field(512, description="longest sequence (positions 0..n-1)")
    type_vocab_size: NonNegativeCount = Field(
        2, description="token types (segments); 0: no token-type table, token_type_ids are ignored"
    )
    pad_token_id: NonNegativeCount | None = Field(0, description="padding token; its embedding starts at zero")
    layer_norm_eps: Annotated[Real, Field(gt=0)] = Field(1e-12, description="LayerNorm epsilon")
    hidden_dropout_prob: Probability = Field(0.1, description="dropout on embeddings and sub-layer outputs")
    initializer_range: Annotated[Real, Field(gt=0)] = Field(0.02, description="std of the normal initialiser")
    embedding: EmbeddingSpec = Field(default_factory=EmbeddingSpec)
    position: PositionSpec = Field(default_factory=PositionSpec)
    encoder: EncoderConfig = Field(default_factory=EncoderConfig)
    pooler: PoolerSpec | None = Field(default_factory=PoolerSpec, description="null for no pooler")
    is_decoder: Flag = Field(False, description="causal self-attention (a decoder, as HF's is_decoder)")
    add_cross_attention: Flag = Field(False, description="decoder layers also attend to encoder states")
    use_cache: Flag = Field(True, description="decoders return a key/value cache by default")
    tie_word_embeddings: Flag = Field(True, description="LM decoder weight is the token embedding table")
    head: HeadSpec | None = Field(None, description="task head by name (null: a bare backbone)")
    num_labels: Count = Field(2, description="classifier outputs; derived from id2label when that is given")
    id2label: dict[int, Annotated[str, Strict()]] | None = Field(
        None, description="label names; default LABEL_0..LABEL_{n-1}"
    )
    label2id: dict[str, Annotated[int, Strict()]] | None = Field(
        None, description="inverse of id2label; derived when omitted"
    )
    problem_type: Literal["regression", "single_label_classification", "multi_label_classification"] | None = Field(
        None, description="sequence-classification loss; inferred from labels when unset, as HF does"
    )
    classifier_dropout: Probability | None = Field(
        None, description="dropout before classifier heads; hidden_dropout_prob when null"
    )
    pruned_heads: dict[int, list[Annotated[int, Strict()]]] = Field(
        default_factory=dict, description="heads removed per layer; re-applied before weights are loaded"
    )
    family: Annotated[str, Strict()] = Field(
        DEFAULT_COMPONENTS["family"],
        description="the model family (HF model_type) whose config.json and checkpoint format this model "
        "loads and saves; bertblocks-hybrid for a model no transformers class describes",
    )
    hf: dict[str, Any] = Field(
        default_factory=dict,
        description="fields of an HF config.json that bertblocks does not model, kept for the round trip",
    )

    @property
    def model_type(self) -> str:
        """transformers' ``model_type``: the family's (a RoBERTa model answers its family's), as config.json has it."""
        return self.family

    @field_validator("hf")
    @classmethod
    def _json_values(cls, value: dict[str, Any]) -> dict[str, Any]:
        # written into config.json as they are: a value JSON cannot hold is refused now, not when saving
        problem = json_value_problem(value)
        if problem is not None:
            raise InputError(problem)
        return value

    @field_validator("id2label", mode="before")
    @classmethod
    def _label_keys(cls, value: Any) -> Any:
        if isinstance(value, Mapping):  # JSON keys are strings
            return {int(k) if isinstance(k, str) and k.lstrip("-").isdigit() else k: v for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _labels(self) -> BertConfig:
        # HF derives num_labels from id2label; both given and disagreeing is an error, not a silent pick.
        if self.id2label is None:
            too_many = label_limit_issue(self.num_labels)  # before a name is made for each label
            if too_many:
                raise FieldError("num_labels", too_many)
            object.__setattr__(self, "id2label", {i: f"LABEL_{i}" for i in range(self.num_labels)})
        elif "num_labels" in self.model_fields_set and len(self.id2label) != self.num_labels:
            raise FieldError("num_labels", f"is {self.num_labels} but id2label names {len(self.id2label)} labels")
        else:
            object.__setattr__(self, "num_labels", len(self.id2label))
        assert self.id2label is not None
        if sorted(self.id2label) != list(range(len(self.id2label))):
            raise FieldError("id2label", f"keys must be 0..{len(self.id2label) - 1}; got {sorted(self.id2label)}")
        inverse = {name: i for i, name in self.id2label.items()}
        if self.label2id is None:
            object.__setattr__(self, "label2id", inverse)
        elif self.label2id != inverse:
            raise FieldError("label2id", "is not the inverse of id2label")
        return self

    @field_validator("pruned_heads", mode="before")
    @classmethod
    def _int_keys(cls, value: Any) -> Any:
        # JSON object keys are strings; HF casts them back to int the same way.
        if isinstance(value, Mapping):
            return {int(k) if isinstance(k, str) and k.lstrip("-").isdigit() else k: v for k, v in value.items()}
        return value

    # ---------------------------------------------------------------------------- cross-field checks
    def consistency_issues(self) -> list[ConfigIssue]:
        """Problems no single field shows: head counts, layer ranges, pruned heads."""
        issues: list[ConfigIssue] = []
        enc = self.encoder
        if self.hidden_size % enc.attention.num_heads:
            issues.append(ConfigIssue("encoder.attention.num_heads", f"must divide hidden_size {self.hidden_size}"))
        if self.pad_token_id is not None and self.pad_token_id >= self.vocab_size:
            issues.append(
                ConfigIssue(
                    "pad_token_id",
                    f"must be below vocab_size {self.vocab_size} (it is {self.pad_token_id}); a smaller vocabulary "
                    "needs its own pad_token_id too (e.g. pad_token_id=0), or start from a tiny-* preset",
                )
            )
        for j, override in enumerate(enc.overrides):
            outside = [i for i in override.layers if not 0 <= i < enc.num_layers]
            if outside:
                issues.append(
                    ConfigIssue(
                        f"encoder.overrides.{j}.layers",
                        f"layers {outside} do not exist (num_layers is {enc.num_layers})",
                    )
                )
            heads = (override.attention or {}).get("num_heads")
            if isinstance(heads, int) and heads > 0 and self.hidden_size % heads:
                issues.append(
                    ConfigIssue(
                        f"encoder.overrides.{j}.attention.num_heads",
                        f"must divide hidden_size {self.hidden_size}",
                    )
                )
        issues.extend(self._sharing_issues())
        for layer, heads in self.pruned_heads.items():
            loc = f"pruned_heads.{layer}"
            if not 0 <= layer < enc.num_layers:
                issues.append(ConfigIssue(loc, f"layer {layer} does not exist (num_layers is {enc.num_layers})"))
                continue
            try:
                n = enc.layer_specs(layer)[0].num_heads
            except ValidationError:
                continue  # reported where the override is checked
            bad = [h for h in heads if not 0 <= h < n]
            if bad:
                issues.append(ConfigIssue(loc, f"heads {bad} do not exist (the layer has {n} heads)"))
            elif len(set(heads)) >= n:
                issues.append(ConfigIssue(loc, f"cannot prune all {n} heads of a layer"))
        return issues

    def _sharing_issues(self) -> list[ConfigIssue]:
        """Layers that share weights must be built the same way: one module serves them all."""
        enc = self.encoder
        groups = enc.num_layer_groups
        if groups is None:
            return []
        if groups > enc.num_layers:
            return [ConfigIssue("encoder.num_layer_groups", f"is {groups}, more than num_layers {enc.num_layers}")]
        # Only a layer an override names can differ from the layers of its group; comparing those (and, for a
        # group whose first layer is named, its first layer no override names) finds the first difference a
        # walk over every layer would, in time that does not grow with num_layers (10^9 layers would hang).
        named = {i for o in enc.overrides for i in o.layers if 0 <= i < enc.num_layers}
        candidates = set(named)
        for group in {enc.layer_group(i) for i in named}:
            start, stop = _group_bounds(group, groups, enc.num_layers)
            plain = next((i for i in range(start + 1, stop) if i not in named), None)  # at most len(named) steps
            if plain is not None:
                candidates.add(plain)
        for index in sorted(candidates):
            group = enc.layer_group(index)
            first = _group_bounds(group, groups, enc.num_layers)[0]
            if first == index:
                continue
            for key in OVERRIDABLE:
                base = self.position if key == "position" else None
                try:
                    ours, theirs = enc.layer_spec(index, key, base), enc.layer_spec(first, key, base)
                except ValidationError:
                    continue  # reported where the override is checked
                if ours != theirs:
                    culprit = next(
                        j
                        for j, o in enumerate(enc.overrides)
                        if o.changes(key) and (index in o.layers) != (first in o.layers)
                    )
                    return [
                        ConfigIssue(
                            f"encoder.overrides.{culprit}",
                            f"changes {key} of layer {index} but not of layer {first}, yet both share the weights of "
                            f"group {group} (num_layer_groups: {groups}); shared layers must be built alike",
                        )
                    ]
        return []


def _group_bounds(group: int, groups: int, num_layers: int) -> tuple[int, int]:
    """The layers ``[start, stop)`` of weight group ``group``: those with ``i · groups // num_layers == group``."""
    return -(-group * num_layers // groups), -(-(group + 1) * num_layers // groups)


def json_value_problem(value: Any, path: str = "", finite: bool = True) -> str | None:
    """Why ``value`` is not a JSON value (``"datetime.date(2020, 1, 1) at a.b is a date, …"``), or ``None``.

    JSON values: strings, ints, finite floats, booleans, null, lists, and mappings with string keys (or int
    keys, as YAML and the label tables write them). Dates, sets, bytes and other objects are not. With
    ``finite=False`` an infinite or NaN float passes (the schema refuses it where a field is typed, saying so).
    """
    where = f" at {path}" if path else ""
    if value is None or isinstance(value, str | bool | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) or not finite else f"{value!r}{where} is not a JSON number"
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            problem = json_value_problem(item, f"{path}.{i}" if path else str(i), finite)
            if problem is not None:
                return problem
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str | int) or isinstance(key, bool):
                return f"the key {key!r}{where} is a {type(key).__name__}, not a string"
            problem = json_value_problem(item, f"{path}.{key}" if path else str(key), finite)
            if problem is not None:
                return problem
        return None
    kind = type(value).__name__
    return f"{value!r}{where} is a {kind}, not a JSON value (string, number, boolean, null, list or mapping)"
