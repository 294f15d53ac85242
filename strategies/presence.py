"""Which contracts' layers a pinned model has: ``--model M --tp N`` runs only those.

A catalogued model without a shared expert (``shared_intermediate == 0``) has no layer for the
``shared_expert`` contract to decide on, and one without an MXFP4 dense projection loadable at the
pinned TP (:data:`strategies.linear.LINEAR_LAYERS`) none for ``mxfp4_linear``; the plugin deselects
those contracts' tests and says why, instead of drawing adversarial stand-ins under the model's name.
Every catalogued model has routed experts, so the MoE and sharding contracts always run.
"""

from __future__ import annotations

from contracts.mxfp4_linear import CONTRACT as MXFP4_LINEAR
from contracts.shared_expert import CONTRACT as SHARED_EXPERT
from strategies.catalog import MODELS
from strategies.linear import LINEAR_LAYERS, shardings
from strategies.pins import Pin


def _linear_layers(pin: Pin) -> list[str]:
    """The pinned model's MXFP4 linear layers (loadable at the pinned TP), by name."""
    return [lay.name for lay in LINEAR_LAYERS if lay.model == pin.model and (pin.tp is None or shardings(lay, pin.tp))]


def absent_layers(pin: Pin) -> dict[str, str]:
    """Contract name -> why the pinned model has no layer of that contract (empty without ``--model``)."""
    if pin.model is None:
        return {}
    model = MODELS[pin.model]
    absent = {}
    if model.shared_intermediate == 0:
        absent[SHARED_EXPERT] = f"{model.name} has no shared expert"
    if not _linear_layers(pin):
        at_tp = f" loadable at TP={pin.tp}" if pin.tp is not None else ""
        absent[MXFP4_LINEAR] = f"{model.name} has no catalogued MXFP4 dense layer{at_tp}"
    return absent


def pinned_layers(pin: Pin) -> str | None:
    """What a ``--model`` run draws, for the header: ``routed experts; MXFP4 linear: a, b; shared expert: no``."""
    if pin.model is None:
        return None
    linear = ", ".join(_linear_layers(pin)) or "none"
    shared = "no" if SHARED_EXPERT in absent_layers(pin) else "yes"
    return f"routed experts; MXFP4 linear layers: {linear}; shared expert: {shared}"
