"""BERT's embeddings and the family variations on them: token (+ token type, + extra type tables)
(+ the position scheme's embedding) → LayerNorm → dropout (→ projection to the hidden size).

The variations are options of the one ``bert`` embedding (so a hybrid can pick any of them):

* ``token_types: false`` — no token-type table at all (DistilBERT);
* ``position_offset: padding`` — positions count real tokens only and start past the padding index, and
  padding tokens sit at the padding position (RoBERTa's ``create_position_ids_from_input_ids``);
* ``position_start`` — default positions start at this id (Nyströmformer's ``arange(L) + 2``);
* ``embedding_size`` — tables and LayerNorm at a smaller width, then a linear projection to the hidden size
  (ELECTRA's ``embeddings_project``, ALBERT's ``embedding_hidden_mapping_in``);
* ``extra_type_tables`` — further per-token type tables, added like token types (ERNIE's
  ``task_type_embeddings``); their ids default to 0, as ERNIE's do;
* ``norm_bias: false`` — the LayerNorm scales only (ModernBERT's ``norm_bias: false``);
* ``norm: false`` — no LayerNorm at all (Llama-style encoders, EuroBERT and NeoBERT, whose pre-LN layers
  normalise their input themselves);
* ``box_positions`` — LayoutLM's 2-D position tables for word boxes: the model then takes a ``bbox`` input
  ``[b, q, 4]`` (``x0, y0, x1, y1`` on a 0…``box_positions - 1`` grid, zeros when omitted) and adds
  ``x(x0) + y(y0) + x(x1) + y(y1) + h(y1 - y0) + w(x1 - x0)``, as transformers' ``LayoutLMEmbeddings``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt
from torch import nn

from bertblocks.core.component import Component
from bertblocks.core.interfaces import Embedding, ExtraInput, PositionScheme

from ..errors import InputError, InputTypeError

#: the input the 2-D position tables read (transformers' name)
BOX_INPUT = "bbox"


class BertEmbeddingOptions(BaseModel):
    """Options of the ``bert`` embedding; the defaults are BERT's."""

    model_config = ConfigDict(extra="forbid")

    token_types: bool = Field(True, description="a token-type (segment) table; false: none (DistilBERT)")
    position_offset: Literal["none", "padding"] = Field(
        "none",
        description="padding: position ids start after pad_token_id and skip padding tokens (RoBERTa); "
        "none: 0, 1, 2, … (BERT)",
    )
    position_start: NonNegativeInt = Field(
        0,
        description="the first default position id (position_offset none): 2 for Nystromformer, whose ids are "
        "arange(L) + 2; ids a caller passes are used as given",
    )
    embedding_size: PositiveInt | None = Field(
        None, description="width of the tables and LayerNorm, then a projection to hidden_size (ELECTRA, ALBERT)"
    )
    extra_type_tables: dict[str, PositiveInt] = Field(
        default_factory=dict,
        description="further type tables, name → size, added like token types with ids 0 (ERNIE's "
        "task_type_embeddings)",
    )
    norm_bias: bool = Field(True, description="a bias in the LayerNorm; false: scale only (ModernBERT)")
    scale_embeddings: bool = Field(
        False, description="multiply the token embeddings (looked up or given) by √width (BigBird's rescale_embeddings)"
    )
    dropout_before_norm: bool = Field(
        False, description="dropout on the sum, then the LayerNorm (BigBird's order); false: LayerNorm, then dropout"
    )
    norm: bool = Field(
        True, description="a LayerNorm after the tables; false: none, the first pre-LN layer normalises (EuroBERT)"
    )
    box_positions: PositiveInt | None = Field(
        None,
        description="size of LayoutLM's 2-D position tables (x, y, h, w; its max_2d_position_embeddings): the "
        "model takes a bbox input [batch, seq, 4] of box corners x0, y0, x1, y1 in [0, box_positions); null: none",
    )


