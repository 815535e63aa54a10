"""MobileBERT's components: the ``trigram`` embedding, the ``bottleneck`` layer and the masked-LM heads whose decoder
is the narrow token table widened by a dense block (``bottleneck_masked_lm``, ``bottleneck_pretraining``).

* embedding ``trigram``: a narrow token table (``embedding_size``); with ``trigram: true`` each position's token
  embedding is concatenated with its right and left neighbours' (zeros past the ends: a kernel-3 convolution),
  then ``embedding_transformation`` projects ``[3·E]`` (or ``[E]``) to the hidden size; position and token-type
  tables are hidden-wide and added after; then the norm (``layernorm`` or ``no_norm``) and dropout.
* layer ``bottleneck``: the residual stream is ``H`` wide, the layer works at ``intra_bottleneck_size`` ``W``::

      layer_input = bottleneck.input(x)                       # norm(dense(x)) [b, q, W]
      q/k input   = bottleneck.attention(x) (key_query_shared_bottleneck) or layer_input (use_bottleneck_attention)
      v input     = x (the attention's value_input_size = H) or layer_input
      a = attention.output.LayerNorm(attention(q/k input ⧺ v input) + layer_input)
      a = ffn[i](a) = norm(dense2(act(dense1(a))) + a)        # num_feedforward_networks - 1 times, no dropout
      o = output.LayerNorm(output.dense(act(intermediate(a))) + a)
      return output.bottleneck.LayerNorm(dropout(output.bottleneck.dense(o)) + x)   # [b, q, H]

  Without a bottleneck (``intra_bottleneck_size: null``) the layer is post-LN at width ``H`` with the stacked
  feed-forward blocks. The sub-layers are the configured attention, feed-forward and norm components, made at
  width ``W`` (``attention(None, hidden_size=W)``); their keys are transformers' (``attention.self.query``,
  ``ffn.0.output.LayerNorm``, ``output.bottleneck.dense``, ``bottleneck.input.LayerNorm``).
* heads ``bottleneck_masked_lm`` / ``bottleneck_pretraining``: BERT's transform, then logits
  ``t · [decoderᵀ; dense] + bias``, computed as ``decoder(t[:E]) + t[E:] · dense``, where ``decoder`` (``[vocab, E]``)
  is tied to the token table and ``dense`` (``[H - E, vocab]``, no bias) supplies the rest of the hidden width.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt
from torch import nn

from bertblocks.config import BertConfig, ComponentSpec
from bertblocks.core.component import Component
from bertblocks.core.interfaces import Attention, Embedding, FeedForward, Layer, LayerContext, Positions, PositionScheme
from bertblocks.core.outputs import BertForPreTrainingOutput, MaskedLMOutput

from ..errors import InputError
from .heads.bert import MASKED_LM_LOSS, PRETRAINING_LOSS
from .heads.composition import Branch, ComposedHead, HeadArguments, head_component
from .heads.projections import LMPrediction
from .heads.transforms import BERT_TRANSFORM, Steps, dense_act_norm
from .layers import run_feedforward, self_attend
from .norms import NoNorm

SublayerFactory = Callable[..., Any]


# ------------------------------------------------------------------------------------------------ embedding
class TrigramEmbeddingOptions(BaseModel):
    """Options of the ``trigram`` embedding (MobileBertConfig's names in brackets)."""

    model_config = ConfigDict(extra="forbid")

    embedding_size: PositiveInt = Field(128, description="width of the token table (embedding_size)")
    trigram: bool = Field(
        False,
        description="concatenate each token's embedding with its right and left neighbours' (trigram_input; "
        "MobileBERT's true). The last real token then reads the padding token's embedding, as transformers' does: "
        "a padded batch differs from each text alone there",
    )
    norm: Literal["layernorm", "no_norm"] = Field(
        "layernorm", description="the norm after the sum: layernorm or no_norm (normalization_type)"
    )
    norm_eps: PositiveFloat | None = Field(
        None,
        description="the LayerNorm's epsilon; null: layer_norm_eps (transformers' MobileBERT uses torch's 1e-5 "
        "here whatever layer_norm_eps says)",
    )


class TrigramEmbeddings(Embedding):
    """transformers' ``MobileBertEmbeddings``: ``word_embeddings`` ``[V, E]`` (→ trigram ``[3E]``) →
    ``embedding_transformation`` → ``+ position + token type`` (``[H]`` tables) → norm → dropout."""

    def __init__(
        self,
        *,
        vocab_size: int,
        hidden_size: int,
        type_vocab_size: int,
        pad_token_id: int | None,
        layer_norm_eps: float,
        dropout: float,
        position: PositionScheme,
        options: TrigramEmbeddingOptions,
    ) -> None:
        super().__init__()
        self.trigram = options.trigram
        self.word_embeddings = nn.Embedding(vocab_size, options.embedding_size, padding_idx=pad_token_id)
        table = position.embedding(hidden_size)
        if table is not None:
            self.position_embeddings = table
        self.has_position_table = table is not None
        self.has_token_types = type_vocab_size > 0
        if self.has_token_types:
            self.token_type_embeddings = nn.Embedding(type_vocab_size, hidden_size)
        # transformers projects whenever the widths differ or trigrams are on (its module exists either way)
        self.embedding_transformation = nn.Linear(options.embedding_size * (3 if self.trigram else 1), hidden_size)
        self.projects = self.trigram or options.embedding_size != hidden_size
        eps = options.norm_eps if options.norm_eps is not None else layer_norm_eps
        # CamelCase: transformers' key, whatever the norm kind
        self.LayerNorm: nn.Module = NoNorm(hidden_size) if options.norm == "no_norm" else nn.LayerNorm(hidden_size, eps)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("position_ids", torch.arange(position.max_positions)[None], persistent=False)

    def input_embeddings(self) -> nn.Embedding:
        return self.word_embeddings

    def forward(
        self,
        input_ids: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        past_length: int = 0,
    ) -> torch.Tensor:
        if inputs_embeds is None:
            if input_ids is None:
                raise InputError("pass input_ids or inputs_embeds")
            inputs_embeds = self.word_embeddings(input_ids)  # [b, q, E]
        b, q = inputs_embeds.shape[:2]
        if self.trigram:
            # a kernel-3 convolution written as a concatenation: [right neighbour, self, left neighbour], zeros
            # past the ends of the padded row (transformers' order and padding)
            right = nn.functional.pad(inputs_embeds[:, 1:], (0, 0, 0, 1))
            left = nn.functional.pad(inputs_embeds[:, :-1], (0, 0, 1, 0))
            inputs_embeds = torch.cat([right, inputs_embeds, left], dim=2)  # [b, q, 3E]
        embeddings = self.embedding_transformation(inputs_embeds) if self.projects else inputs_embeds  # [b, q, H]
        if self.has_position_table:
            if position_ids is None:
                position_ids = self.position_ids[:, past_length : past_length + q]
            embeddings = embeddings + self.position_embeddings(position_ids)
        if self.has_token_types:
            if token_type_ids is None:
                token_type_ids = torch.zeros(b, q, dtype=torch.long, device=embeddings.device)
            embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(embeddings))


