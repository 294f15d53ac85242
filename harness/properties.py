"""Properties written once: a bare check, and the Hypothesis test generated from it.

A property is one function ``check_NAME(config, backend, policy)`` that raises on a violation.
The :func:`check` decorator records its contract and configuration type and, given a strategy,
generates the pytest test ``test_NAME`` in the same module; the reproduction command
(``python -m harness.repro MODULE:check_NAME ...``) and the bench call the bare check. Usage::

    @check(CONTRACT, MoeShape, strategy=moe_shapes(), pins=REGRESSIONS, backends=ALL_BACKENDS)
    def check_padding_invariance(shape: MoeShape, backend: MoeBackend, policy: MoeAlignment) -> None:
        '''Padding never changes the MoE output.'''
        ...

generates (and adds to the module) the equivalent of::

    @pytest.mark.backends()
    @given(shape=moe_shapes())
    @pinned_examples("shape", REGRESSIONS)
    def test_padding_invariance(shape, backend, policy, request):
        run_check(check_padding_invariance, shape, backend, policy, state=..., nodeid=...)

The configuration argument is the check's first parameter, so Hypothesis and the printed
falsifying example use its name. One check may back several tests (other strategies, other
backends): :func:`property_test` makes each extra one. Module-level ``pytestmark`` applies as to
any test. Old-style modules (``@check(CONTRACT, Config)`` without a strategy plus a hand-written
``@given`` test calling :func:`harness.runner.run_check`) keep working.
"""

from __future__ import annotations

import enum
import inspect
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from hypothesis import currently_in_test_context, event, example, given, target
from hypothesis.strategies import SearchStrategy

from harness.runner import RUN_STATE, note_error, run_check
from strategies.pins import pinned_examples

F = TypeVar("F", bound=Callable[..., None])


class _AllBackends(enum.Enum):
    ALL = "all"


ALL_BACKENDS = _AllBackends.ALL
"""``backends=ALL_BACKENDS``: run on every backend of the check's contract (``--backend`` filters)."""


@dataclass(frozen=True)
class PropertySpec:
    """How a generated test runs its check (the arguments of :func:`property_test`, marks by name)."""

    pins: tuple[Any, ...]
    examples: tuple[Any, ...]
    strategy: SearchStrategy[Any]
    backends: Sequence[enum.Enum] | _AllBackends | None
    kernel: bool
    kernel_backends: bool | None
    marks: tuple[str, ...]


def record_event(text: str) -> None:
    """``hypothesis.event`` inside a Hypothesis test, nothing in a standalone reproduction."""
    if currently_in_test_context():
        event(text)


def record_target(value: float, label: str) -> None:
    """``hypothesis.target`` inside a Hypothesis test (steers generation towards large ``value``)."""
    if currently_in_test_context():
        target(value, label=label)


def record_error(ratio: float, label: str) -> None:
    """A kernel check's error on this example as a fraction of its bound (1.0: at the bound, 0.0: exact): a
    Hypothesis ``target`` under ``label``, and the largest over the test's examples is its execution record's
    ``worst_error`` (:func:`harness.runner.note_error`)."""
    record_target(ratio, label)
    note_error(ratio)


def check(
    contract: str,
    config: type,
    *,
    strategy: SearchStrategy[Any] | None = None,
    pins: Iterable[Any] = (),
    examples: Iterable[Any] = (),
    backends: Sequence[enum.Enum] | _AllBackends | None = None,
    kernel: bool = False,
    kernel_backends: bool | None = None,
    marks: Iterable[pytest.MarkDecorator] = (),
    settings: Callable[[Any], Any] | None = None,
    fixtures: Sequence[str] = (),
) -> Callable[[F], F]:
    """Declare ``fn(config, backend, policy)`` a property of ``contract`` on ``config`` instances.

    The decorated function is returned unchanged (the bare check). With a ``strategy`` it also
    generates ``test_NAME`` for ``check_NAME`` in the defining module, see :func:`property_test`
    for the keyword arguments.
    """

    def deco(fn: F) -> F:
        fn.__fp4_check__ = (contract, config)  # type: ignore[attr-defined]
        if strategy is not None:
            _register(
                fn,
                sys._getframe(1).f_globals,
                name=None,
                strategy=strategy,
                pins=pins,
                examples=examples,
                backends=backends,
                kernel=kernel,
                kernel_backends=kernel_backends,
                marks=marks,
                settings=settings,
                fixtures=fixtures,
            )
        return fn

    return deco


