"""A foreign engine for the plugin's tests: its own op namespace and three tiny "passes".

The namespace ``msched_plugin_eng`` has msched's four-op shape (``set_stream(int)``,
``record_event(int)``, ``wait_event(int)``, ``record_stream(Tensor, int)``) and a capture op
``inplace_slice_copy(Tensor(a!) dest, Tensor src, int start, int end) -> ()``.  The passes
are `msched.schedule` with every stream op rewritten into that namespace, so their graphs
are correct and differ from msched's only in the dialect:

- `schedule_copy` returns a new module and leaves ``gm`` alone;
- `schedule_in_place` rewrites ``gm`` and returns ``None``;
- `schedule_without_exit_wait` forgets the last wait before ``output`` (the exit races with
  the last capture on an auxiliary stream), as `schedule_in_place` otherwise.

Importing the module registers the namespace, once per process: inner ``pytester`` runs
refer to it as ``tests.plugin.foreign`` so that it is never imported twice.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule
from torch.fx.node import has_side_effect

import msched
from msched.testing.checks import copy_module

NAMESPACE = "msched_plugin_eng"

_lib = torch.library.Library(NAMESPACE, "DEF")
_lib.define("set_stream(int stream) -> ()")
_lib.define("record_event(int event) -> ()")
_lib.define("wait_event(int event) -> ()")
_lib.define("record_stream(Tensor t, int stream) -> ()")
_lib.define("inplace_slice_copy(Tensor(a!) dest, Tensor src, int start, int end) -> ()")
# Capture-like ops of the wrong schema, for decoder_stack's check: one returns a tensor, one
# does not declare that it writes dest.
_lib.define("returning_copy(Tensor(a!) dest, Tensor src, int start, int end) -> Tensor")
_lib.define("undeclared_copy(Tensor dest, Tensor src, int start, int end) -> ()")


def _nothing(*args: object) -> None:
    return None


def _inplace_slice_copy(dest: torch.Tensor, src: torch.Tensor, start: int, end: int) -> None:
    dest.narrow(-1, start, end - start).copy_(src)


def _returning_copy(dest: torch.Tensor, src: torch.Tensor, start: int, end: int) -> torch.Tensor:
    return dest.narrow(-1, start, end - start).copy_(src).clone()


for _name, _impl in (
    ("set_stream", _nothing),
    ("record_event", _nothing),
    ("wait_event", _nothing),
    ("record_stream", _nothing),
    ("inplace_slice_copy", _inplace_slice_copy),
    ("returning_copy", _returning_copy),
    ("undeclared_copy", _inplace_slice_copy),
):
    _lib.impl(_name, _impl, "CompositeExplicitAutograd")

_ops = getattr(torch.ops, NAMESPACE)
STREAM_OPS = {
    msched.ops.set_stream: _ops.set_stream.default,
    msched.ops.record_event: _ops.record_event.default,
    msched.ops.wait_event: _ops.wait_event.default,
    msched.ops.record_stream: _ops.record_stream.default,
}
for _op in STREAM_OPS.values():
    has_side_effect(_op)
CAPTURE = _ops.inplace_slice_copy.default
RETURNING_CAPTURE = _ops.returning_copy.default
UNDECLARED_CAPTURE = _ops.undeclared_copy.default
WAIT = _ops.wait_event.default
DIALECT = msched.Dialect.from_namespace(NAMESPACE)


def translate(gm: GraphModule) -> GraphModule:
    """Rewrite msched's stream ops of ``gm`` into this namespace (in place); return ``gm``.

    This namespace has the plain four ops: a switch that records and waits
    (``set_stream(s, [a, b], [c])``) becomes ``record_event(c)``, ``set_stream(s)``,
    ``wait_event(a)``, ``wait_event(b)``.
    """
    for node in list(gm.graph.nodes):
        if node.target is msched.ops.set_stream and len(node.args) > 1:
            stream, events, *recorded = node.args
            node.args = (stream,)
            for event in recorded[0] if recorded else ():  # type: ignore[union-attr]
                with gm.graph.inserting_before(node):
                    gm.graph.call_function(msched.ops.record_event, (event,))
            at = node
            for event in events:  # type: ignore[union-attr]
                with gm.graph.inserting_after(at):
                    at = gm.graph.call_function(msched.ops.wait_event, (event,))
    for node in gm.graph.nodes:
        if node.target in STREAM_OPS:
            node.target = STREAM_OPS[node.target]
    gm.recompile()
    return gm


def schedule_copy(gm: GraphModule, num_streams: int) -> GraphModule:
    """A new scheduled module in this namespace; ``gm`` is left as it was."""
    scheduled = copy_module(gm)
    msched.schedule(scheduled, num_streams)
    return translate(scheduled)


def schedule_in_place(gm: GraphModule, num_streams: int) -> None:
    """Schedule ``gm`` in place, in this namespace."""
    msched.schedule(gm, num_streams)
    translate(gm)


def schedule_without_exit_wait(gm: GraphModule, num_streams: int) -> None:
    """`schedule_in_place`, then delete the last wait before ``output`` (a bug)."""
    schedule_in_place(gm, num_streams)
    waits = [n for n in gm.graph.nodes if n.target is WAIT]
    gm.graph.erase_node(waits[-1])
    gm.recompile()


def not_a_scheduler_result(gm: GraphModule, num_streams: int) -> str:
    """A "scheduler" that returns neither a module nor None."""
    return "scheduled"
