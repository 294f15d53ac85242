"""The ``sglang`` subject (SGLang 0.5.23's own code adapted to the suite's contracts) and, in ``dsv4``, the
``sglang-deepseek-v4`` subject (its DeepSeek-V4 FP4 expert path).

``bridge`` (SGLang's lazy import, errors, backend mapping), ``layer`` (a real ``FusedMoE`` under SGLang's test
hooks), one module per contract (``nvfp4_moe``, ``mxfp4_linear``, ``mxfp4_moe``, ``sharding``), ``ledger`` (its
known upstream bugs) and ``subject`` (the registration, which ``subjects.registry`` imports).
"""
