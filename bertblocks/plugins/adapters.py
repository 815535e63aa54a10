"""Per-language adapters after the feed-forward block (X-MOD): BERT's feed-forward, then a bottleneck adapter chosen
per token by its language.

Data flow of one post-LN feed-forward sub-layer (transformers' ``XmodOutput`` and ``XmodLayer``, ``pre_norm:
false``)::

    h = dropout(dense(intermediate(x))) + x                                      [b, q, H]
    a = adapter_norm(h)              (own LayerNorm, or the sub-layer's LayerNorm reused, or h itself)
    out = dropout(adapter_lang(a)) + (a if ln_before_adapter else h)             adapter: dense2(act(dense1(·)))
    LayerNorm(out)

In a ``pre_ln`` layer (X-MOD's ``pre_norm: true``) the sub-layer's LayerNorm moves before the block and nothing
follows the adapters; the layer hands the output its feed-forward norm (``closes_residual``), which ``reuse`` applies
a second time::

    h = dropout(dense(intermediate(LayerNorm(x)))) + x
    a = adapter_norm(h)              (own LayerNorm, or that same LayerNorm again, or h itself)
    out = dropout(adapter_lang(a)) + (a if ln_before_adapter else h)

``lang`` is each token's language index into ``languages`` (the ``lang_ids`` input, one per sequence ``[b]``
expanded to its tokens, or ``[b, q]``; the ``default_language`` when omitted, or the only language of a model that
has one: transformers refuses a call without ``lang_ids`` there, bertblocks has nothing to choose between). A
packed batch carries each token's language with it (:class:`~bertblocks.core.encoder.LayerContext`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, PositiveInt
from torch import nn

from bertblocks.config import BertConfig, ConfigIssue
from bertblocks.config.specs import ComponentSpec
from bertblocks.core.component import Component
from bertblocks.core.interfaces import ExtraInput, FeedForward

from ..errors import InputError, InputTypeError
from .feedforward import BertIntermediate, BertOutput, _norm

#: the input choosing each sequence's (or token's) adapter (transformers' name)
LANGUAGE_INPUT = "lang_ids"


class AdapterOptions(BaseModel):
    """Options of the ``adapters`` feed-forward (transformers' XmodConfig fields in brackets)."""

    model_config = ConfigDict(extra="forbid")

    languages: list[str] = Field(
        default_factory=lambda: ["en_XX"],
        min_length=1,
        description="one adapter per language, in this order (languages)",
    )
    default_language: str | None = Field(
        None, description="the language of inputs without lang_ids (default_language); null: lang_ids are required"
    )
    reduction_factor: PositiveInt = Field(
        2, description="adapter bottleneck = hidden_size // reduction_factor (adapter_reduction_factor)"
    )
    adapter_norm: Literal["reuse", "own", "none"] = Field(
        "reuse",
        description="the norm before the adapters: reuse, the sub-layer's LayerNorm (adapter_reuse_layer_norm); own, "
        "a LayerNorm shared by the adapters, output.adapter_layer_norm (adapter_layer_norm); none",
    )
    ln_before_adapter: bool = Field(
        True, description="the adapter's residual is taken after that norm; false: before it (ln_before_adapter)"
    )


class LanguageAdapter(nn.Module):
    """transformers' ``XmodAdapter``: ``dense2(act(dense1(x)))`` through a bottleneck."""

    def __init__(self, hidden_size: int, bottleneck: int, activation: nn.Module) -> None:
        super().__init__()
        self.dense1 = nn.Linear(hidden_size, bottleneck)
        self.dense2 = nn.Linear(bottleneck, hidden_size)
        self.adapter_act_fn = activation

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dense2(self.adapter_act_fn(self.dense1(hidden_states)))


class AdapterOutput(BertOutput):
    """BERT's feed-forward output with X-MOD's language adapters after its residual (see the module): before its
    LayerNorm (post-LN), or ending the sub-layer (pre-LN, ``post_norm`` false)."""

    extra_inputs = (LANGUAGE_INPUT,)
    closes_residual = True

    def __init__(
        self,
        intermediate_size: int,
        hidden_size: int,
        layer_norm_eps: float,
        dropout: float,
        options: AdapterOptions,
        activation: Callable[[], nn.Module],
        norm: nn.Module | str | None,
    ) -> None:
        super().__init__(intermediate_size, hidden_size, layer_norm_eps, dropout, norm)
        self.languages = tuple(options.languages)
        self.default_language = options.default_language
        self.adapter_norm = options.adapter_norm
        self.ln_before_adapter = options.ln_before_adapter
        if options.adapter_norm == "own":
            self.adapter_layer_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)  # transformers' key
        bottleneck = hidden_size // options.reduction_factor
        # transformers' keys: output.adapter_modules.<language>.dense1 …
        self.adapter_modules = nn.ModuleDict(
            {language: LanguageAdapter(hidden_size, bottleneck, activation()) for language in self.languages}
        )

    def forward(  # type: ignore[override]
        self,
        intermediate: torch.Tensor,
        residual: torch.Tensor,
        lang_ids: torch.Tensor | None = None,
        norm: nn.Module | None = None,
    ) -> torch.Tensor:
        """``norm``: the pre-LN layer's feed-forward norm (what ``reuse`` applies there); post-LN, the output's own."""
        hidden = self.dropout(self.dense(intermediate)) + residual  # [b, q, H]
        normed = hidden
        if self.adapter_norm == "own":
            normed = self.adapter_layer_norm(hidden)
        elif self.adapter_norm == "reuse":
            reused = self.LayerNorm if self.post_norm else norm
            if reused is None:  # an internal invariant: a pre-LN layer always hands its norm (closes_residual)
                raise InputError("the adapters reuse the feed-forward's norm: a pre-LN layer passes it as norm")
            normed = reused(hidden)
        if lang_ids is None:  # called on its own (not by a backbone, which always prepares them): every token alike
            adapted = self.adapter_modules[self._default_or_refuse()](normed)
        else:
            adapted = torch.zeros_like(normed)
            compiling = torch.compiler.is_compiling()
            for index, language in enumerate(self.languages):
                rows = lang_ids == index  # [b, q]
                adapter = self.adapter_modules[language]
                if compiling:  # no data-dependent shapes in a graph: every token through every adapter, then chosen
                    adapted = torch.where(rows[..., None], adapter(normed), adapted)
                else:  # only this language's tokens (what transformers computes)
                    adapted[rows] = adapter(normed[rows])
        out = self.dropout(adapted) + (normed if self.ln_before_adapter else hidden)
        return self.LayerNorm(out) if self.post_norm else out

    def _default_or_refuse(self) -> str:
        """The language of inputs without ``lang_ids``: the ``default_language``, or the only language there is."""
        if self.default_language is not None:
            return self.default_language
        if len(self.languages) == 1:
            return self.languages[0]
        raise InputError(
            "this model has per-language adapters and no default language: pass lang_ids (indices into "
            f"languages {list(self.languages)}), or call model.set_default_language(...)"
        )

    def set_default_language(self, language: str) -> None:
        """The language of inputs without ``lang_ids`` (what the model's ``set_default_language`` sets in each layer).

        Raises:
            InputError: ``language`` has no adapter here.
        """
        if language not in self.languages:
            raise InputError(f"this model has no adapter for {language!r}; its languages are {list(self.languages)}")
        self.default_language = language

    def extra_input_specs(self) -> tuple[ExtraInput, ...]:
        """``lang_ids`` as transformers takes it: one language index per sequence, ``[batch]`` (the example cycles
        through the languages)."""
        languages = len(self.languages)
        return (ExtraInput(LANGUAGE_INPUT, ("batch",), torch.long, lambda batch, _: torch.arange(batch) % languages),)

    def prepare_extra_inputs(
        self, inputs: Mapping[str, torch.Tensor], batch: int, length: int, device: torch.device
    ) -> dict[str, torch.Tensor]:
        """``lang_ids`` → ``[batch, length]`` language indices: integer ``[batch]`` (one per sequence, as transformers
        takes them), ``[1]`` (one for all) or ``[batch, length]``, each in ``[0, len(languages))``; omitted, the
        ``default_language`` (an error naming both ways out when there is none)."""
        ids = inputs.get(LANGUAGE_INPUT)
        if ids is None:
            index = self.languages.index(self._default_or_refuse())
            return {LANGUAGE_INPUT: torch.full((batch, length), index, dtype=torch.long, device=device)}
        if not isinstance(ids, torch.Tensor):
            raise InputTypeError(f"lang_ids must be a tensor of language indices; got {type(ids).__name__}")
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise InputTypeError(f"lang_ids must be an integer tensor (torch.long); got {ids.dtype}")
        if tuple(ids.shape) in ((batch,), (1,)):
            ids = ids[:, None].expand(batch, length)
        elif tuple(ids.shape) != (batch, length):
            raise InputError(
                f"lang_ids must be [batch] = ({batch},) (one language per sequence), [1] or [batch, seq] = "
                f"{(batch, length)}; got shape {tuple(ids.shape)}"
            )
        if not torch.compiler.is_compiling() and ids.numel() and (ids.min() < 0 or ids.max() >= len(self.languages)):
            bad = ids[(ids < 0) | (ids >= len(self.languages))][0].item()
            raise InputError(
                f"lang_ids hold {bad}, not the index of one of the {len(self.languages)} languages "
                f"{list(self.languages)}"
            )
        return {LANGUAGE_INPUT: ids.to(device)}


