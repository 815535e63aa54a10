"""Checks every component kind gets, in a tiny model (a task model for a head): shapes and dtypes, padding,
batch independence, determinism, gradients, the checkpoint round trip and ``torch.compile``."""

from __future__ import annotations

import tempfile

import torch

from ...core.capabilities import PaddingReader
from ...core.interfaces import PositionBias
from ..assertions import close, close_outputs, expect, float_outputs, max_abs_diff, real_positions
from ..inputs import BATCH_LENGTH, SHORTEST_BATCH, infer, model_inputs
from ..subject import ATOL, TINY_CONFIG, ConformanceError, ConformanceSkip, Subject

#: a difference far above rounding (CONTRIBUTING.md: checks that outputs differ use a margin > 1e-3)
_DIFFERS = 1e-3


def check_shapes_and_dtypes(subject: Subject) -> None:
    """Outputs have BERT's shapes (leading dimensions those of the input), follow the model's dtype (float32
    and float64) and are finite."""
    hidden = TINY_CONFIG["hidden_size"]
    layers = TINY_CONFIG["encoder"]["num_layers"]
    for dtype in (torch.float32, torch.float64):
        model = subject.model().to(dtype)
        inputs = model_inputs(model)
        lead = tuple(inputs["attention_mask"].shape[:-1])
        b, q = inputs["input_ids"].shape[-2:]
        out = infer(model, **inputs, output_hidden_states=True)
        outputs = float_outputs(out)
        expect(bool(outputs), f"the output has no floating-point tensors: {list(out.keys())}")
        for name, value in outputs.items():
            expect(tuple(value.shape[: len(lead)]) == lead, f"{name} is {tuple(value.shape)}; must start with {lead}")
            expect(value.dtype == dtype, f"a {dtype} model returned a {value.dtype} {name}")
            expect(bool(torch.isfinite(value).all()), f"non-finite values in {name} ({dtype})")
        expect(len(out.hidden_states) == layers + 1, "hidden_states must hold the embeddings and every layer")
        if subject.kind == "head":
            continue
        seq = out.last_hidden_state
        expect(tuple(seq.shape) == (b, q, hidden), f"last_hidden_state is {tuple(seq.shape)}, not {(b, q, hidden)}")
        if out.pooler_output is not None:
            pooled = out.pooler_output
            expect(tuple(pooled.shape) == (b, hidden), f"pooler_output is {tuple(pooled.shape)}, not {(b, hidden)}")


#: what a failure caused by reading padded positions tells the author
_DECLARE_HINT = (
    " — if the component reads hidden states at padded positions on purpose (a convolution over the sequence), "
    "declare reads_padded_positions = True on it (automatic packing is then off; docs/plugins/hooks.md, "
    "'Capabilities')"
)


def _skip_if_reads_padding(subject: Subject) -> None:
    """A component that declares reading padded positions in the checks' batch reads padding by definition: the
    padding checks do not apply (``padding_declaration`` checks that the declaration is true)."""
    if subject.kind != "head":
        readers = subject.padding_readers(BATCH_LENGTH)
        if readers:
            raise ConformanceSkip(
                f"{', '.join(map(str, readers))} declare(s) reads_padded_positions in a batch of {BATCH_LENGTH} "
                "tokens: outputs depend on padded positions by declaration (checked by padding_declaration)"
            )


def check_padding_mask(subject: Subject) -> None:
    """Changing the tokens at padded positions changes no output at real positions (nor pooled ones)."""
    _skip_if_reads_padding(subject)
    model = subject.model()
    if getattr(getattr(model, "head", None), "pools_padded_positions", False):
        raise ConformanceSkip("the head declares pools_padded_positions: its pooled output reads a padded position")
    inputs = model_inputs(model)
    other = {k: v.clone() for k, v in inputs.items()}
    padded = inputs["attention_mask"] == 0
    g = torch.Generator().manual_seed(1)
    other["input_ids"][padded] = torch.randint(1, 99, (int(padded.sum()),), generator=g)
    other["token_type_ids"][padded] = 1 - other["token_type_ids"][padded]
    try:
        close_outputs(
            "outputs after changing padded tokens",
            infer(model, **other),
            infer(model, **inputs),
            inputs["attention_mask"],
        )
    except ConformanceError as error:
        raise ConformanceError(f"{error}{_DECLARE_HINT}") from None


