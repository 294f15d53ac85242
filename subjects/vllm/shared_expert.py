"""``shared_expert`` for the ``vllm`` subject: ``Qwen3NextSparseMoeBlock.__init__``'s decision from vLLM's
``resolve_layer_fused_shared_expert`` then ``_should_replicate_misaligned_shared_expert``, in the order the
constructor uses (checked against its source). The class is also the ``mxfp4_linear`` policy, so the dense shared
expert meets vLLM's own ASM guard."""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import types
from unittest import mock

from contracts.shared_expert import SharedExpertPlacement, SharedExpertRefused, SharedExpertSetup
from subjects.engine_tools import call_name
from subjects.vllm.bridge import VllmSourceMismatch, vllm_modules
from subjects.vllm.mxfp4_linear import VllmAiterMxfp4Linear

FSE_RESOLVER = "resolve_layer_fused_shared_expert"
REPLICATE_GATE = "_should_replicate_misaligned_shared_expert"


def call_order_problem(init_source: str) -> str | None:
    """Why ``init_source`` (``Qwen3NextSparseMoeBlock.__init__``) does not resolve fusion before the
    replicate gate: a missing call, or the first ``_should_replicate_misaligned_shared_expert`` call
    before the first ``resolve_layer_fused_shared_expert`` call. None when the order is vLLM's fixed one."""
    lines: dict[str, int] = {}
    for node in ast.walk(ast.parse(textwrap.dedent(init_source))):
        if isinstance(node, ast.Call) and call_name(node) in (FSE_RESOLVER, REPLICATE_GATE):
            name = call_name(node)
            lines[name] = min(lines.get(name, node.lineno), node.lineno)
    missing = [n for n in (FSE_RESOLVER, REPLICATE_GATE) if n not in lines]
    if missing:
        return f"Qwen3NextSparseMoeBlock.__init__ no longer calls {', '.join(missing)}"
    if lines[FSE_RESOLVER] > lines[REPLICATE_GATE]:
        return (
            f"Qwen3NextSparseMoeBlock.__init__ calls {REPLICATE_GATE} (line {lines[REPLICATE_GATE]}) before "
            f"{FSE_RESOLVER} (line {lines[FSE_RESOLVER]}): the pre-#55213 order, where an FSE-capable shared "
            "expert is replicated or refused"
        )
    return None


@functools.cache
def fse_order_problem() -> str | None:
    """:func:`call_order_problem` on the installed ``Qwen3NextSparseMoeBlock.__init__``.

    The composition is inlined in the model's constructor (it needs distributed groups and a
    ``VllmConfig``), so the adapter composes the two functions itself and checks the order here.
    """
    return call_order_problem(inspect.getsource(vllm_modules().qwen3_next.Qwen3NextSparseMoeBlock.__init__))


class VllmQwen3NextSharedExpert(VllmAiterMxfp4Linear):
    """``Qwen3NextSparseMoeBlock.__init__``'s shared-expert decision, from vLLM's two functions.

    ``fused = resolve_layer_fused_shared_expert(None, prefix, shared_expert_name="shared_expert")``
    (only when ``I > 0``), then ``replicate = False if fused else
    _should_replicate_misaligned_shared_expert(I, tp, group, ep, sp)``, the model's order, which
    :func:`fse_order_problem` checks against the constructor's source (a mismatch raises
    :class:`VllmSourceMismatch`). Patched for the call: ``fused_moe.utils.rocm_aiter_ops`` reports
    the setup's FSE switch (AITER's ``is_fusion_moe_shared_experts_enabled``), and
    ``is_shared_expert_quant_fse_compatible`` the setup's quantization compatibility (vLLM derives
    it from a Quark config; the setup's ``group`` replaces ``get_quark_ocp_mx_group_size`` likewise).
    vLLM's ``ValueError`` becomes :class:`SharedExpertRefused`. The class is also the linear policy
    (vLLM's AITER guard), so the dense shared expert is tested with vLLM's own guard.
    """

    PREFIX = "model.layers.0.mlp"

    def shared_expert_placement(self, setup: SharedExpertSetup) -> SharedExpertPlacement:
        problem = fse_order_problem()
        if problem is not None:
            raise VllmSourceMismatch(problem)
        v = vllm_modules()
        try:
            fused = setup.intermediate > 0 and self._resolve_fused(v, setup)
            replicate = False if fused else v.qwen3_next._should_replicate_misaligned_shared_expert(
                setup.intermediate, setup.tp, setup.group, setup.expert_parallel, setup.sequence_parallel
            )  # fmt: skip
        except ValueError as exc:
            raise SharedExpertRefused(str(exc)) from exc
        if setup.intermediate <= 0:
            return SharedExpertPlacement.ABSENT
        if fused:
            return SharedExpertPlacement.FUSED
        return SharedExpertPlacement.REPLICATED if replicate else SharedExpertPlacement.SHARDED

    def _resolve_fused(self, v: types.SimpleNamespace, setup: SharedExpertSetup) -> bool:
        aiter_ops = types.SimpleNamespace(is_fusion_moe_shared_experts_enabled=lambda: setup.fse_enabled)
        reason = None if setup.fse_quant_compatible else "shared-expert quantization differs from the routed experts'"

        def compatible(*_: object, **__: object) -> tuple[bool, str | None]:
            return setup.fse_quant_compatible, reason

        with (
            mock.patch.object(v.moe_utils, "rocm_aiter_ops", aiter_ops),
            mock.patch.object(v.moe_utils, "is_shared_expert_quant_fse_compatible", compatible),
        ):
            return bool(
                v.moe_utils.resolve_layer_fused_shared_expert(None, self.PREFIX, shared_expert_name="shared_expert")
            )
