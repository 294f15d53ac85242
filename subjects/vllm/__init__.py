"""The ``vllm`` subject: vLLM 0.33.0's own code adapted to the suite's contracts.

``bridge`` (vLLM's lazy import, errors, backend mapping), one module per contract (``nvfp4_moe``,
``mxfp4_linear``, ``shared_expert``, ``mxfp4_moe``, ``sharding``), ``ledger`` (its known upstream bugs) and
``subject`` (the registration, which ``subjects.registry`` imports).
"""