class BertEmbeddings(Embedding):
    """HF's ``BertEmbeddings``, with the position table supplied by the position scheme (if it adds one).

    A relative scheme adds nothing here, so no unused ``position_embeddings`` parameter exists (an unused
    parameter breaks DDP; transformers fixed the same in PR #31899).
    """

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
        options: BertEmbeddingOptions | None = None,
    ) -> None:
        super().__init__()
        # subclasses built with another options model (or none) get BERT's defaults
        opts = options if isinstance(options, BertEmbeddingOptions) else BertEmbeddingOptions()
        if opts.position_offset == "padding" and pad_token_id is None:
            raise InputError("embedding.position_offset 'padding' needs a pad_token_id to offset positions past")
        width = opts.embedding_size or hidden_size
        self.position_offset = opts.position_offset
        self.position_start = opts.position_start
        self.padding_idx = pad_token_id
        self.word_embeddings = nn.Embedding(vocab_size, width, padding_idx=pad_token_id)
        position_table = position.embedding(width)
        if position_table is not None:
            self.position_embeddings = position_table
        self.has_position_table = position_table is not None
        # type_vocab_size 0 (DeBERTa-v3): no table, and token_type_ids are ignored as transformers ignores them
        self.ignores_token_types = type_vocab_size == 0
        if opts.token_types and not self.ignores_token_types:
            self.token_type_embeddings = nn.Embedding(type_vocab_size, width)
        self.has_token_types = opts.token_types and not self.ignores_token_types
        self.extra_type_names = tuple(opts.extra_type_tables)
        for name, size in opts.extra_type_tables.items():
            self.add_module(name, nn.Embedding(size, width))  # the family's key: `embeddings.<name>.weight`
        self.box_positions = opts.box_positions
        if opts.box_positions is not None:
            # transformers' names (checkpoint keys `embeddings.x_position_embeddings.weight`, …)
            self.x_position_embeddings = nn.Embedding(opts.box_positions, width)
            self.y_position_embeddings = nn.Embedding(opts.box_positions, width)
            self.h_position_embeddings = nn.Embedding(opts.box_positions, width)
            self.w_position_embeddings = nn.Embedding(opts.box_positions, width)
            self.extra_inputs = (BOX_INPUT,)
        # CamelCase: HF checkpoint key; an identity holds no parameters, so a norm-free model stores none
        self.LayerNorm: nn.Module = (
            nn.LayerNorm(width, eps=layer_norm_eps, bias=opts.norm_bias) if opts.norm else nn.Identity()
        )
        self.dropout = nn.Dropout(dropout)
        self.scale = float(width) ** 0.5 if opts.scale_embeddings else None
        self.dropout_before_norm = opts.dropout_before_norm
        # a factorized embedding is projected even at equal widths (ALBERT always has the projection)
        self.has_projection = opts.embedding_size is not None
        if self.has_projection:
            self.projection = nn.Linear(width, hidden_size)
        # Non-persistent, as in transformers >= 4.31: never written to checkpoints.
        self.register_buffer("position_ids", torch.arange(position.max_positions)[None], persistent=False)
        self.register_buffer(
            "token_type_ids", torch.zeros(1, position.max_positions, dtype=torch.long), persistent=False
        )

    def input_embeddings(self) -> nn.Embedding:
        return self.word_embeddings

    def forward(
        self,
        input_ids: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        past_length: int = 0,
        bbox: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if inputs_embeds is None:
            assert input_ids is not None
            inputs_embeds = self.word_embeddings(input_ids)  # [b, q, E]
        else:
            self._check_embeds(inputs_embeds)
        b, q = inputs_embeds.shape[:2]
        embeddings = inputs_embeds if self.scale is None else inputs_embeds * self.scale
        if self.has_token_types:
            if token_type_ids is None:
                # the buffer is max_position_embeddings long; a scheme without a length limit (ALiBi) reads longer
                token_type_ids = (
                    self.token_type_ids[:, :q].expand(b, q)
                    if q <= self.token_type_ids.shape[1]
                    else torch.zeros(b, q, dtype=torch.long, device=inputs_embeds.device)
                )
            embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        elif token_type_ids is not None and not self.ignores_token_types:
            raise InputError("this model has no token types (embedding.token_types: false); do not pass token_type_ids")
        if self.has_position_table:
            if position_ids is None:
                position_ids = self._default_positions(input_ids, inputs_embeds, past_length)
            embeddings = embeddings + self.position_embeddings(position_ids)
        if self.box_positions is not None:
            embeddings = embeddings + self._box_embeddings(bbox, b, q, inputs_embeds.device)
        for name in self.extra_type_names:
            table = getattr(self, name)
            embeddings = embeddings + table(self.token_type_ids[:, :q].expand(b, q))  # ids 0, as ERNIE's default
        if self.dropout_before_norm:
            embeddings = self.LayerNorm(self.dropout(embeddings))
        else:
            embeddings = self.dropout(self.LayerNorm(embeddings))
        return self.projection(embeddings) if self.has_projection else embeddings  # [b, q, H]

    def extra_input_specs(self) -> tuple[ExtraInput, ...]:
        """``bbox``: integer ``[batch, sequence, 4]`` boxes; the example holds boxes of every row on the tables' grid.
        Any other name (a subclass's) keeps the default description."""
        specs = super().extra_input_specs()
        if self.box_positions is None:
            return specs
        size = self.box_positions

        def boxes(batch: int, length: int) -> torch.Tensor:
            corner = torch.randint(0, max(size // 2, 1), (batch, length, 2), generator=torch.Generator().manual_seed(0))
            extent = torch.randint(0, max(size // 2, 1), (batch, length, 2), generator=torch.Generator().manual_seed(1))
            return torch.cat([corner, (corner + extent).clamp(max=size - 1)], -1)  # x0, y0, x1, y1

        box = ExtraInput(BOX_INPUT, ("batch", "sequence", 4), torch.long, boxes)
        return tuple(box if spec.name == BOX_INPUT else spec for spec in specs)

    def check_extra_inputs(self, inputs: Mapping[str, torch.Tensor], batch: int, length: int) -> None:
        """``bbox`` must be integer ``[batch, length, 4]`` boxes ``x0, y0, x1, y1`` on the tables' grid, with
        ``x0 <= x1`` and ``y0 <= y1`` (the height and width tables are read at ``y1 - y0`` and ``x1 - x0``)."""
        bbox = inputs.get(BOX_INPUT)
        if bbox is None:
            return
        if not isinstance(bbox, torch.Tensor):
            raise InputTypeError(f"bbox must be a tensor [batch, seq, 4]; got {type(bbox).__name__}")
        if bbox.is_floating_point() or bbox.is_complex() or bbox.dtype == torch.bool:
            raise InputTypeError(f"bbox must be an integer tensor (torch.long); got {bbox.dtype}")
        if tuple(bbox.shape) != (batch, length, 4):
            raise InputError(
                f"bbox must be [batch, seq, 4] = {(batch, length, 4)} (x0, y0, x1, y1 per token); "
                f"got shape {tuple(bbox.shape)}"
            )
        size = self.x_position_embeddings.num_embeddings  # extra_inputs names bbox only when the tables exist
        if torch.compiler.is_compiling() or not bbox.numel():
            return  # data-dependent checks would break the graph
        if bbox.min() < 0 or bbox.max() >= size:
            bad = bbox[(bbox < 0) | (bbox >= size)][0].item()
            raise InputError(
                f"bbox holds {bad}, outside the 2-D position tables [0, {size}) of this model "
                f"(max_2d_position_embeddings): scale box coordinates to 0…{size - 1} (LayoutLM's 0-1000 grid)"
            )
        flipped = (bbox[..., 2] < bbox[..., 0]) | (bbox[..., 3] < bbox[..., 1])  # [b, q]
        if flipped.any():
            row, token = (int(i) for i in flipped.nonzero()[0])
            raise InputError(
                f"bbox[{row}, {token}] = {bbox[row, token].tolist()} is not x0, y0, x1, y1 with x0 <= x1 and "
                "y0 <= y1 (its width or height would be negative)"
            )

    def _box_embeddings(self, bbox: torch.Tensor | None, b: int, q: int, device: torch.device) -> torch.Tensor:
        """LayoutLM's 2-D position terms ``[b, q, E]``: corners on the x and y tables, height and width on theirs
        (all-zero boxes when ``bbox`` is omitted, as transformers' ``LayoutLMModel``)."""
        if bbox is None:
            bbox = torch.zeros(b, q, 4, dtype=torch.long, device=device)
        x, y = self.x_position_embeddings, self.y_position_embeddings
        # transformers' order of the sum (left, upper, right, lower, height, width)
        return (
            x(bbox[..., 0])
            + y(bbox[..., 1])
            + x(bbox[..., 2])
            + y(bbox[..., 3])
            + self.h_position_embeddings(bbox[..., 3] - bbox[..., 1])
            + self.w_position_embeddings(bbox[..., 2] - bbox[..., 0])
        )

    def _check_embeds(self, inputs_embeds: torch.Tensor) -> None:
        """``inputs_embeds`` must be floating point in the tables' dtype (autocast decides dtypes itself)."""
        table = self.word_embeddings.weight.dtype
        if inputs_embeds.dtype == table or (inputs_embeds.is_floating_point() and torch.is_autocast_enabled()):
            return
        # a float64 input into a float32 model fails later inside LayerNorm ("mixed dtype"), naming nothing
        raise InputError(
            f"inputs_embeds are {inputs_embeds.dtype} but this model computes in {table}: pass "
            f"inputs_embeds.to({table}) (or convert the model with model.to({inputs_embeds.dtype}))"
            if inputs_embeds.is_floating_point()
            else f"inputs_embeds must be a floating-point tensor in {table}; got {inputs_embeds.dtype}"
        )

    def _default_positions(
        self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor, past_length: int
    ) -> torch.Tensor:
        q = inputs_embeds.shape[1]
        if self.position_offset == "none":
            start = self.position_start + past_length
            if start + q > self.position_ids.shape[1]:
                raise InputError(
                    f"sequence length {q} needs positions up to {start + q - 1}, past the {self.position_ids.shape[1]} "
                    f"positions of this model, whose positions start at {self.position_start}: it takes at most "
                    f"{self.position_ids.shape[1] - self.position_start - past_length} tokens; truncate the input"
                )
            return self.position_ids[:, start : start + q]
        pad = self.padding_idx
        assert pad is not None
        if input_ids is None:
            # nothing says which embeddings are padding: sequential after the padding index (as RoBERTa)
            self._check_offset_positions(pad + q, q, past_length)
            return torch.arange(pad + 1, q + pad + 1, device=inputs_embeds.device)[None]
        # RoBERTa's create_position_ids_from_input_ids: real tokens count from pad + 1, padding stays at pad
        real = input_ids.ne(pad).int()
        positions = ((torch.cumsum(real, dim=1).type_as(real) + past_length) * real).long() + pad
        if not torch.compiler.is_compiling() and pad + past_length + q >= self.position_ids.shape[1]:
            # only padding-free rows reach the last positions: the real maximum decides (one host sync,
            # paid only by inputs this long)
            self._check_offset_positions(int(positions.max()), q, past_length)
        return positions

    def _check_offset_positions(self, highest: int, q: int, past_length: int) -> None:
        """RoBERTa-style positions past the table raise an error saying how many tokens the model takes."""
        table = self.position_ids.shape[1]
        if highest < table:
            return
        pad = self.padding_idx
        assert pad is not None
        cached = f" after {past_length} cached tokens" if past_length else ""
        raise InputError(
            f"sequence length {q}{cached} needs position {highest}, past the {table} positions of this model "
            f"(max_position_embeddings={table}); its positions start after pad_token_id={pad}, so it takes at "
            f"most {table - pad - 1} tokens: truncate the input (e.g. tokenizer max_length={table - pad - 1})"
        )


class EsmEmbeddingOptions(BaseModel):
    """Options of the ``esm`` embedding (transformers' ``EsmEmbeddings``)."""

    model_config = ConfigDict(extra="forbid")

    norm: bool = Field(
        False, description="a LayerNorm after the sum (emb_layer_norm_before; ESM-1b: true, ESM-2: false)"
    )
    token_dropout: bool = Field(
        False,
        description="zero the embeddings of mask tokens and rescale every embedding by (1 - 0.15·0.8) / (1 - the "
        "row's share of mask tokens), in training and evaluation alike (ESM's token_dropout)",
    )
    mask_token_id: NonNegativeInt | None = Field(None, description="the mask token token_dropout looks for")
    inputs_embeds_as_is: bool = Field(
        False,
        description="inputs_embeds go to the encoder untouched (no position table, norm or padding zeroing), as "
        "transformers' EsmModel skips its embeddings for them; false: they take the path looked-up ids take",
    )
    contact_head_features: PositiveInt | None = Field(
        None,
        description="hold ESM's contact-prediction regression (contact_head.regression, this many inputs: layers × "
        "heads) so that checkpoints round-trip; frozen and never run (contact prediction is not implemented)",
    )


class EsmEmbeddings(Embedding):
    """transformers' ``EsmEmbeddings``: token embeddings (→ ``token_dropout`` rescaling) (+ the position scheme's
    table, positions past the padding index as RoBERTa's) (→ LayerNorm) → padded positions zeroed. No token types
    (``token_type_ids`` are ignored, as ``EsmModel`` takes none) and no dropout (transformers' ESM drops nothing
    here). ``token_dropout`` needs ``input_ids`` (it looks for the mask token); with ``inputs_embeds_as_is`` (the
    ESM family's setting) ``inputs_embeds`` skip everything, as ``EsmModel`` skips its embeddings for them.
    An encoder's embeddings only (:func:`check_esm_embeddings` refuses ``is_decoder``).
    """

    reads_attention_mask = True

    def __init__(
        self,
        *,
        vocab_size: int,
        hidden_size: int,
        pad_token_id: int | None,
        layer_norm_eps: float,
        position: PositionScheme,
        options: EsmEmbeddingOptions,
    ) -> None:
        super().__init__()
        if options.token_dropout and options.mask_token_id is None:
            raise InputError("embedding.token_dropout needs embedding.mask_token_id (the mask token it rescales for)")
        self.padding_idx = pad_token_id
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size, padding_idx=pad_token_id)
        table = position.embedding(hidden_size)
        if table is not None:
            if pad_token_id is None:
                raise InputError("ESM's position table starts past the padding index: it needs a pad_token_id")
            self.position_embeddings = table
        self.has_position_table = table is not None
        if options.norm:
            self.layer_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)  # ESM's key: embeddings.layer_norm
        self.has_norm = options.norm
        self.token_dropout = options.token_dropout
        self.mask_token_id = options.mask_token_id
        self.inputs_embeds_as_is = options.inputs_embeds_as_is
        if options.contact_head_features is not None:
            self.contact_head = nn.Module()
            self.contact_head.regression = nn.Linear(options.contact_head_features, 1)
            self.contact_head.requires_grad_(False)  # never run: a trainable parameter without gradient breaks DDP
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
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if inputs_embeds is not None and self.inputs_embeds_as_is:
            return inputs_embeds  # EsmModel hands them to the encoder as they are
        if attention_mask is not None and attention_mask.dim() != 2:
            raise InputError(
                f"ESM's embeddings take a 2-D attention_mask [batch, seq]; got shape {tuple(attention_mask.shape)}"
            )
        embeddings = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds  # [b, q, H]
        q = embeddings.shape[1]
        if self.token_dropout and input_ids is not None:
            masked = input_ids == self.mask_token_id  # [b, q]
            embeddings = embeddings.masked_fill(masked[..., None], 0.0)
            mask_ratio_train = 0.15 * 0.8  # ESM's training runs: 15 % selected, 80 % of those masked
            lengths = attention_mask.sum(-1) if attention_mask is not None else input_ids.shape[1]
            observed = masked.sum(-1).float() / lengths  # [b]
            embeddings = (embeddings * (1 - mask_ratio_train) / (1 - observed)[:, None, None]).to(embeddings.dtype)
        if self.has_position_table:
            assert self.padding_idx is not None
            if position_ids is None and input_ids is not None:
                # RoBERTa's rule (fairseq's make_positions): real tokens count from pad + 1, padding stays at pad
                real = input_ids.ne(self.padding_idx).int()
                position_ids = ((torch.cumsum(real, dim=1).type_as(real) + past_length) * real).long()
                position_ids = position_ids + self.padding_idx
            elif position_ids is None:  # nothing says which embeddings are padding: sequential past the index
                start = self.padding_idx + 1 + past_length
                position_ids = torch.arange(start, start + q, device=embeddings.device)[None]
            embeddings = embeddings + self.position_embeddings(position_ids)
        if self.has_norm:
            embeddings = self.layer_norm(embeddings)
        if attention_mask is not None:
            embeddings = (embeddings * attention_mask[:, -q:, None]).to(embeddings.dtype)
        return embeddings


def check_esm_embeddings(config: Any, spec: Any, loc: str) -> list[str]:
    """ESM's embeddings are an encoder's (padding zeroed and token dropout counted over the whole mask); the contact
    head it carries reads every layer's every head."""
    issues = []
    if config.is_decoder:
        issues.append("the esm embedding is an encoder's (transformers' ESM has no KV cache); set is_decoder: false")
    features = getattr(spec, "contact_head_features", None)
    enc = config.encoder
    if features is not None and features != enc.num_layers * enc.attention.num_heads:
        issues.append(
            f"contact_head_features {features} must be num_layers × num_heads = {enc.num_layers} × "
            f"{enc.attention.num_heads} = {enc.num_layers * enc.attention.num_heads} (ESM's contact head reads "
            "every attention map)"
        )
    return issues


def build_esm_embeddings(
    *,
    vocab_size: int,
    hidden_size: int,
    pad_token_id: int | None,
    layer_norm_eps: float,
    position: PositionScheme,
    options: EsmEmbeddingOptions,
    **_: object,
) -> EsmEmbeddings:
    return EsmEmbeddings(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        pad_token_id=pad_token_id,
        layer_norm_eps=layer_norm_eps,
        position=position,
        options=options,
    )


def build_bert_embeddings(
    *,
    vocab_size: int,
    hidden_size: int,
    type_vocab_size: int,
    pad_token_id: int | None,
    layer_norm_eps: float,
    dropout: float,
    position: PositionScheme,
    options: BertEmbeddingOptions,
) -> BertEmbeddings:
    return BertEmbeddings(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        type_vocab_size=type_vocab_size,
        pad_token_id=pad_token_id,
        layer_norm_eps=layer_norm_eps,
        dropout=dropout,
        position=position,
        options=options,
    )


def bertblocks_register_components() -> list[Component]:
    return [
        Component(
            "embedding",
            "bert",
            build_bert_embeddings,
            BertEmbeddingOptions,
            description="token + type (+ position) → LN (→ projection)",
        ),
        Component(
            "embedding",
            "esm",
            build_esm_embeddings,
            EsmEmbeddingOptions,
            description="ESM: token (token_dropout rescaling) (+ position) (→ LN), padding zeroed, no dropout",
            validate=check_esm_embeddings,
        ),
    ]
