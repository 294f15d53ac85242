"""Errors that cross layers: a missing library or hardware, and a policy's refusal."""

from __future__ import annotations


class LibraryUnavailable(RuntimeError):
    """A library (or the hardware one of its kernels needs) is not present.

    Raised by adapters; the runner turns it into a skip whose reason names what is missing.
    """


class VersionGate(LibraryUnavailable):
    """The installed library predates an API a property needs; the message names the version that has it."""


class UnsupportedConfig(Exception):
    """A policy refuses a configuration (for example vLLM's NotImplementedError for gated CUTLASS)."""


class CheckpointNotServed(UnsupportedConfig):
    """An engine path has no loader for a checkpoint's form (its models store no such checkpoint, e.g. expert
    biases on a path whose methods allocate none): the properties record the example as not served and draw
    another, instead of counting a refusal of a real shape."""


class GuardViolation(Exception):
    """A policy broke a rule that holds for every protocol call (it wrote to the tensors it was handed, ...).

    Raised by the suite's own guards around the policy (:mod:`harness.inputs`), never by a library: it is
    not an ``AssertionError`` and no ledger entry (:class:`subjects.registry.KnownFailure`) absorbs it, so
    an upstream bug recorded as an expected assertion failure cannot hide it.
    """
