"""The conformance checks, one module per component kind they concern (``model``: the checks every kind gets in
a tiny model; ``cache``: decoding through the KV cache). Each check is a function of a
:class:`~bertblocks.testing.subject.Subject` that raises a ``ConformanceError`` or a ``ConformanceSkip``;
:data:`bertblocks.testing.CHECKS` lists them with the kinds they apply to."""