def build_trigram_embeddings(*, options: TrigramEmbeddingOptions, **kwargs: Any) -> TrigramEmbeddings:
    return TrigramEmbeddings(options=options, **kwargs)


def check_trigram(config: BertConfig, spec: ComponentSpec, loc: str) -> list[str]:
    if config.is_decoder:
        return ["the trigram embedding reads each token's right neighbour: an encoder's (is_decoder: false)"]
    return []


# ------------------------------------------------------------------------------------------------ layer
class BottleneckLayerOptions(BaseModel):
    """Options of the ``bottleneck`` layer (MobileBertConfig's names in brackets)."""

    model_config = ConfigDict(extra="forbid")

    intra_bottleneck_size: PositiveInt | None = Field(
        128,
        description="the width the layer works at (intra_bottleneck_size, with use_bottleneck: true); null: no "
        "bottleneck, the layer works at hidden_size (use_bottleneck: false)",
    )
    key_query_shared_bottleneck: bool = Field(
        False,
        description="queries and keys read a bottleneck of their own (bottleneck.attention), values the layer's "
        "full input (encoder.attention.value_input_size: hidden_size) (key_query_shared_bottleneck)",
    )
    use_bottleneck_attention: bool = Field(
        True,
        description="queries, keys and values all read the layer's bottlenecked input, whatever "
        "key_query_shared_bottleneck says (use_bottleneck_attention; the published MobileBERT: false, with "
        "key_query_shared_bottleneck true)",
    )
    num_feedforward_networks: PositiveInt = Field(
        1, description="feed-forward blocks per layer: the extra ones at ffn.0, ffn.1, … (num_feedforward_networks)"
    )
    output_norm_eps: PositiveFloat | None = Field(
        None,
        description="epsilon of the last feed-forward block's norm (output.LayerNorm); null: layer_norm_eps "
        "(transformers' MobileBERT uses torch's 1e-5 there)",
    )


