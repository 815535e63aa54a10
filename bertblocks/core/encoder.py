"""The encoder skeleton: a stack of layers that calls the component interfaces and nothing concrete.

Module names mirror transformers' BERT backbone (``embeddings``, ``encoder.layer.N``, ``pooler``) so that
``state_dict()`` keys are HF's. The skeleton owns what must be done once per forward pass (input checks,
the additive mask, positions, head-mask expansion) so layers never redo it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import save_on_cpu
from torch.utils.checkpoint import checkpoint

from ..config import BertConfig
from ..errors import InputError, InputTypeError
from .cache import KVCache
from .capabilities import (
    CapabilityError,
    PaddingReader,
    attention_capabilities,
    auto_packing_limit,
    padding_readers,
)
from .interfaces import (
    Attention,
    Embedding,
    ExtraInput,
    FeedForwardOutput,
    Layer,
    LayerContext,
    Pooler,
    Positions,
    PositionScheme,
    SharedPositionBias,
    SharedPositionTerm,
)
from .masks import additive_mask, causal_mask, check_attention_mask, is_all_visible
from .outputs import EncoderOutput, ModelOutputWithPooling
from .packing import Packing, right_padded_lengths

_NO_DECODER = LayerContext()

#: ``[layers, h]`` (every layer has ``h`` heads), or one ``[h_i]`` mask (or ``None``) per layer
HeadMask = torch.Tensor | Sequence[torch.Tensor | None]


class Encoder(nn.Module):
    """The layer stack. ``gradient_checkpointing`` recomputes each layer in backward while training.

    Args:
        layers: the layers with their own weights, registered at ``encoder.layer.N`` (HF's keys).
        groups: cross-layer sharing: the stack runs ``layers[groups[i]]`` as its layer ``i`` (ALBERT), so
            ``len(groups)`` layers run with ``len(layers)`` layers' parameters; ``None``: each layer once.
        final_norm: a norm after the last layer (pre-LN stacks), registered at ``encoder.final_norm``.
        shared_bias: a position bias shared by every layer (MPNet's ``encoder.relative_attention_bias``).
        shared_terms: values computed once per forward pass for every layer (DeBERTa's relative table at
            ``encoder.rel_embeddings``), each registered under its ``module_name`` and handed to the layers in
            :attr:`Positions.shared`, checked against the type it declares.
    """

    def __init__(
        self,
        layers: Sequence[Layer],
        groups: Sequence[int] | None = None,
        final_norm: nn.Module | None = None,
        shared_bias: SharedPositionBias | None = None,
        shared_terms: Sequence[SharedPositionTerm] = (),
    ) -> None:
        super().__init__()
        self.layer = nn.ModuleList(layers)  # singular name: HF's key is `encoder.layer.N`
        self.groups: tuple[int, ...] = tuple(groups) if groups is not None else tuple(range(len(layers)))
        if any(not 0 <= g < len(layers) for g in self.groups):
            raise InputError(f"layer groups {self.groups} name layers outside 0..{len(layers) - 1}")
        self.final_norm = final_norm
        self.gradient_checkpointing = False
        self._shares = groups is not None
        self._indexed = tuple(LayerContext(layer_index=i) for i in range(len(self.groups)))
        # A position bias shared by every layer lives here, as in MPNet (`encoder.relative_attention_bias`).
        self.shared_bias_name = shared_bias.module_name if shared_bias is not None else None
        if shared_bias is not None:
            self.add_module(shared_bias.module_name, shared_bias)
        self.shared_term_names: tuple[str, ...] = tuple(term.module_name for term in shared_terms)
        for term in shared_terms:
            if hasattr(self, term.module_name):
                raise InputError(
                    f"shared position term {type(term).__name__} takes the module name {term.module_name!r}, "
                    "which the encoder already uses"
                )
            self.add_module(term.module_name, term)
        #: keyword arguments for ``torch.utils.checkpoint.checkpoint`` (transformers' ``gradient_checkpointing_kwargs``)
        self.checkpoint_options: dict[str, Any] = {"use_reentrant": False}
        #: checkpoint layers 0, n, 2n, … only (the others keep their activations: memory traded for speed)
        self.checkpoint_every = 1
        #: keep what checkpointed layers save for backward in host memory (frees accelerator memory)
        self.checkpoint_offload = False

    @property
    def shared_bias(self) -> SharedPositionBias | None:
        return getattr(self, self.shared_bias_name) if self.shared_bias_name else None

    @property
    def num_layers(self) -> int:
        """Layers the stack runs (more than ``len(self.layer)`` when layers share weights)."""
        return len(self.groups)

    def _shared_values(self, positions: Positions, dtype: torch.dtype) -> dict[type, Any]:
        """Each shared term's value for this pass, by the type it declares (checked: a layer reading
        ``positions.term(kind)`` gets that type or nothing)."""
        values: dict[type, Any] = dict(positions.shared)
        for name in self.shared_term_names:
            term: SharedPositionTerm = getattr(self, name)
            value = term(positions, dtype)
            if not isinstance(value, term.produces):
                raise InputTypeError(
                    f"shared position term {type(term).__name__} (encoder.{name}) returned "
                    f"{type(value).__name__}, not the {term.produces.__name__} it declares"
                )
            values[term.produces] = value
        return values

    def layer_at(self, index: int) -> Layer:
        """The module that runs as layer ``index`` (shared by every layer of its group)."""
        return self.layer[self.groups[index]]  # type: ignore[return-value]

    def forward(
        self,
        hidden_states: torch.Tensor,
        mask: torch.Tensor | None,
        positions: Positions,
        head_mask: HeadMask | None = None,  # [layers, h_original], or one [h_i original] per layer
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        context: LayerContext | None = None,
    ) -> EncoderOutput:
        all_hidden: list[torch.Tensor] = []
        all_attn: list[torch.Tensor] = []
        all_cross: list[torch.Tensor] = []
        ctx = context or _NO_DECODER
        if not self._shares and len(self.groups) != len(self.layer):  # layers added or removed after construction
            self.groups = tuple(range(len(self.layer)))
        if len(self._indexed) != len(self.groups):
            self._indexed = tuple(LayerContext(layer_index=i) for i in range(len(self.groups)))
        shared = self.shared_bias
        if shared is not None:
            # once per forward pass, not once per layer
            positions = replace(positions, score_bias=_checked_bias(shared, positions, hidden_states.dtype))
        if self.shared_term_names:
            positions = replace(positions, shared=self._shared_values(positions, hidden_states.dtype))
        for i, group in enumerate(self.groups):
            layer = self.layer[group]
            if output_hidden_states:
                all_hidden.append(hidden_states)
            layer_head_mask = None if head_mask is None else head_mask[i]
            # every layer learns its index (KV cache slot, attentions whose layers differ); without a
            # per-forward context the contexts are made once per model, not once per call
            layer_ctx = replace(ctx, layer_index=i) if context is not None else self._indexed[i]
            if (
                self.gradient_checkpointing
                and self.training
                and torch.is_grad_enabled()
                and i % self.checkpoint_every == 0
            ):
                offload = (
                    save_on_cpu(pin_memory=torch.cuda.is_available()) if self.checkpoint_offload else nullcontext()
                )
                with offload:
                    hidden_states, weights, cross = checkpoint(
                        layer,
                        hidden_states,
                        mask,
                        positions,
                        layer_head_mask,
                        output_attentions,
                        layer_ctx,
                        **self.checkpoint_options,
                    )
            else:
                hidden_states, weights, cross = layer(
                    hidden_states, mask, positions, layer_head_mask, output_attentions, layer_ctx
                )
            if output_attentions and weights is not None:
                all_attn.append(weights)
            if output_attentions and cross is not None:
                all_cross.append(cross)
        if self.final_norm is not None:
            hidden_states = self.final_norm(hidden_states)
        if output_hidden_states:
            # the last entry is the stack's output, final norm included: transformers 5 ties it to
            # last_hidden_state (its ModernBERT too; 4.x recorded it before the norm)
            all_hidden.append(hidden_states)
        return EncoderOutput(
            last_hidden_state=hidden_states,
            past_key_values=ctx.cache,
            hidden_states=tuple(all_hidden) if output_hidden_states else None,
            attentions=tuple(all_attn) if output_attentions else None,
            cross_attentions=tuple(all_cross) if output_attentions and all_cross else None,
        )


class EncoderModel(nn.Module):
    """A BERT backbone with transformers' BERT backbone's forward contract.

    Args:
        config: the validated config this model was built from (kept as ``model.config``).
        embeddings, encoder, pooler: the assembled components; ``pooler`` may be ``None``.
        position: the position scheme the components were built with (not a module; it made them).
    """

    def __init__(
        self,
        config: BertConfig,
        embeddings: Embedding,
        encoder: Encoder,
        pooler: Pooler | None,
        position: PositionScheme,
    ) -> None:
        super().__init__()
        self.config = config
        self.position_scheme = position
        self._cache_shape_memo: tuple[tuple[int, int], ...] | None = None
        self.embeddings = embeddings
        self.encoder = encoder
        self.pooler = pooler
        self.padding_readers = tuple(padding_readers(self, extra={"position": position}))
        # what a layer's attention declares it cannot do, worked out once (declarations do not change), so that
        # a decoding loop pays a dictionary look-up per step, not a walk over the layers
        self._refusals = {what: self._refusal(what) for what in ("attention_weights", "cache")}
        # the inputs beyond BERT's that some module reads, by who reads them (declarations do not change):
        # attention modules (``Attention.extra_inputs``: Longformer's global_attention_mask, as given) and layer
        # outputs (``FeedForwardOutput.extra_inputs``: X-MOD's lang_ids, per token, packed with the tokens); the
        # embedding's are ``self.embeddings.extra_inputs`` (LayoutLM's bbox)
        self._attention_inputs: tuple[str, ...] = tuple(
            sorted({name for module in self.modules() if isinstance(module, Attention) for name in module.extra_inputs})
        )
        # the layer outputs that read per-token inputs (a tuple, so that nn.Module does not register them twice)
        self._input_readers: tuple[FeedForwardOutput, ...] = tuple(
            output
            for i in range(encoder.num_layers)
            if isinstance(output := getattr(encoder.layer_at(i), "output", None), FeedForwardOutput)
            and output.extra_inputs
        )

    @property
    def extra_input_names(self) -> tuple[str, ...]:
        """The inputs beyond BERT's this model takes, in order: its embedding's (LayoutLM's ``bbox``), its layer
        outputs' (X-MOD's ``lang_ids``), its attention modules' (Longformer's ``global_attention_mask``).

        The one list: :meth:`forward` accepts these keywords and refuses any other, an export makes graph inputs of
        them (:meth:`extra_input_specs`), and the HF-facing models list them in their ``forward`` signature (what
        transformers' Trainer reads to choose the dataset columns it keeps)."""
        layered = self._input_readers[0].extra_inputs if self._input_readers else ()
        return tuple(dict.fromkeys((*self.embeddings.extra_inputs, *layered, *self._attention_inputs)))

    def extra_input_specs(self) -> tuple[ExtraInput, ...]:
        """How each of :attr:`extra_input_names` looks (axes, dtype, an example), in that order, as the module that
        declares it describes it (``extra_input_specs()`` of the embedding, layer output or attention).

        Raises:
            InputError: a module describes other inputs than those it declares.
        """
        sources: list[nn.Module] = [self.embeddings, *self._input_readers[:1]]
        sources += [m for m in self.modules() if isinstance(m, Attention) and m.extra_inputs]
        specs: dict[str, ExtraInput] = {}
        for module in sources:
            declared: tuple[str, ...] = module.extra_inputs  # type: ignore[assignment]
            described = {spec.name: spec for spec in module.extra_input_specs()}  # type: ignore[operator]
            if set(described) != set(declared):
                raise InputError(
                    f"{type(module).__name__}.extra_input_specs() describes {sorted(described)} but the module "
                    f"declares extra_inputs {sorted(declared)}: describe each declared input once"
                )
            for name in declared:
                specs.setdefault(name, described[name])
        return tuple(specs[name] for name in self.extra_input_names)

    @property
    def sequence_multiple(self) -> int:
        """The sequence lengths an exported graph of this model takes are multiples of this: the least common
        multiple of its attention modules' :attr:`~bertblocks.core.interfaces.Attention.sequence_multiple` (1: any)."""
        return math.lcm(1, *(m.sequence_multiple for m in self.modules() if isinstance(m, Attention)))

    @property
    def padding_readers(self) -> tuple[PaddingReader, ...]:
        """The components that declare reading padded positions (``reads_padded_positions``, or
        ``reads_padded_positions_above`` a length; ``str()`` of each: ``path (Class)``): ``encoder.packing: auto``
        does not pack a batch any of them reads padding in (packing leaves zeros where they read). Found when the
        model is built; a task model adds its head's. See :mod:`bertblocks.core.capabilities`."""
        return self._padding_readers

    @padding_readers.setter
    def padding_readers(self, readers: tuple[PaddingReader, ...]) -> None:
        self._padding_readers = tuple(readers)
        # worked out once: forward reads a plain attribute (no Python work per call, nothing for a graph to trace)
        self._auto_packing_limit = auto_packing_limit(self._padding_readers)

    @property
    def auto_packing_limit(self) -> int | None:
        """The longest padded length (tokens per row) that ``encoder.packing: auto`` packs: ``None`` any length (no
        component declares reading padded positions, :attr:`padding_readers`), ``0`` none (one reads them in every
        batch), ``N`` the lowest ``reads_padded_positions_above`` declared (BigBird's full-attention limit)."""
        return self._auto_packing_limit

    def auto_packs(self, length: int) -> bool:
        """Whether ``encoder.packing: auto`` may pack a batch padded to ``length`` tokens: no component reads padded
        positions at that length. (It still packs only in inference and with enough padding, see ``forward``.)"""
        limit = self.auto_packing_limit
        return limit is None or length <= limit

    @property
    def packing_off_reason(self) -> str | None:
        """Why ``encoder.packing: auto`` does not pack this model's batches (any, or those longer than a length),
        naming the components (``None``: it may pack any)."""
        limit = self.auto_packing_limit
        if limit is None:
            return None
        readers = ", ".join(map(str, self.padding_readers))
        if limit == 0:
            return (
                f"encoder.packing: auto does not pack: {readers} declare(s) reads_padded_positions (a packed batch has "
                "zeros at padded positions)"
            )
        return (
            f"encoder.packing: auto does not pack batches longer than {limit} tokens (padded length): {readers} "
            f"declare(s) reads_padded_positions_above (a packed batch has zeros at padded positions); shorter "
            "batches pack"
        )

    # ------------------------------------------------------------------------------------------- forward
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        head_mask: HeadMask | None = None,
        inputs_embeds: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        past_key_values: KVCache | Sequence[Sequence[torch.Tensor]] | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **extra_inputs: torch.Tensor | None,
    ) -> ModelOutputWithPooling | tuple[torch.Tensor, ...]:
        """Encode (or, in decoder mode, decode) a batch. Arguments and outputs are transformers' BERT backbone's.

        Args:
            input_ids: ``[b, q]`` token ids (or give ``inputs_embeds [b, q, H]`` instead).
            attention_mask: ``[b, k]`` or ``[b, q, k]``, 1 = attend, 0 = padding; ``k`` counts cached tokens.
            token_type_ids: ``[b, q]`` segment ids; zeros when omitted.
            position_ids: ``[b|1, q]``; ``past + arange(q)`` when omitted.
            head_mask: ``[h]`` or ``[layers, h]`` multipliers of each head's attention probabilities; or a
                sequence of one ``[h_i]`` mask (or ``None``) per layer, for layers with different head counts.
            encoder_hidden_states: ``[b, s, H]`` for decoders with cross-attention.
            encoder_attention_mask: ``[b, s]`` (or ``[b, q, s]``) padding mask of the encoder states.
            past_key_values: a :class:`~bertblocks.core.cache.KVCache` from an earlier call (or transformers 4.x
                nested tuples); decoders only.
            use_cache: return the cache in ``past_key_values`` (default: ``config.use_cache`` for decoders;
                never for encoders, and not while training with gradient checkpointing, as in HF).
            output_attentions: also return every layer's attention probabilities.
            output_hidden_states: also return the embeddings and every layer's output.
            return_dict: ``False`` returns a tuple of the non-``None`` fields instead.
            extra_inputs: the inputs beyond BERT's that a module of this model declares (``extra_inputs`` of its
                embedding: LayoutLM's ``bbox [b, q, 4]``; of an attention: Longformer's ``global_attention_mask``;
                of a layer's output: X-MOD's ``lang_ids``); ``None`` means not given.

        Raises:
            ValueError: for inputs of the wrong shape, dtype or range, each with what was expected.
            TypeError: a keyword argument this model does not take.
        """
        cfg = self.config
        if output_attentions:
            self._check_attention_capability("attention_weights")
        cache = self._prepare_cache(past_key_values, use_cache)
        if cache is not None:
            self._check_attention_capability("cache")
        past_length = cache.get_seq_length() if cache is not None else 0
        batch, length = self._check_inputs(input_ids, inputs_embeds, token_type_ids, position_ids, past_length)
        extra, token_inputs, attention_inputs = self._check_extra_inputs(
            extra_inputs, batch, length, (input_ids if input_ids is not None else inputs_embeds).device
        )
        if cache is not None:
            # A full check walks every layer; a cache this model already checked (the usual decoding loop)
            # only needs its batch size confirmed.
            signature = (batch, *self._cache_shape())
            if cache.signature != signature:
                cache.check_compatible(batch, signature[1:])
                cache.signature = signature
        if encoder_hidden_states is not None and not cfg.add_cross_attention:
            raise InputError(
                "encoder_hidden_states given, but this model has no cross-attention layers "
                "(set is_decoder: true and add_cross_attention: true in its config)"
            )
        if self.embeddings.reads_attention_mask:
            hidden = self.embeddings(
                input_ids,
                token_type_ids,
                position_ids,
                inputs_embeds,
                past_length,
                attention_mask=attention_mask,
                **extra,
            )
        else:
            hidden = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds, past_length, **extra)
        dtype, device = hidden.dtype, hidden.device

        mask = None
        if attention_mask is not None:
            check_attention_mask(attention_mask, batch, length, past_length + length)
            if not is_all_visible(attention_mask):
                # Decoders fold causality into the same mask, as HF does: one hidden value wherever a key is
                # padding *or* in the future (summing two masks would differ on fully padded rows).
                mask = (
                    causal_mask(attention_mask, batch, length, past_length, dtype, device)
                    if cfg.is_decoder
                    else additive_mask(attention_mask, dtype)
                )
                if self.position_scheme.masks_padded_queries and attention_mask.dim() == 2 and not cfg.is_decoder:
                    # transformers' DeBERTa: a padded token's embedding is zero and, as a query, it sees no key
                    # (an all-masked row: the uniform softmax, on every kernel: masks.hidden_value), [b, 1, q, k];
                    # real tokens are unchanged
                    real = attention_mask.to(dtype)
                    mask = additive_mask(real[:, :, None] * real[:, None, :], dtype)
                    hidden = hidden * real[:, :, None]
        # the user's position_ids reach the position scheme (rotary schemes rotate by them)
        positions = Positions.contiguous(length, past_length, device, ids=position_ids)
        layer_head_mask = self._expand_head_mask(head_mask, dtype)

        context = None
        packing = self._packing_for(attention_mask, mask)
        if packing is not None:
            hidden = packing.pack(hidden)[None]  # [1, T, H]: dense layers see real tokens only
            # per-token inputs travel with their tokens
            token_inputs = {name: packing.pack(value)[None] for name, value in token_inputs.items()}  # [1, T]
            context = LayerContext(packing=packing, token_inputs=token_inputs)
            positions = positions.packed(packing)  # each sequence's positions, from 0, for its packed tokens
        elif token_inputs:
            context = LayerContext(token_inputs=token_inputs)
        if cfg.is_decoder:
            encoder_mask = None
            if encoder_hidden_states is not None and encoder_attention_mask is not None:
                s = encoder_hidden_states.shape[1]
                check_attention_mask(encoder_attention_mask, batch, length, s)
                if not is_all_visible(encoder_attention_mask):
                    encoder_mask = additive_mask(encoder_attention_mask, dtype)
            context = LayerContext(
                cache=cache,
                is_causal=mask is None,  # else causality is already in the mask
                encoder_hidden_states=encoder_hidden_states,
                encoder_mask=encoder_mask,
                token_inputs=token_inputs,
            )

        if attention_inputs:
            context = replace(context or LayerContext(), inputs=attention_inputs)
        encoded = self.encoder(
            hidden,
            mask,
            positions,
            head_mask=layer_head_mask,
            output_attentions=bool(output_attentions),
            output_hidden_states=bool(output_hidden_states),
            context=context,
        )
        if packing is not None:
            encoded = replace(
                encoded,
                last_hidden_state=packing.unpack(encoded.last_hidden_state[0]),
                hidden_states=None
                if encoded.hidden_states is None
                else tuple(packing.unpack(h[0]) for h in encoded.hidden_states),
            )
        sequence = encoded.last_hidden_state
        pooled = self.pooler(sequence, attention_mask) if self.pooler is not None else None
        out = ModelOutputWithPooling(
            last_hidden_state=sequence,
            pooler_output=pooled,
            hidden_states=encoded.hidden_states,
            past_key_values=cache,
            attentions=encoded.attentions,
            cross_attentions=encoded.cross_attentions,
        )
        return out if return_dict is None or return_dict else out.to_tuple()

    def _packing_for(self, attention_mask: torch.Tensor | None, mask: torch.Tensor | None) -> Packing | None:
        """Pack when the config allows it, the batch is right-padded, and (``auto``) in inference with enough
        padding to pay for the gathers. Padded positions of the outputs then hold zeros."""
        enc = self.config.encoder
        if (
            enc.packing == "never"
            or mask is None  # nothing padded
            or attention_mask is None
            or attention_mask.dim() != 2
            or self.config.is_decoder
        ):
            return None
        if enc.packing == "auto" and (
            self.training or torch.is_grad_enabled() or not self.auto_packs(attention_mask.shape[1])
        ):
            # the padded length is a shape, not data: compiled, a length-dependent declaration is one guard on it
            # (a graph for batches up to the limit, packed; another past it, padded), none for a model without one
            return None
        if torch.compiler.is_compiling():
            # A graph cannot branch on the data (padding side, padding share), so a compiled model packs every
            # 2-D mask; the packed path is exact for any padding pattern (tokens keep their row-major order).
            return Packing.from_mask(attention_mask)
        lengths = right_padded_lengths(attention_mask)
        if lengths is None:
            return None
        if enc.packing == "auto" and 1 - lengths.sum().item() / attention_mask.numel() < enc.packing_threshold:
            return None
        return Packing.from_mask(attention_mask)

    def _prepare_cache(
        self, past_key_values: KVCache | Sequence[Sequence[torch.Tensor]] | None, use_cache: bool | None
    ) -> KVCache | None:
        cfg = self.config
        if not cfg.is_decoder:
            if past_key_values is not None:
                raise InputError("past_key_values given, but this model is not a decoder (is_decoder: false)")
            return None
        if use_cache is None:
            use_cache = cfg.use_cache
        if self.encoder.gradient_checkpointing and self.training:
            use_cache = False  # recomputation in backward would append to the cache a second time
        if past_key_values is None:
            return KVCache(cfg.encoder.num_layers) if use_cache else None
        if isinstance(past_key_values, KVCache):
            return past_key_values
        return KVCache.from_legacy(past_key_values)

    def _cache_shape(self) -> tuple[tuple[int, int], ...]:
        """``(heads, head_dim)`` of each layer, as its attention module has them (per-layer overrides and pruning
        included; the key/value heads under grouped-query attention, which the cache holds): what a cache must
        match; kept until pruning."""
        if self._cache_shape_memo is None:
            attentions = [self.encoder.layer_at(i).attention for i in range(self.encoder.num_layers)]
            self._cache_shape_memo = tuple((getattr(a, "num_kv_heads", a.num_heads), a.head_dim) for a in attentions)
        return self._cache_shape_memo

    # --------------------------------------------------------------------------------------- input checks
    def _check_inputs(
        self,
        input_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        past_length: int = 0,
    ) -> tuple[int, int]:
        cfg = self.config
        if (input_ids is None) == (inputs_embeds is None):
            raise InputError("give exactly one of input_ids and inputs_embeds")
        checking = not torch.compiler.is_compiling()  # data-dependent checks would break the graph
        if input_ids is not None:
            if input_ids.dim() != 2:
                raise InputError(f"input_ids must be [batch, seq]; got shape {tuple(input_ids.shape)}")
            _check_integer("input_ids", input_ids)
            if checking and input_ids.numel() and (input_ids.min() < 0 or input_ids.max() >= cfg.vocab_size):
                bad = input_ids[(input_ids < 0) | (input_ids >= cfg.vocab_size)]
                raise InputError(
                    f"input_ids hold {bad[0].item()}, outside the vocabulary [0, {cfg.vocab_size}) of this model"
                )
            batch, length = input_ids.shape
        else:
            assert inputs_embeds is not None
            if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != cfg.hidden_size:
                raise InputError(
                    f"inputs_embeds must be [batch, seq, {cfg.hidden_size}]; got {tuple(inputs_embeds.shape)}"
                )
            batch, length = inputs_embeds.shape[:2]
        given = "input_ids" if input_ids is not None else "inputs_embeds"
        if length == 0:  # nothing to encode; it would fail later with an IndexError naming no input
            raise InputError(f"{given} is empty (sequence length 0); give at least one token per sequence")
        if batch == 0:  # the outputs would be empty and a loss over them NaN, silently
            raise InputError(f"{given} is an empty batch (batch size 0); give at least one sequence, or skip the call")
        if past_length + length > cfg.max_position_embeddings and self.position_scheme.limits_length:
            cached = f" after {past_length} cached tokens" if past_length else ""
            raise InputError(
                f"sequence length {length}{cached} exceeds max_position_embeddings={cfg.max_position_embeddings} "
                f"of this model; truncate the input (e.g. tokenizer max_length)"
            )
        if token_type_ids is not None:
            _check_integer("token_type_ids", token_type_ids)
            if tuple(token_type_ids.shape) != (batch, length):
                raise InputError(
                    f"token_type_ids must have the input's shape {(batch, length)}; got {tuple(token_type_ids.shape)}"
                )
            if (
                checking
                and cfg.type_vocab_size > 0  # 0: no token-type table, the ids are ignored (DeBERTa-v3)
                and token_type_ids.numel()
                and (token_type_ids.min() < 0 or token_type_ids.max() >= cfg.type_vocab_size)
            ):
                raise InputError(f"token_type_ids must lie in [0, {cfg.type_vocab_size}) (type_vocab_size)")
        if position_ids is not None:
            _check_integer("position_ids", position_ids)
            if position_ids.dim() != 2 or position_ids.shape[-1] != length or position_ids.shape[0] not in (1, batch):
                raise InputError(f"position_ids must be [batch or 1, {length}]; got shape {tuple(position_ids.shape)}")
            if (
                checking
                and position_ids.numel()
                and (position_ids.min() < 0 or position_ids.max() >= cfg.max_position_embeddings)
            ):
                raise InputError(
                    f"position_ids must lie in [0, {cfg.max_position_embeddings}) (max_position_embeddings)"
                )
        return batch, length

    def _check_extra_inputs(
        self, given: dict[str, torch.Tensor | None], batch: int, length: int, device: torch.device
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The one door every input beyond BERT's goes through: ``(the embedding's, checked by it; the layers'
        per-token ``[b, q]`` ones, prepared by the first layer output that declares them; the attention modules',
        as given)``; ``None`` values are not given. A name no module declares is refused."""
        embedded = self.embeddings.extra_inputs
        layered = self._input_readers[0].extra_inputs if self._input_readers else ()
        attended = self._attention_inputs
        declared = self.extra_input_names
        unknown = sorted(name for name in given if name not in declared)
        if unknown:
            takes = f"; this model takes {', '.join(declared)} beyond BERT's inputs" if declared else ""
            names = ", ".join(repr(name) for name in unknown)
            what = (
                f"an unexpected keyword argument {names}"
                if len(unknown) == 1
                else f"unexpected keyword arguments {names}"
            )
            raise InputTypeError(f"{type(self).__name__}.forward() got {what}{takes}")
        extra = {name: value for name, value in given.items() if value is not None and name in embedded}
        if extra:
            self.embeddings.check_extra_inputs(extra, batch, length)
        token_inputs: dict[str, torch.Tensor] = {}
        if layered:
            chosen = {name: value for name, value in given.items() if value is not None and name in layered}
            token_inputs = self._input_readers[0].prepare_extra_inputs(chosen, batch, length, device)
        attention = {name: value for name, value in given.items() if value is not None and name in attended}
        return extra, token_inputs, attention

    def _expand_head_mask(self, head_mask: HeadMask | None, dtype: torch.dtype) -> HeadMask | None:
        """``[h]`` or ``[layers, h]`` → ``[layers, h]`` in the model's dtype (HF's ``get_head_mask``); or a
        sequence of one ``[h_i]`` mask (or ``None``) per layer, the form that fits layers of different head counts.

        ``h`` is each layer's head count as built (its config's ``num_heads``, per-layer overrides included); a
        pruned layer keeps indexing its heads by their original numbers.
        """
        if head_mask is None:
            return None
        enc = self.config.encoder
        layers = enc.num_layers
        heads = [enc.layer_specs(i)[0].num_heads for i in range(layers)]
        if isinstance(head_mask, torch.Tensor):
            uniform = heads[0] if len(set(heads)) == 1 else None
            if uniform is None or tuple(head_mask.shape) not in ((uniform,), (layers, uniform)):
                # checked before expanding: report what was given
                raise InputError(f"head_mask must be {_head_mask_shapes(heads)}; got shape {tuple(head_mask.shape)}")
            if head_mask.dim() == 1:
                head_mask = head_mask.unsqueeze(0).expand(layers, -1)
            return head_mask.to(dtype)
        masks = list(head_mask)
        if len(masks) != layers:
            raise InputError(f"head_mask must be {_head_mask_shapes(heads)}; got {len(masks)} masks")
        for i, (mask, n) in enumerate(zip(masks, heads, strict=True)):
            if mask is not None and tuple(mask.shape) != (n,):
                raise InputError(
                    f"head_mask[{i}] has shape {tuple(mask.shape)} but layer {i} has {n} heads; head_mask must be "
                    f"{_head_mask_shapes(heads)}"
                )
        return [None if mask is None else mask.to(dtype) for mask in masks]

    # ------------------------------------------------------------------------------------------- utilities
    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.input_embeddings()

    def prune_heads(self, heads_to_prune: dict[int, list[int]]) -> None:
        """Remove attention heads for good: ``{layer: [head, ...]}``, heads numbered as originally built.

        Recorded in ``config.pruned_heads`` so that a saved checkpoint (with its smaller tensors) rebuilds
        the same shapes before its weights are loaded.
        """
        for layer in heads_to_prune:
            attention = self.encoder.layer_at(int(layer)).attention
            declared = attention_capabilities(attention)
            if not declared.pruning:
                raise CapabilityError(
                    f"prune_heads: encoder layer {layer}'s attention {type(attention).__name__} "
                    + declared.refusal("declares that its heads cannot be pruned")
                )
        self._cache_shape_memo = None  # the layers' head counts change
        merged = {int(k): list(v) for k, v in self.config.pruned_heads.items()}
        for layer, heads in heads_to_prune.items():
            # with shared layers, pruning one layer prunes its group (one module serves them all)
            self.encoder.layer_at(layer).attention.prune_heads(set(heads))
            merged[int(layer)] = sorted(set(merged.get(int(layer), [])) | set(heads))
        self.config.pruned_heads = merged

    def _check_attention_capability(self, what: str) -> None:
        """Raise :class:`CapabilityError` if a self-attention layer declares it cannot do ``what``
        (``attention_weights``: any at all; ``cache``)."""
        refusal = self._refusals[what]
        if refusal is not None:
            raise CapabilityError(refusal)

    def _refusal(self, what: str) -> str | None:
        for i in range(self.encoder.num_layers):
            attention = self.encoder.layer_at(i).attention
            declared = attention_capabilities(attention)
            name = type(attention).__name__
            if what == "attention_weights" and declared.attention_weights == "none":
                return (
                    f"output_attentions=True, but encoder layer {i}'s attention {name} "
                    + declared.refusal("declares attention_weights: none")
                    + "; drop output_attentions"
                )
            if what == "cache" and not declared.cache:
                return (
                    f"use_cache: encoder layer {i}'s attention {name} "
                    + declared.refusal("declares that it cannot decode through a KV cache")
                    + "; pass use_cache=False (and set use_cache: false in the config)"
                )
        return None

    def gradient_checkpointing_enable(self) -> None:
        """Recompute layer activations in backward instead of storing them (training only)."""
        self.encoder.gradient_checkpointing = True

    def gradient_checkpointing_disable(self) -> None:
        self.encoder.gradient_checkpointing = False


def _checked_bias(shared: SharedPositionBias, positions: Positions, dtype: torch.dtype) -> torch.Tensor:
    """The shared bias of this pass, checked to be the ``[1|b, h, q, k]`` score term it must be (a wrong shape
    would otherwise broadcast silently into the scores)."""
    bias = shared(positions, dtype)
    q, k = positions.query.shape[0], positions.key.shape[0]
    if not isinstance(bias, torch.Tensor) or bias.dim() != 4 or tuple(bias.shape[-2:]) != (q, k):
        got = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
        raise InputError(
            f"shared position bias {type(shared).__name__} returned {got}; a score bias must be [1|b, h, {q}, {k}] "
            "(queries, keys of this pass); to hand layers something else, use a SharedPositionTerm"
        )
    return bias


def _head_mask_shapes(heads: Sequence[int]) -> str:
    """The head-mask shapes a model with ``heads[i]`` heads in layer ``i`` takes, for messages."""
    layers = len(heads)
    if len(set(heads)) == 1:
        return f"[num_heads] = [{heads[0]}] or [num_layers, num_heads] = [{layers}, {heads[0]}]"
    differing = ", ".join(f"layer {i} has {n} heads" for i, n in enumerate(heads) if n != heads[0])
    return f"one mask per layer, [{', '.join(map(str, heads))}] heads ({differing})"


def _check_integer(name: str, tensor: torch.Tensor) -> None:
    # an embedding look-up with floats (or uint8, int16) fails deep inside torch naming no argument
    if tensor.dtype not in (torch.long, torch.int):
        kind = "an integer tensor" if tensor.is_floating_point() or tensor.dtype == torch.bool else "torch.long or int"
        raise InputError(f"{name} must be {kind}; got {tensor.dtype} (convert with {name}.long())")