def check_padding_declaration(subject: Subject) -> None:
    """The declaration ``reads_padded_positions`` (or ``reads_padded_positions_above``) is true, whichever way it
    goes, at every length where it decides.

    The lengths: the checks' batch, and for each ``reads_padded_positions_above = N`` the lengths ``N`` and
    ``N + 1`` (where the tiny model takes them: ``N + 1`` tokens within its ``max_position_embeddings``, ``N`` at
    least the shortest batch the checks make), so that a threshold set too high or too low fails. At each length:

    - no declaration reads padding there: the packed path (``encoder.packing: always``) gives the padded path's
      outputs at real tokens (a difference means the component reads padded positions, which a packed batch has
      zeros at, without saying so), and ``encoder.packing: auto`` may pack that length;
    - one does: the two paths differ (else the declaration turns packing off for nothing), ``auto`` does not pack
      (it gives the padded path's outputs) and ``packing_off_reason`` names the component.

    A head's declaration is about its loss (question answering's softmax spans the padding) and is checked for its
    effect only (the reason names it).
    """
    readers = subject.padding_readers()
    padded = subject.on("never").model()
    packed = subject.on("always").model()  # the same seed: the same weights
    # auto's own model where something is declared (its outputs are compared); the declarations, and so what auto
    # packs, are the same in every model of the component
    auto = subject.on(None).model() if readers else padded
    backbone = getattr(auto, "bert", auto)
    reason = backbone.packing_off_reason or ""
    expect(
        all(str(reader) in reason for reader in readers),
        f"{', '.join(map(str, readers))} declare(s) reads_padded_positions, but the model's packing_off_reason does "
        f"not name them: {reason!r}",
    )
    if subject.kind == "head" and readers:
        return
    longest = padded.config.max_position_embeddings
    lengths = {BATCH_LENGTH}
    for reader in readers:
        if reader.above:
            lengths |= {n for n in (reader.above, reader.above + 1) if SHORTEST_BATCH <= n <= longest}
    for length in sorted(lengths):
        _check_declaration_at(length, subject.padding_readers(length), padded, packed, auto, backbone)


def _check_declaration_at(
    length: int,
    readers: list[PaddingReader],
    padded: torch.nn.Module,
    packed: torch.nn.Module,
    auto: torch.nn.Module,
    backbone: torch.nn.Module,
) -> None:
    """:func:`check_padding_declaration` on a batch padded to ``length`` tokens, where ``readers`` read padding."""
    inputs = model_inputs(padded, length=length)
    want, got = float_outputs(infer(padded, **inputs)), float_outputs(infer(packed, **inputs))
    mask = inputs["attention_mask"]
    diffs = {name: max_abs_diff(real_positions(got[name], mask), real_positions(want[name], mask)) for name in want}
    diff = max(diffs.values(), default=0.0)
    batch = f"a batch of {length} tokens"
    if readers:
        named = ", ".join(map(str, readers))
        fix = (
            f"raise reads_padded_positions_above to {length} or more"
            if all(reader.above for reader in readers)
            else "remove it"
        )
        expect(
            diff > _DIFFERS,
            f"{named} declare(s) reads_padded_positions in {batch}, but the packed and padded paths agree at real "
            f"tokens (max abs difference {diff:.3g}): the declaration turns packing off for nothing; {fix}",
        )
        expect(
            not backbone.auto_packs(length), f"{named} read(s) padding in {batch}, but encoder.packing: auto packs it"
        )
        close_outputs(
            f"encoder.packing: auto (not packing {batch}, by declaration) vs padded", infer(auto, **inputs), want, mask
        )
        return
    worst = max(diffs, key=lambda name: diffs[name]) if diffs else ""
    above = [reader for reader in backbone.padding_readers if reader.above]
    threshold = (
        f"; {', '.join(map(str, above))} declare(s) reads_padded_positions_above, a threshold of {length} or more: "
        f"lower it below {length}"
        if above
        else ""
    )
    expect(
        diff <= ATOL,
        f"packing changes the outputs at real tokens in {batch} ({worst}: max abs difference {diff:.3g} > {ATOL:g}): "
        f"the component reads hidden states at padded positions, which a packed batch does not have{threshold}"
        f"{_DECLARE_HINT}{_per_sequence_hint(packed)}",
    )
    expect(
        backbone.auto_packs(length),
        f"no component declares reading padded positions in {batch}, but encoder.packing: auto does not pack it "
        f"({backbone.packing_off_reason})",
    )


