"""``GroupedLinear`` (bertblocks/plugins/grouped_linear.py), the one grouped projection of ConvBERT and SqueezeBERT:
its output and every gradient equal the product written out group by group, in both weight layouts, with and without
a bias (the bias is added inside the batched product, so its gradient comes from that product's backward)."""

from __future__ import annotations

import pytest
import torch

from bertblocks.plugins.grouped_linear import GroupedLinear
from tests.tolerances import assert_close


@pytest.mark.parametrize("layout", ["blocks", "conv1d"])
@pytest.mark.parametrize("bias", [True, False])
def test_outputs_and_gradients_are_each_group_through_its_own_weight(layout: str, bias: bool):
    torch.manual_seed(0)
    layer = GroupedLinear(6, 9, groups=3, bias=bias, layout=layout).double()
    layer.reset_parameters_like_hf(0.5)
    if bias:
        with torch.no_grad():
            layer.bias.normal_()
    x = torch.randn(2, 5, 6, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(2, 5, 9, dtype=torch.float64)

    out = layer(x)
    out.backward(grad)
    got = (out.detach(), x.grad, layer.weight.grad, layer.bias.grad if bias else None)

    # written out, from copies of the same leaves: slice g of the input through group g's [in/g, out/g] block,
    # the groups' outputs side by side, then the bias
    x2 = x.detach().clone().requires_grad_()
    weight = layer.weight.detach().clone().requires_grad_()
    b = layer.bias.detach().clone().requires_grad_() if bias else None
    blocks = weight if layout == "blocks" else weight[..., 0].view(3, 3, 2).transpose(1, 2)  # [g, in/g, out/g]
    expected = torch.cat([x2[..., 2 * g : 2 * (g + 1)] @ blocks[g] for g in range(3)], dim=-1)
    if b is not None:
        expected = expected + b
    expected.backward(grad)

    assert_close(got[0], expected.detach())
    assert_close(got[1], x2.grad)
    assert_close(got[2], weight.grad)
    if bias:
        assert_close(got[3], b.grad)
    else:
        assert layer.bias is None
