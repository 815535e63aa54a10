"""Varlen attention: the kernels that attend a packed batch ``[T, h, d]``, each token seeing only the keys of its
own sequence (``cu_seqlens`` marks the sequences; see :mod:`bertblocks.core.packing`).

* :mod:`~bertblocks.plugins.varlen.sdpa`: one unmasked SDPA call per run of equal lengths (the reference, every
  device), and the custom op ``bertblocks::sdpa_varlen`` that holds that loop inside a compiled graph;
* :mod:`~bertblocks.plugins.varlen.flex`: one ``flex_attention`` call with a document block mask;
* :mod:`~bertblocks.plugins.varlen.flash`: FlashAttention's varlen kernel on a CUDA GPU (a re-padded masked call
  where it cannot serve);
* :mod:`~bertblocks.plugins.varlen.kernels`: the three by name, and which one ``varlen_kernel: auto`` runs per
  device type (the ``sdpa`` backend asks it once, when built);
* :mod:`~bertblocks.plugins.varlen.biased`: the custom op ``bertblocks::sdpa_varlen_biased``, a score term per
  sequence (relative positions, ALiBi) attended packed inside a compiled graph.
"""
