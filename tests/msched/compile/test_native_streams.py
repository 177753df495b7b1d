"""`native_streams.tie_waits`: which nodes after a wait Inductor must keep after it.

A tie is per node, but Inductor lowers some nodes into several kernels, each ordered only by
the buffers it reads: ``cat`` becomes one copy kernel per input.  Phi's partial rotary
embedding concatenates a value made on the side stream after its wait with a slice of a
value from the caller's stream; the node had an input from after the wait, so it was not
tied, and the copy of the slice ran before the wait (``race/data`` in the final order).
"""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from msched.compile import native_streams
from msched.compile.native_streams import event_index, stream_index, tie_waits

aten = torch.ops.aten


def _side_stream_program(body):
    """``body(x, a)`` traced, where ``a = x * 2`` is made on the caller's stream and every
    node of ``body`` runs on stream 1 after a wait for ``a``'s event."""

    def f(x):
        a = x * 2
        return body(x, a)

    gm = make_fx(f)(torch.randn(4, 4))
    streams = native_streams._streams()
    mul = next(n for n in gm.graph.nodes if n.target is aten.mul.Tensor)
    side = [n for n in gm.graph.nodes if n.op == "call_function" and n is not mul]
    with gm.graph.inserting_after(mul):
        wait = gm.graph.call_function(streams.wait_event.default, (event_index(0), stream_index(1)))
    with gm.graph.inserting_after(mul):
        gm.graph.call_function(streams.record_event.default, (event_index(0), stream_index(0)))
    for node in side:
        node.meta["custom"] = {"stream": stream_index(1)}
    assert wait is not None
    gm.recompile()
    return gm


def _tied(gm) -> set[str]:
    """Names of the nodes ``preserve_node_ordering`` wrapped (tied to a wait)."""
    from torch._inductor.fx_passes.control_dependencies import control_deps

    stream_ops = ("subgraph_wait_event", "subgraph_record_event")
    return {
        str(n.name)
        for n in gm.graph.nodes
        if n.target is control_deps and not str(n.args[1].target).startswith(stream_ops)
    }


def test_a_cat_of_a_side_value_and_a_slice_from_the_caller_is_tied_to_the_wait() -> None:
    def body(x, a):
        b = x + 1
        return torch.cat([b, a[:, :2]], dim=1)

    gm = _side_stream_program(body)
    tie_waits(gm)
    assert _tied(gm) == {"add", "slice_1", "cat"}  # cat was untied: it reads add


def test_a_node_that_touches_only_values_made_after_the_wait_is_not_tied() -> None:
    def body(x, a):
        b = a + 1  # reads the caller's value: tied
        return b * 3  # reads only b, made after the wait on its stream: ordered by b

    gm = _side_stream_program(body)
    tie_waits(gm)
    assert _tied(gm) == {"add"}