def build_adapter_feedforward(
    *,
    hidden_size: int,
    intermediate_size: int,
    activation: Callable[[], nn.Module],
    dropout: float,
    layer_norm_eps: float,
    options: AdapterOptions,
    norm: Callable[[], nn.Module] | str | None = "layernorm",
) -> FeedForward:
    """The feed-forward with adapters; ``norm``: the post-LN sub-layer's norm (a factory, or ``"layernorm"``), or
    ``None`` in a pre-LN layer (which normalises the block's input and hands the output that norm)."""
    output = AdapterOutput(
        intermediate_size,
        hidden_size,
        layer_norm_eps,
        dropout,
        options,
        activation,
        _norm(norm, hidden_size, layer_norm_eps),
    )
    return FeedForward(intermediate=BertIntermediate(hidden_size, intermediate_size, activation()), output=output)


def check_adapters(config: BertConfig, spec: ComponentSpec, loc: str) -> list[ConfigIssue]:
    """The adapters follow the sub-layer's residual in a post-LN layer (X-MOD's ``pre_norm: false``) or a pre-LN one
    (``pre_norm: true``), with LayerNorms; their bottleneck has at least one unit; each language once, the default
    one of them."""
    issues = []
    if config.encoder.layer.name not in ("post_ln", "pre_ln") or config.encoder.norm.name != "layernorm":
        issues.append(
            ConfigIssue(
                f"{loc}.name",
                "the adapters feed-forward needs layer post_ln (X-MOD's pre_norm: false) or pre_ln (pre_norm: true) "
                f"with norm layernorm; got layer {config.encoder.layer.name}, norm {config.encoder.norm.name}",
            )
        )
    languages = list(getattr(spec, "languages", ["en_XX"]))
    default = getattr(spec, "default_language", None)
    if len(set(languages)) != len(languages):
        issues.append(ConfigIssue(f"{loc}.languages", f"{languages} name a language twice"))
    if default is not None and default not in languages:
        issues.append(ConfigIssue(f"{loc}.default_language", f"{default!r} is not one of languages {languages}"))
    factor = getattr(spec, "reduction_factor", 2)
    if isinstance(factor, int) and factor > config.hidden_size:
        issues.append(
            ConfigIssue(
                f"{loc}.reduction_factor",
                f"{factor} leaves the adapters no bottleneck (hidden_size {config.hidden_size} // {factor} = 0)",
            )
        )
    return issues


def bertblocks_register_components() -> list[Component]:
    return [
        Component(
            "feedforward",
            "adapters",
            build_adapter_feedforward,
            AdapterOptions,
            description="X-MOD: BERT's feed-forward, then a per-language bottleneck adapter (lang_ids) before its norm",
            validate=check_adapters,
        )
    ]
