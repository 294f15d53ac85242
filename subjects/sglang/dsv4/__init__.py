"""The ``sglang-deepseek-v4`` subject: SGLang 0.5.23's DeepSeek-V4 FP4 expert methods under ``Fp8Config``.

``bridge`` (the path's modules and symbols, stand-ins, backend mapping), ``mxfp4_moe``, ``sharding``, ``ledger``
and ``subject`` (the registration, which ``subjects.registry`` imports).
"""
