"""Checks every component kind gets, in a tiny model (a task model for a head): shapes and dtypes, padding,
batch independence, determinism, gradients, the checkpoint round trip and ``torch.compile``."""

from __future__ import annotations

import tempfile

import torch

from ...core.interfaces import PositionBias
from ..assertions import close, close_outputs, expect, float_outputs, max_abs_diff, real_positions
from ..inputs import infer, model_inputs
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
    """A component declared ``reads_padded_positions`` reads padding by definition: the padding checks do not
    apply (``padding_declaration`` checks that the declaration is true)."""
    if subject.kind != "head":
        readers = subject.padding_readers()
        if readers:
            raise ConformanceSkip(
                f"{', '.join(readers)} declare(s) reads_padded_positions: outputs depend on padded positions by "
                "declaration (checked by padding_declaration)"
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
    """The declaration ``reads_padded_positions`` is true, whichever way it goes.

    Undeclared: the packed path (``encoder.packing: always``) gives the padded path's outputs at real tokens;
    a difference means the component reads padded positions (a packed batch has zeros there) without saying so.
    Declared: the two paths differ (else the declaration turns packing off for nothing), and ``encoder.packing:
    auto`` does not pack, naming the component in ``packing_off_reason``. A head's declaration is about its loss
    (question answering's softmax spans the padding) and is checked for its effect only.
    """
    readers = subject.padding_readers()
    padded = subject.on("never").model()
    packed = subject.on("always").model()  # the same seed: the same weights
    inputs = model_inputs(padded)
    want, got = float_outputs(infer(padded, **inputs)), float_outputs(infer(packed, **inputs))
    mask = inputs["attention_mask"]
    diffs = {name: max_abs_diff(real_positions(got[name], mask), real_positions(want[name], mask)) for name in want}
    diff = max(diffs.values(), default=0.0)
    if readers:
        auto = subject.on(None).model()
        reason = getattr(auto, "bert", auto).packing_off_reason or ""
        expect(
            all(reader in reason for reader in readers),
            f"{', '.join(readers)} declare(s) reads_padded_positions, but the model's packing_off_reason does not "
            f"name them: {reason!r}",
        )
        if subject.kind == "head":
            return
        expect(
            diff > _DIFFERS,
            f"{', '.join(readers)} declare(s) reads_padded_positions, but the packed and padded paths agree at real "
            f"tokens (max abs difference {diff:.3g}): the declaration turns packing off for nothing; remove it",
        )
        close_outputs(
            "encoder.packing: auto (not packing, by declaration) vs padded", infer(auto, **inputs), want, mask
        )
        return
    worst = max(diffs, key=lambda name: diffs[name]) if diffs else ""
    expect(
        diff <= ATOL,
        f"packing changes the outputs at real tokens ({worst}: max abs difference {diff:.3g} > {ATOL:g}): the "
        f"component reads hidden states at padded positions, which a packed batch does not have{_DECLARE_HINT}"
        f"{_per_sequence_hint(packed)}",
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
    words with the fix. A model holding a component that declares ``reads_padded_positions`` is never packed: it
    is compiled on the padded path. ``backend`` defaults to the subject's ``compile_backend``: ``inductor``
    generates and compiles C++ (seconds per model); ``aot_eager`` traces the same graphs (where plugins break)
    without code generation.
    """
    import torch._dynamo

    backend = backend or subject.compile_backend
    readers = subject.padding_readers()
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