class BottleneckProjection(nn.Module):
    """transformers' ``BottleneckLayer`` / ``OutputBottleneck``: ``norm(dense(x) [+ residual])``."""

    def __init__(self, in_features: int, out_features: int, norm: nn.Module, dropout: float = 0.0) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features, out_features)
        self.LayerNorm = norm
        self.dropout = nn.Dropout(dropout)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        out = self.dropout(self.dense(hidden_states))
        return self.LayerNorm(out if residual is None else out + residual)


class FeedForwardBlock(nn.Module):
    """One stacked feed-forward block (``ffn.i``): its halves at ``intermediate`` and ``output``."""

    def __init__(self, feedforward: FeedForward, chunk_size_feed_forward: int) -> None:
        super().__init__()
        self.intermediate = feedforward.intermediate
        self.output = feedforward.output
        self.chunk_size_feed_forward = chunk_size_feed_forward


class BottleneckLayer(Layer):
    """MobileBERT's layer (see the module docstring); an encoder layer (no cache, no cross-attention)."""

    def __init__(
        self,
        attention: Attention,
        attention_norm: nn.Module,
        feedforward: FeedForward,
        extra_feedforwards: list[FeedForward],
        chunk_size_feed_forward: int,
        bottleneck: nn.Module | None,
        output_bottleneck: BottleneckProjection | None,
        share: Literal["query_key", "all"],
    ) -> None:
        super().__init__()
        self.attention = attention
        # the norm after the attention's residual sits at transformers' key (attention.output.LayerNorm); the layer
        # applies it, since the residual is the bottlenecked input, not what the attention read
        attention.output.LayerNorm = attention_norm
        if bottleneck is not None:
            self.bottleneck = bottleneck
        self.has_bottleneck = bottleneck is not None
        self.share = share
        if extra_feedforwards:
            self.ffn = nn.ModuleList(FeedForwardBlock(f, chunk_size_feed_forward) for f in extra_feedforwards)
        self.intermediate = feedforward.intermediate
        self.output = feedforward.output
        if output_bottleneck is not None:
            self.output.bottleneck = output_bottleneck  # transformers' key: output.bottleneck.{dense,LayerNorm}
        self.chunk_size_feed_forward = chunk_size_feed_forward

    def forward(
        self,
        hidden_states: torch.Tensor,  # [b, q, H]
        mask: torch.Tensor | None,
        positions: Positions,
        head_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        context: LayerContext | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        ctx = context or LayerContext()
        if ctx.encoder_hidden_states is not None or ctx.cache is not None:
            raise InputError("the bottleneck layer is an encoder layer: no cross-attention, no KV cache")
        if self.has_bottleneck:
            layer_input = self.bottleneck.input(hidden_states)  # [b, q, W]
            if self.share == "all":
                attention_input = layer_input
            else:  # queries and keys from their bottleneck, values from the full input: [b, q, W + H]
                attention_input = torch.cat([self.bottleneck.attention(hidden_states), hidden_states], dim=-1)
        else:
            layer_input = attention_input = hidden_states
        attended, weights = self_attend(
            self.attention, attention_input, mask, positions, head_mask, output_attentions, ctx
        )
        x = self.attention.output.LayerNorm(attended + layer_input)
        for block in getattr(self, "ffn", ()):
            x = run_feedforward(block, x)
        x = run_feedforward(self, x)
        if self.has_bottleneck:
            x = self.output.bottleneck(x, hidden_states)  # [b, q, H]
        return x, weights, None


def _without_dropout(module: nn.Module) -> float:
    """Set every dropout in ``module`` to 0 (transformers' MobileBERT has none there); the rate it had."""
    rate = 0.0
    for child in module.modules():
        if isinstance(child, nn.Dropout):
            rate, child.p = max(rate, child.p), 0.0
    return rate


def build_bottleneck_layer(
    *,
    attention: SublayerFactory,
    crossattention: SublayerFactory | None,
    feedforward: SublayerFactory,
    norm: Callable[..., nn.Module],
    hidden_size: int,
    chunk_size_feed_forward: int,
    options: BottleneckLayerOptions,
    **_: Any,
) -> BottleneckLayer:
    if crossattention is not None:  # refused at validate (check_bottleneck); kept for direct callers
        raise InputError("the bottleneck layer has no cross-attention sub-layer")
    width = options.intra_bottleneck_size or hidden_size
    narrow = partial(norm, hidden_size=width)
    bottlenecked = options.intra_bottleneck_size is not None
    attn: Attention = attention(None, hidden_size=width)  # returns dropout(dense(context)); the layer normalises
    extra = [feedforward(narrow, hidden_size=width) for _ in range(options.num_feedforward_networks - 1)]
    for block in extra:
        _without_dropout(block.output)  # transformers' FFNOutput: norm(dense(x) + x), no dropout
    output_norm = narrow if options.output_norm_eps is None else partial(narrow, eps=options.output_norm_eps)
    main = feedforward(output_norm, hidden_size=width)
    bottleneck = output_bottleneck = None
    if bottlenecked:
        _without_dropout(attn.output)  # with a bottleneck, transformers' self-output has no dropout ...
        rate = _without_dropout(main.output)  # ... nor the feed-forward output: the dropout moves after the widening
        bottleneck = nn.Module()
        bottleneck.input = BottleneckProjection(hidden_size, width, narrow())
        if options.key_query_shared_bottleneck:
            # transformers builds it whenever key_query_shared_bottleneck is set, unused (and kept, so that its
            # checkpoints load and save unchanged) when use_bottleneck_attention takes precedence
            bottleneck.attention = BottleneckProjection(hidden_size, width, narrow())
        output_bottleneck = BottleneckProjection(width, hidden_size, norm(), rate)
    return BottleneckLayer(
        attn,
        narrow(),
        main,
        extra,
        chunk_size_feed_forward,
        bottleneck,
        output_bottleneck,
        "all" if options.use_bottleneck_attention else "query_key",
    )


def check_bottleneck(config: BertConfig, spec: ComponentSpec, loc: str) -> list[str]:
    """An encoder layer; the attention's value input must be what the layer hands it."""
    issues = []
    if config.is_decoder or config.add_cross_attention:
        issues.append("the bottleneck layer is an encoder layer: set is_decoder and add_cross_attention false")
    opts = BottleneckLayerOptions.model_validate(spec.options())
    value_input = config.encoder.attention.options().get("value_input_size")
    if opts.intra_bottleneck_size is None or opts.use_bottleneck_attention:
        if value_input is not None:
            issues.append(
                "encoder.attention.value_input_size must be null: the attention's query, key and value read one "
                "input here (no bottleneck, or use_bottleneck_attention)"
            )
    elif not opts.key_query_shared_bottleneck:
        issues.append(
            "a bottleneck needs key_query_shared_bottleneck or use_bottleneck_attention (otherwise queries and keys "
            "would read the full-width input through bottleneck-wide projections, which transformers cannot build)"
        )
    elif value_input != config.hidden_size:
        issues.append(
            f"encoder.attention.value_input_size must be hidden_size {config.hidden_size} (the values read the "
            f"layer's full input beside the query/key bottleneck); it is {value_input}"
        )
    return issues


# ------------------------------------------------------------------------------------------------ heads
class BottleneckLMOptions(BaseModel):
    """Options of ``bottleneck_masked_lm`` and ``bottleneck_pretraining``."""

    model_config = ConfigDict(extra="forbid")

    embedding_size: PositiveInt | None = Field(
        None,
        description="width of the token table the decoder is tied to (MobileBERT's embedding_size); dense supplies "
        "hidden_size minus it. null: hidden_size (dense has no rows)",
    )


class ExtraDecoderRows(nn.Module):
    """``cls.predictions.dense``: the ``[H - E, V]`` rows of the decoder matrix beyond the tied table, used as a
    matrix, never called as a layer (so not an ``nn.Linear``: quantization leaves it whole, as the tied table)."""

    def __init__(self, rows: int, vocab_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, vocab_size))
        nn.init.normal_(self.weight, std=0.02)

    @torch.no_grad()
    def reset_parameters_like_hf(self, std: float) -> None:
        self.weight.normal_(0.0, std)  # transformers initialises its nn.Linear(vocab, H - E) as any linear


