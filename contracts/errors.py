"""Errors that cross layers: a missing library or hardware, and a policy's refusal."""

from __future__ import annotations


class LibraryUnavailable(RuntimeError):
    """A library (or the hardware one of its kernels needs) is not present.

    Raised by adapters; the runner turns it into a skip whose reason names what is missing.
    """


class UnsupportedConfig(Exception):
    """A policy refuses a configuration (for example vLLM's NotImplementedError for gated CUTLASS)."""
