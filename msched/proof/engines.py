"""The built-in dialects: how msched, TensorRT-LLM, PyTorch and AutoDeploy encode stream code.

Each is a `msched.Dialect` whose readers turn the engine's stream ops into actions
(`msched.proof.actions`); `Dialect.named` returns them by name (`msched.proof._registry`).
The four-op dialects are `msched.proof._dialect`'s shape (registered by the registry),
``torch`` is `msched.proof.torch_streams`, and ``autodeploy`` is defined and registered here.

- ``msched``: ``msched::set_stream(int, int[] wait_events=[], int[] record_events=[])`` (the
  records on the old stream, the switch, then the waits), ``record_event(int)``,
  ``wait_event(int)``, ``record_stream(Tensor, int)``; stream ids as written, 0 the caller's;
  records and waits on the current stream.
- ``trtllm``: the same four ops in the ``trtllm`` namespace.
- ``torch``: ``streams::fork/join/record_event/wait_event/wait_stream/record_stream/
  sync_dealloc/synchronize_*`` with indices into Dynamo's table of streams and events; a node
  runs on ``meta["custom"]["stream"]``, else on the caller's stream
  (`msched.proof.torch_streams`).
- ``autodeploy``: ``auto_deploy::record_event(int device, str name)``,
  ``wait_event(device, name)`` and the passthrough functions ``record_event_passthrough``,
  ``begin_aux_stream_passthrough``, ``end_aux_stream_passthrough``,
  ``wait_aux_stream_passthrough``; one event per name, re-recorded; ``begin`` switches to
  the ``aux`` stream, ``end`` back to the caller's.

Ops are matched by qualified name (``ns::op``) and Python functions by ``__name__``, so a graph
can be read without the engine installed.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from torch.fx import Node

from msched.errors import InvalidGraphError
from msched.proof import _registry as registry
from msched.proof import actions
from msched.proof._dialect import Dialect
from msched.proof.actions import Action

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


registry.register("autodeploy", autodeploy, mixes=True, describe_key=describe_key)

__all__ = ["AUTODEPLOY_AUX", "autodeploy", "describe_key"]