def _per_sequence_hint(model: torch.nn.Module) -> str:
    """For a model whose packed attention went per sequence: the position terms that declared it, which are as
    likely a cause (a term that is not the same computed over each sequence alone)."""
    declared = sorted(
        {type(m).__name__ for m in model.modules() if isinstance(m, PositionBias) and m.packs_per_sequence()}
    )
    if not declared:
        return ""
    return (
        f"; or a position term declares per_sequence but its term over one packed sequence alone differs from the "
        f"padded term's corner ({', '.join(declared)}: docs/plugins/hooks.md, 'Packed without re-padding')"
    )


def check_batch_independence(subject: Subject) -> None:
    """Each example gives the same outputs alone (without its padding) as inside a padded batch."""
    _skip_if_reads_padding(subject)
    model = subject.model()
    inputs = model_inputs(model)
    together = infer(model, **inputs)
    mask = inputs["attention_mask"]
    for i in range(mask.shape[0]):
        n = int(mask[i].sum()) if mask.dim() == 2 else mask.shape[-1]  # choices keep their shared length
        alone = infer(model, **{k: v[i : i + 1, ..., :n] for k, v in inputs.items()})
        row = {k: v[i : i + 1] for k, v in float_outputs(together).items()}
        for name, value in float_outputs(alone).items():
            want = row[name]
            if value.shape != want.shape and mask.dim() == 2:  # per-token: the real positions of the row (as
                want = want[:, : value.shape[1]]  # many as alone: BGE-M3's ColBERT vectors skip the first token)
            close(f"example {i} alone vs in the batch ({name})", value, want)


def check_determinism(subject: Subject) -> None:
    """Dropout off means the same answer: two eval runs agree exactly, and training mode with every dropout
    probability at zero agrees with eval mode."""
    model = subject.model()
    inputs = model_inputs(model)
    first, second = float_outputs(infer(model, **inputs)), float_outputs(infer(model, **inputs))
    for name, value in first.items():
        expect(torch.equal(value, second[name]), f"two eval-mode runs on the same input differ ({name})")
    quiet = subject.without_dropout(model)
    eval_out = infer(quiet.eval(), **inputs)
    close_outputs(
        "training mode with dropout 0 vs eval mode", infer(quiet.train(), **inputs), eval_out, inputs["attention_mask"]
    )


