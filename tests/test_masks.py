"""The hidden value of every additive mask (``bertblocks/core/masks.py``): ``finfo.min / 2``, one mechanism.

Why: CUDA's memory-efficient SDPA kernel scales the masked scores by ``log2(e)`` before an ``exp2`` softmax. A row
whose every key is hidden at transformers' ``finfo.min`` overflowed to ``-inf`` there and came out as zeros (seen on
an H100), where eager attention and transformers give the uniform softmax. No GPU is needed to show it: the kernel's
arithmetic is written out below and run on CPU, next to CPU SDPA, on the masks every path of the model builds.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bertblocks.core.masks import additive_mask, causal_additive, causal_mask, hidden_value, is_hidden
from tests.tolerances import assert_close

PACKAGE = Path(__file__).parents[1] / "bertblocks"
LOG2E = math.log2(math.e)
#: a use of ``torch.finfo(dtype).min`` in source
OWN_MINIMUM_USE = re.compile(r"finfo\([^)]*\)\.min")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def memory_efficient_softmax(scores: torch.Tensor) -> torch.Tensor:
    """The softmax as CUDA's memory-efficient SDPA kernel computes it: float32 scores (mask added) times ``log2(e)``,
    then ``exp2`` of each minus its row's maximum."""
    x = scores.float() * LOG2E
    e = torch.exp2(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def _padding() -> torch.Tensor:
    """``[3, 6]``: a full row, a right-padded one, and a row of padding only (an all-padding row of a batch)."""
    return torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0]])


#: every constructor the model's paths hide keys with: name → (padding → additive mask [b, 1, q|1, k], 0/1 visibility)
MASKS: dict[str, Callable[[torch.dtype], tuple[torch.Tensor, torch.Tensor]]] = {
    # the encoder's padding mask: row 2 hides every key
    "padding [b, 1, 1, k]": lambda dtype: (additive_mask(_padding(), dtype), _padding()[:, None, None, :]),
    # DeBERTa's both-sided padding (the encoder's masks_padded_queries branch): padded queries see no key
    "padded queries [b, 1, q, k]": lambda dtype: (
        additive_mask(_padding()[:, :, None] * _padding()[:, None, :], dtype),
        (_padding()[:, :, None] * _padding()[:, None, :])[:, None],
    ),
    # a left-padded decoder: its first queries see padding and the future only
    "causal, left-padded [b, 1, q, k]": lambda dtype: (
        causal_mask(_padding().flip(-1), 3, 6, 0, dtype, torch.device("cpu")),
        (torch.ones(6, 6).tril().bool() & _padding().flip(-1)[:, None, :].bool())[:, None].long(),
    ),
    # the backends' causal term (no row hidden whole: only the finite and hidden checks apply)
    "causal term [q, k]": lambda dtype: (
        causal_additive(6, 6, dtype, torch.device("cpu"))[None, None],
        torch.ones(6, 6).tril()[None, None].long(),
    ),
}


def _scores(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 6, 8, generator=g).to(dtype) for _ in range(3))
    return q, k, v


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", MASKS)
def test_every_mask_hides_at_half_finfo_min_and_reads_back_hidden(name, dtype):
    mask, visible = MASKS[name](dtype)
    assert mask.dtype == dtype
    assert torch.equal(is_hidden(mask), ~visible.bool().expand(mask.shape))
    assert set(mask.unique().tolist()) <= {0.0, hidden_value(dtype)}
    # the kernel's log2(e) product stays finite: finfo.min (transformers' value) overflows there in float32/bfloat16
    assert torch.isfinite(mask.float() * LOG2E).all()
    # a bias (a relative-position term, ALiBi) added to a hidden entry keeps it hidden, and a visible one visible
    bias = torch.linspace(-500, 500, mask.shape[-1]).to(dtype)
    assert torch.equal(is_hidden(mask + bias), is_hidden(mask))
    assert torch.isfinite(mask + bias).all()  # finfo.min + (-500) is -inf in float16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", [name for name in MASKS if name != "causal term [q, k]"])
def test_an_all_masked_row_gives_the_uniform_softmax_on_every_kernel(name, dtype):
    """Through the mask constructor: CUDA's memory-efficient arithmetic and CPU SDPA both give a fully hidden row the
    uniform softmax (the mean of the values), as eager attention and transformers do; every other row gets
    exactly what transformers' ``finfo.min`` mask gives it."""
    mask, visible = MASKS[name](dtype)
    q, k, v = _scores(dtype)
    scale = 8**-0.5
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale + mask.float()  # [3, 2, 6, 6]
    blind = ~visible.bool().expand(scores.shape).any(-1)  # [3, 2, 6]: rows that see no key
    assert blind.any()
    assert (~blind).any()

    probs = memory_efficient_softmax(scores)
    uniform = torch.full_like(probs[blind], 1 / 6)
    assert torch.equal(probs[blind], uniform)  # every score of the row rounds to the hidden value: exactly 1/6
    # transformers' finfo.min overflows in that kernel: the row is lost (NaN here; zeros from the CUDA kernel)
    hf_mask = (1 - visible.expand(mask.shape).to(dtype)) * torch.finfo(dtype).min
    hf_scores = (q.float() @ k.float().transpose(-1, -2)) * scale + hf_mask.float()
    assert not torch.isfinite(memory_efficient_softmax(hf_scores)[blind]).any()
    # rows with a visible key: the same probabilities as transformers' mask (exp of either hidden score is 0)
    assert_close(probs[~blind], torch.softmax(hf_scores, -1)[~blind])
    assert torch.equal(torch.softmax(scores, -1)[~blind], torch.softmax(hf_scores, -1)[~blind])  # same kernel

    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # CPU SDPA, in the model's dtype
    mean = v.float().mean(-2, keepdim=True).expand(v.shape)
    rows = blind[..., None].expand(out.shape)
    assert_close(out.float()[rows], mean[rows], atol=1e-5 if dtype == torch.float32 else 2e-2)
    if dtype == torch.float32:
        reference = F.scaled_dot_product_attention(q, k, v, attn_mask=hf_mask, scale=scale)
        assert torch.equal(out[~rows], reference[~rows])  # the same kernel: masked probabilities are 0 either way


#: the modules that may use ``finfo(dtype).min`` themselves, and why: neither is an attention mask
OWN_MINIMUM = {
    "bertblocks/core/masks.py": "the one place the hidden value is defined",
    "bertblocks/sentence.py": "ColBERT's max over token similarities (an amax, no softmax: nothing scales it)",
    "bertblocks/plugins/heads/pooling.py": "max pooling's fill of padded positions (an amax, no softmax)",
    "bertblocks/testing/checks/backend.py": "inputs of a plugin backend's checks: transformers' masks must work too",
}


def test_no_module_hides_scores_with_its_own_finfo_min():
    """A new attention path that masks with ``torch.finfo(dtype).min`` itself would give fully hidden rows zeros on
    CUDA's memory-efficient kernel: it must take :func:`hidden_value` (and read masks with :func:`is_hidden`)."""
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{number}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if str(path.relative_to(PACKAGE.parent)) not in OWN_MINIMUM
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if OWN_MINIMUM_USE.search(line)
    ]
    assert not found, f"finfo(...).min outside bertblocks/core/masks.py: {found}; use core.masks.hidden_value"


def test_the_scan_finds_a_planted_finfo_min():
    assert OWN_MINIMUM_USE.search("mask = mask.masked_fill(~allowed, torch.finfo(query.dtype).min)")
    assert not OWN_MINIMUM_USE.search("mask = mask.masked_fill(~allowed, hidden_value(query.dtype))")
