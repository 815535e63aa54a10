"""bertblocks-alibi: an example third-party bertblocks plugin.

It adds two components through the ``bertblocks`` entry-point group (see ``plugin.py``):

* position scheme ``alibi``: per-head linear distance biases (Press et al. 2022, "Train Short, Test Long"),
  no position embedding;
* attention backend ``local``: sliding-window attention, each query sees keys at most ``window`` positions
  away.

It depends on bertblocks' core API only (``bertblocks.core.*``), as any third-party plugin should.
"""

from __future__ import annotations

from .alibi import AlibiBias, AlibiOptions, AlibiPositions, alibi_slopes
from .local import LocalAttentionBackend, LocalOptions, band_mask

__version__ = "0.1.0"

__all__ = [
    "AlibiBias",
    "AlibiOptions",
    "AlibiPositions",
    "LocalAttentionBackend",
    "LocalOptions",
    "alibi_slopes",
    "band_mask",
]