def property_test(
    fn: Callable[..., None],
    *,
    strategy: SearchStrategy[Any],
    name: str | None = None,
    pins: Iterable[Any] = (),
    examples: Iterable[Any] = (),
    backends: Sequence[enum.Enum] | _AllBackends | None = None,
    kernel: bool = False,
    kernel_backends: bool | None = None,
    marks: Iterable[pytest.MarkDecorator] = (),
    settings: Callable[[Any], Any] | None = None,
    fixtures: Sequence[str] = (),
    namespace: dict[str, Any] | None = None,
) -> Callable[..., None]:
    """Generate the Hypothesis test of the check ``fn`` and add it to the calling module (or to the module
    whose globals are ``namespace``: a helper generating tests for the test module that calls it).

    * ``strategy`` draws the configuration; ``name`` is the test's name (default: ``check_NAME``
      gives ``test_NAME``; a second test from one check needs its own);
    * ``pins``: pinned regressions, run first as ``@example`` when they match ``--model/--tp/--ep``
      (:func:`strategies.pins.pinned_examples`); ``examples``: ``@example`` configurations always run;
    * ``backends``: None (the check ignores the backend and gets None), ``ALL_BACKENDS`` (every
      backend of the contract) or a sequence of backend members; parametrized by the plugin
      from the backend records through the ``backends`` marker, so ``--backend`` selects among
      them and each parameter carries its record's requirement markers;
    * ``kernel``: the check runs a GPU kernel: only backends whose record has a kernel runner
      (with its ``kernel_requires`` markers), and its reproduction is written before each example;
      ``kernel_backends=False`` keeps the reproduction but not the record selection (a device op
      that is not the backend's kernel, whose requirement ``marks`` name);
    * ``marks``: pytest marks (requirements such as ``pytest.mark.sm100``); ``settings``: a
      ``hypothesis.settings`` object for this test; ``fixtures``: extra fixtures to request
      (for their side effects; they are not passed to the check).

    Returns the test (already bound in the module under its name).
    """
    return _register(
        fn,
        sys._getframe(1).f_globals if namespace is None else namespace,
        name=name,
        strategy=strategy,
        pins=pins,
        examples=examples,
        backends=backends,
        kernel=kernel,
        kernel_backends=kernel_backends,
        marks=marks,
        settings=settings,
        fixtures=fixtures,
    )


def _register(
    fn: Callable[..., None],
    namespace: dict[str, Any],
    *,
    name: str | None,
    strategy: SearchStrategy[Any],
    pins: Iterable[Any],
    examples: Iterable[Any],
    backends: Sequence[enum.Enum] | _AllBackends | None,
    kernel: bool,
    kernel_backends: bool | None,
    marks: Iterable[pytest.MarkDecorator],
    settings: Callable[[Any], Any] | None,
    fixtures: Sequence[str],
) -> Callable[..., None]:
    if not hasattr(fn, "__fp4_check__"):
        raise TypeError(f"{fn.__name__} is not a @check")
    name = name or "test_" + fn.__name__.removeprefix("check_")
    if name in namespace:
        raise ValueError(f"{namespace.get('__name__')}.{name} already exists; pass property_test(name=...)")
    argname = next(iter(inspect.signature(fn).parameters))
    with_backend = backends is not None
    params = [argname, *(["backend"] if with_backend else []), "policy", "request", *fixtures]

    def test(**kwargs: Any) -> None:
        __tracebackhide__ = True
        request: pytest.FixtureRequest = kwargs["request"]
        run_check(
            fn,
            kwargs[argname],
            kwargs.get("backend"),
            kwargs["policy"],
            kernel=kernel,
            state=request.config.stash.get(RUN_STATE, None),
            nodeid=request.node.nodeid,
        )

    test.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY) for p in params]
    )
    # pytest reports (skips, locations) point at the check, not at this module
    code = fn.__code__  # type: ignore[attr-defined]
    test.__code__ = test.__code__.replace(co_filename=code.co_filename, co_firstlineno=code.co_firstlineno)
    test.__name__ = test.__qualname__ = name
    test.__module__ = namespace.get("__name__", fn.__module__)
    test.__doc__ = fn.__doc__
    test.__fp4_property__ = fn  # type: ignore[attr-defined]  # the check it runs (read by the bench)
    pins, examples = tuple(pins), tuple(examples)
    test.__fp4_spec__ = PropertySpec(  # type: ignore[attr-defined]  # read by harness.preflight
        pins, examples, strategy, backends, kernel, kernel_backends, tuple(m.mark.name for m in marks)
    )
    decorated: Any = pinned_examples(argname, pins)(test)
    for config in reversed(examples):
        decorated = example(**{argname: config})(decorated)
    decorated = given(**{argname: strategy})(decorated)
    if settings is not None:
        decorated = settings(decorated)
    if with_backend:
        members = () if backends is ALL_BACKENDS else tuple(backends)  # type: ignore[arg-type]
        on_kernel = kernel if kernel_backends is None else kernel_backends
        decorated = pytest.mark.backends(*members, kernel=on_kernel)(decorated)
    for mark in marks:
        decorated = mark(decorated)
    namespace[name] = decorated
    return decorated
