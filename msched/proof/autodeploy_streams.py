"""The ``autodeploy`` dialect: how AutoDeploy encodes stream code, registered when loaded.

AutoDeploy's ops are read as actions (`msched.proof.actions`); ``Dialect.named("autodeploy")``
returns the dialect (`msched.proof.dialects`, which lists every built-in one):
``auto_deploy::record_event(int device, str name)``, ``wait_event(device, name)`` and the
passthrough functions ``record_event_passthrough``, ``begin_aux_stream_passthrough``,
``end_aux_stream_passthrough``, ``wait_aux_stream_passthrough``; one event per name,
re-recorded; ``begin`` switches to the ``aux`` stream, ``end`` back to the caller's.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from torch.fx import Node

from msched.errors import InvalidGraphError
from msched.proof import actions, dialects
from msched.proof.actions import Action
from msched.proof.dialects import Dialect

# --- AutoDeploy ----------------------------------------------------------------------------

AUTODEPLOY_AUX = ("autodeploy", "aux")  # the key of AutoDeploy's auxiliary stream


def _ad_event(node: Node, index: int) -> tuple[str, str]:
    name = node.args[index] if len(node.args) > index else node.kwargs.get("stream_name")
    if not isinstance(name, str):
        raise InvalidGraphError(
            f"{node.name!r} takes a stream name as a literal str, got {name!r}", nodes=(node.name,)
        )
    return ("autodeploy", name)


def _ad_record(node: Node) -> Sequence[Action]:
    return (actions.record(_ad_event(node, 1)),)


def _ad_wait(node: Node) -> Sequence[Action]:
    return (actions.wait(_ad_event(node, 1)),)


_AD_MAIN = ("autodeploy", "main")
_AD_AUX_EVENT = ("autodeploy", "aux")


def _passed(node: Node) -> tuple[Action, ...]:
    """A passthrough function's value is its first argument."""
    value = actions.tensor_argument(node, 0, "x")
    return () if value is None else (actions.passes(value),)


def _ad_record_passthrough(node: Node) -> Sequence[Action]:
    return (actions.record(_AD_MAIN), *_passed(node))


def _ad_begin(node: Node) -> Sequence[Action]:
    return (
        actions.record(_AD_MAIN),
        actions.switch(AUTODEPLOY_AUX),
        actions.wait(_AD_MAIN),
        *_passed(node),
    )


def _ad_end(node: Node) -> Sequence[Action]:
    return (actions.record(_AD_AUX_EVENT), actions.switch(0), *_passed(node))


def _ad_wait_aux(node: Node) -> Sequence[Action]:
    return (actions.wait(_AD_AUX_EVENT), *_passed(node))


def autodeploy() -> Dialect:
    """AutoDeploy's encoding (TensorRT-LLM ``_torch/auto_deploy/utils/multi_stream_utils``):
    ``auto_deploy::record_event(device, name)`` records the event of ``name`` on the current
    stream and ``wait_event(device, name)`` waits for its latest record; the identity
    passthroughs record ``main`` (``record_event_passthrough``), begin the aux stream
    (record ``main``, switch to aux, wait for ``main``), end it (record ``aux``, switch back
    to the caller's stream; no join) and join it (``wait_aux_stream_passthrough``: wait for
    ``aux``).  One device per graph: the device argument is not part of an event's name."""
    return Dialect.define(
        "autodeploy",
        {
            "auto_deploy::record_event": _ad_record,
            "auto_deploy::wait_event": _ad_wait,
            "record_event_passthrough": _ad_record_passthrough,
            "begin_aux_stream_passthrough": _ad_begin,
            "end_aux_stream_passthrough": _ad_end,
            "wait_aux_stream_passthrough": _ad_wait_aux,
        },
    )


def describe_key(key: Hashable, what: str) -> str | None:
    """A report's name for one of AutoDeploy's streams or events (keyed by name)."""
    if isinstance(key, tuple) and len(key) == 2 and key[0] == "autodeploy":
        return f"AutoDeploy {what} {key[1]!r}"
    return None


dialects.register("autodeploy", autodeploy, mixes=True, describe_key=describe_key)

__all__ = ["AUTODEPLOY_AUX", "autodeploy", "describe_key"]