def check_gradients(subject: Subject) -> None:
    """Every parameter receives a finite gradient (an unused parameter breaks DDP)."""
    model = subject.model().train()
    outputs = float_outputs(model(**model_inputs(model)))
    loss = sum(value.pow(2).mean() for value in outputs.values())
    loss.backward()  # type: ignore[union-attr]
    unused = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    expect(not unused, f"parameters without a gradient (unused; DDP would fail): {', '.join(unused)}")
    bad = [name for name, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    expect(not bad, f"non-finite gradients: {', '.join(bad)}")


def check_checkpoint_roundtrip(subject: Subject) -> None:
    """``save_pretrained`` then ``from_pretrained`` gives the same model: no missing or unexpected keys, the same
    outputs (the component's options travel in ``config.json``)."""
    model = subject.model(seed=3)
    inputs = model_inputs(model)
    with tempfile.TemporaryDirectory() as directory:
        model.save_pretrained(directory)  # type: ignore[operator]
        loaded, info = subject.reload(directory)
    expect(not info.missing_keys, f"keys missing after the round trip: {info.missing_keys}")
    expect(not info.unexpected_keys, f"unexpected keys after the round trip: {info.unexpected_keys}")
    expect(loaded.config == model.config, "the config changed in the round trip")
    close_outputs(
        "outputs after save/load", infer(loaded.eval(), **inputs), infer(model, **inputs), inputs["attention_mask"]
    )


#: what torch.compile raises (or says in the error it raises) when code needs the value of a data-dependent size
_DATA_DEPENDENT = (
    "GuardOnDataDependentSymNode",
    "DataDependentOutputException",
    "DynamicOutputShapeException",
    "data-dependent",
    "data dependent",
)


def data_dependent_failure(error: BaseException) -> str | None:
    """The compiler's line about a data-dependent size if ``error`` (or an exception it chains) is one, else
    ``None``."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = f"{type(current).__name__}: {current}"
        if any(marker in text for marker in _DATA_DEPENDENT):
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            return next((line for line in lines if any(m in line for m in _DATA_DEPENDENT)), lines[0])
        current = current.__cause__ or current.__context__
    return None


def check_compile(subject: Subject, backend: str | None = None) -> None:
    """``torch.compile(dynamic=True)`` (graph breaks allowed) runs the model on a packed batch and matches eager
    mode.

    The packed path is the one a compiled model takes under ``encoder.packing: auto`` (it packs every padded
    batch; see :mod:`bertblocks.core.packing`): the component gets ``[1, T, H]`` hidden states whose token count
    ``T`` is a data-dependent size. Code that needs its value fails to compile, and the failure says so in plain
    words with the fix. A model holding a component that declares reading padded positions in the checks' batch
    (``reads_padded_positions``, or ``reads_padded_positions_above`` a shorter length) does not pack it: it is
    compiled on the padded path. ``backend`` defaults to the subject's ``compile_backend``: ``inductor``
    generates and compiles C++ (seconds per model); ``aot_eager`` traces the same graphs (where plugins break)
    without code generation.
    """
    import torch._dynamo

    backend = backend or subject.compile_backend
    readers = subject.padding_readers(BATCH_LENGTH)
    packing = "never" if readers else "always"
    path = "padded path (it declares reads_padded_positions)" if readers else "packed path"
    cfg = subject.on(packing).config()
    cfg["encoder"]["num_layers"] = 1  # tracing time grows with the (unrolled) layers; one shows the component
    model = subject.model(config=cfg)
    inputs = model_inputs(model)
    want = infer(model, **inputs)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend=backend, dynamic=True)
        got = infer(compiled, **inputs)
    except Exception as error:
        line = data_dependent_failure(error)
        if line is None:
            raise
        raise ConformanceError(
            f"torch.compile(dynamic=True) failed on the {path}: the component needs the value of a data-dependent "
            "size. In a compiled packed batch the token count T (hidden states [1, T, H]) is only known when the "
            "graph runs, so code that branches on it (`if x.shape[1] == 1`), reads it (`.item()`, `int(...)`, "
            "`.tolist()`), indexes with a boolean mask, or calls an op that specialises on size 1 cannot be traced. "
            "Fix: write the computation for every T without branching on it (loop over a fixed dimension, such as "
            "groups or heads, not over tokens; use reshape/matmul on the whole [T, ...] tensor), or state what "
            "holds with torch._check(...); a component that needs the padded layout declares "
            f"reads_padded_positions instead. The compiler said: {line}"
        ) from error
    finally:
        torch._dynamo.reset()
    close_outputs(
        f"torch.compile(backend={backend!r}, dynamic=True) on the {path} vs eager", got, want, inputs["attention_mask"]
    )