class BottleneckLMPrediction(LMPrediction):
    """transformers' ``MobileBertLMPredictionHead``: ``transform``, then ``t · [decoder.weightᵀ; dense.weight] +
    bias`` (``decoder`` ``[V, E]`` tied to the token table, ``dense`` ``[H - E, V]`` without bias)."""

    def __init__(self, transform: nn.Module, hidden_size: int, embedding_size: int, vocab_size: int, tie: bool) -> None:
        super().__init__(transform, embedding_size, vocab_size, tie=tie)
        # transformers' nn.Linear(vocab_size, hidden - embedding, bias=False): its weight [H - E, V] is used as is
        self.dense = ExtraDecoderRows(hidden_size - embedding_size, vocab_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.transform(hidden_states)  # [b, q, H]
        # transformers multiplies by the concatenation [decoder.weightᵀ; dense.weight] ([H, V]) and adds the bias;
        # split the same sum in two, so that the decoder stays a layer called as one (quantization replaces it)
        narrow, rest = hidden_states.split([self.decoder.in_features, self.dense.weight.shape[0]], dim=-1)
        return self.decoder(narrow) + rest.matmul(self.dense.weight)  # [b, q, V]


def _prediction(a: HeadArguments) -> BottleneckLMPrediction:
    size = a.options.embedding_size or a.hidden_size
    if size > a.hidden_size:
        raise InputError(f"head.embedding_size {size} must not exceed hidden_size {a.hidden_size}")
    transform = dense_act_norm(a.hidden_size, a.activation(), a.layer_norm_eps, BERT_TRANSFORM)
    return BottleneckLMPrediction(transform, a.hidden_size, size, a.vocab_size, a.tie_word_embeddings)


def bottleneck_masked_lm(name: str, a: HeadArguments) -> ComposedHead:
    """Every position → ``cls.predictions`` (:class:`BottleneckLMPrediction`) → vocabulary logits."""
    return ComposedHead(
        name,
        modules={"cls": Steps(("predictions", _prediction(a)))},
        branches=(Branch(("logits",), "none", ("cls",)),),
        loss=MASKED_LM_LOSS,
        output=MaskedLMOutput,
    )


def bottleneck_pretraining(name: str, a: HeadArguments) -> ComposedHead:
    """Masked LM (:class:`BottleneckLMPrediction`) plus next-sentence logits from the pooled output."""
    cls = nn.ModuleDict({"predictions": _prediction(a), "seq_relationship": nn.Linear(a.hidden_size, 2)})
    return ComposedHead(
        name,
        modules={"cls": cls},
        branches=(
            Branch(("prediction_logits",), "none", ("cls.predictions",)),
            Branch(("seq_relationship_logits",), "pooler", ("cls.seq_relationship",)),
        ),
        loss=PRETRAINING_LOSS,
        output=BertForPreTrainingOutput,
    )


def check_lm_width(config: BertConfig, spec: ComponentSpec, loc: str) -> list[str]:
    """The decoder is tied to the token table: its width is the trigram embedding's."""
    size = BottleneckLMOptions.model_validate(spec.options()).embedding_size or config.hidden_size
    if size > config.hidden_size:
        return [f"embedding_size {size} must not exceed hidden_size {config.hidden_size}"]
    if config.embedding.name == "trigram":
        table = TrigramEmbeddingOptions.model_validate(config.embedding.options()).embedding_size
        if table != size:
            return [f"embedding_size {size} must be the token table's (embedding.embedding_size {table})"]
    return []


def _validated(component: Component) -> Component:
    return replace(component, validate=check_lm_width)


def bertblocks_register_components() -> list[Component]:
    return [
        Component(
            "embedding",
            "trigram",
            build_trigram_embeddings,
            TrigramEmbeddingOptions,
            description="MobileBERT: narrow tokens (→ trigram) → projection, + position + type → norm",
            validate=check_trigram,
        ),
        Component(
            "layer",
            "bottleneck",
            build_bottleneck_layer,
            BottleneckLayerOptions,
            description="MobileBERT: bottleneck in, attention and stacked feed-forwards narrow, bottleneck out",
            validate=check_bottleneck,
        ),
        _validated(
            head_component(
                "bottleneck_masked_lm",
                bottleneck_masked_lm,
                "masked LM whose decoder is the tied narrow table plus a dense block (MobileBertForMaskedLM)",
                BottleneckLMOptions,
            )
        ),
        _validated(
            head_component(
                "bottleneck_pretraining",
                bottleneck_pretraining,
                "masked LM (tied narrow table plus a dense block) + NSP (MobileBertForPreTraining)",
                BottleneckLMOptions,
            )
        ),
    ]
