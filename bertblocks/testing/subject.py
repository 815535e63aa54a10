"""What a conformance check works on: the component under test, the tiny model it is placed in, and the two
outcomes besides passing (:class:`ConformanceError`, :class:`ConformanceSkip`)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from ..config import ConfigError
from ..core.capabilities import PaddingReader
from ..core.component import Component
from ..errors import BertBlocksError
from ..hf.weights import LoadingInfo
from ..models.backbone import BertModel
from ..registry import BuildError, Registry, validate_config
from ..zoo import create_model

#: float32 tolerance, as for HF parity
ATOL = 1e-5

#: the tiny model every model-level check builds; dropout is non-zero so that eval/train differences show
TINY_CONFIG: dict[str, Any] = {
    "vocab_size": 99,
    "hidden_size": 32,
    "max_position_embeddings": 64,
    "type_vocab_size": 2,
    # a wide initialiser makes attention sharply non-uniform, so a wrong mask or position shows in the numbers
    "initializer_range": 0.2,
    "encoder": {"num_layers": 2, "attention": {"num_heads": 4}, "feedforward": {"intermediate_size": 37}},
}


class ConformanceError(BertBlocksError, AssertionError):
    """A component does not do what its interface promises."""


class ConformanceSkip(Exception):  # noqa: N818 - a skip, not an error
    """A check does not apply to this component; the message says why."""


@dataclass
class Subject:
    """The component under test and how to place it in a config.

    Attributes:
        component: the registered component.
        options: its plugin options for the tests (defaults of its options model when empty).
        registry: where the tiny models look components up.
        compile_backend: the ``torch.compile`` backend of :func:`check_compile`.
        base: changes merged over :data:`TINY_CONFIG` before the component is placed: the rest of the config
            the component needs (``{"position": "rope"}`` for an attention that requires rotary positions).
        reference: the plugin's own reference kernel for the numeric checks of a backend (called as a backend
            is); ``None``: the built-in ``eager`` kernel (softmax attention).
        packing: the path a check runs on: ``"never"`` (padded), ``"always"`` (packed) or ``None`` (the
            config's own ``encoder.packing``); set by the suite for checks that run on both paths.
    """

    component: Component
    options: dict[str, Any]
    registry: Registry
    compile_backend: str = "inductor"
    base: Mapping[str, Any] = field(default_factory=dict)
    reference: Any = None
    packing: str | None = None
    #: shared by the copies :meth:`on` makes (the same component): what :meth:`padding_readers` found
    _memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def on(self, packing: str | None) -> Subject:
        """This subject on a path: ``encoder.packing`` ``"never"`` (padded), ``"always"`` (packed)."""
        return replace(self, packing=packing)

    def padding_readers(self, length: int | None = None) -> list[PaddingReader]:
        """What in this component's tiny model declares reading padded positions (``str()``: ``path (Class)``; a
        head as ``head (Class)``): what ``encoder.packing: auto`` does not pack for. ``length``: only those that
        read them in a batch padded to that many tokens (a ``reads_padded_positions_above`` declaration reads
        them past its threshold only). Empty for a family."""
        if self.kind == "family":
            return []
        if "readers" not in self._memo:
            model = self.on(None).model()
            self._memo["readers"] = list(getattr(model, "bert", model).padding_readers)
        readers: list[PaddingReader] = self._memo["readers"]
        return [reader for reader in readers if length is None or reader.reads_at(length)]

    @property
    def kind(self) -> str:
        return self.component.kind

    @property
    def name(self) -> str:
        return self.component.name

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, **self.options}

    def config(self, **changes: Any) -> dict[str, Any]:
        """The tiny config (with :attr:`base` merged over it) with this component in its place, plus top-level
        ``changes``."""
        cfg = _merged(TINY_CONFIG, self.base)
        enc = cfg["encoder"]
        where = {
            "embedding": lambda: cfg.__setitem__("embedding", self.spec()),
            "position": lambda: cfg.__setitem__("position", self.spec()),
            "attention": lambda: enc["attention"].update(self.spec()),
            "backend": lambda: enc["attention"].__setitem__("backend", self.spec()),
            "feedforward": lambda: enc["feedforward"].update(self.spec()),
            "activation": lambda: enc["feedforward"].__setitem__("activation", self.name),
            "norm": lambda: enc.__setitem__("norm", self.spec()),
            "layer": lambda: enc.__setitem__("layer", self.spec()),
            "pooler": lambda: cfg.__setitem__("pooler", self.spec()),
            "head": lambda: cfg.__setitem__("head", self.spec()),
        }
        if self.kind == "family":
            # the family's own translation of the tiny config: a config the family can represent
            from ..hf.config_json import config_from_hf
            from ..hf.families import get_family

            family = get_family(self.name, self.registry, source=None)
            base = validate_config(cfg, self.registry)
            cfg = config_from_hf({**family.config_to_hf(base), "model_type": self.name}, self.registry)
        else:
            where[self.kind]()
        if self.packing is not None:
            cfg["encoder"]["packing"] = self.packing
        cfg.update(changes)
        return cfg

    def model(self, seed: int = 0, config: Mapping[str, Any] | None = None, **changes: Any) -> nn.Module:
        """A tiny model holding this component (a task model for a head), initialised from ``seed``, in eval
        mode; built from ``config`` when given, else from :meth:`config` with ``changes``."""
        torch.manual_seed(seed)
        cfg = dict(config) if config is not None else self.config(**changes)
        if self.kind == "head":
            return create_model(cfg, head=self.name, registry=self.registry).eval()
        return create_model(cfg, registry=self.registry).eval()

    def reload(self, directory: str) -> tuple[nn.Module, LoadingInfo]:
        """The model :meth:`model` saved to ``directory``, loaded back with its loading report."""
        if self.kind == "head":
            from ..models.task_models import BertTaskModel

            return BertTaskModel.from_pretrained(  # type: ignore[return-value]
                directory, head=self.name, registry=self.registry, output_loading_info=True
            )
        return BertModel.from_pretrained(directory, registry=self.registry, output_loading_info=True)  # type: ignore[return-value]

    def make(self, **kwargs: Any) -> Any:
        """Call the component's factory directly with validated options and ``kwargs``."""
        return self.component.factory(**kwargs, options=self.component.options.model_validate(self.options))

    def without_dropout(self, model: nn.Module) -> nn.Module:
        """The same model (``model``'s weights) built with every dropout probability at zero."""
        cfg = self.config(hidden_dropout_prob=0.0)
        cfg["encoder"]["attention"]["dropout"] = 0.0
        quiet = self.model(config=cfg)
        quiet.load_state_dict(model.state_dict())
        return quiet

    def decoder(self, seed: int = 0) -> nn.Module:
        """The tiny model built as a causal decoder (``is_decoder: true``), for the cache checks.

        Raises:
            ConformanceSkip: the component refuses to be a decoder: its ``validate`` hook rejects the decoder
                config while the same config as an encoder validates, or the build raises a ``BuildError``
                (a backend without causal support).
            ConfigError: the encoder config does not validate either: the component's own fault, not a skip.
        """
        cfg = self.config(is_decoder=True)
        try:
            validate_config(cfg, self.registry)
        except ConfigError as refusal:
            validate_config(self.config(), self.registry)  # raises if the encoder config is broken too
            raise ConformanceSkip(f"refuses to be a decoder at validate: {refusal}") from None
        try:
            return self.model(seed, config=cfg)
        except BuildError as e:
            raise ConformanceSkip(f"cannot be built as a decoder: {e}") from None


def _merged(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` merged in, nested mappings key by key (a copy; neither input changes)."""
    out = copy.deepcopy(dict(base))
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
