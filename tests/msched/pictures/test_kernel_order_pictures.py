"""Pictures of Inductor's final kernel order (`msched.compile.kernel_order`): kernels on lanes."""

from __future__ import annotations

import torch
import torch._dynamo.variables.streams  # noqa: F401  (registers torch.ops.streams)

from msched import pictures
from msched.compile._inductor_internals import FinalOrder, ScheduledNode
from msched.compile.kernel_order import kernel_order_program

streams = torch.ops.streams


def _kernel(name, outputs, reads, stream=None, mutates=()):
    return ScheduledNode(name, "kernel", stream, tuple(outputs), tuple(reads), tuple(mutates), ())


def _sync(op, *args):
    return ScheduledNode("sync", "stream", None, (), (), (), (), op, args)


def _program():
    nodes = (
        _kernel("op0", ["buf0"], ["x"]),
        _sync(streams.record_event.default, 2, 0),
        _sync(streams.wait_event.default, 2, 1),
        _kernel("op1", ["buf1"], ["buf0"], stream=1),
        _sync(streams.record_event.default, 3, 1),
        _sync(streams.wait_event.default, 3, 0),
        _kernel("op2", ["buf2"], ["buf1", "cap"], mutates=[("buf2", "cap")]),
    )
    return kernel_order_program(FinalOrder(nodes, ("x", "cap"), ()), caller_stream=(0,))


EXPECTED = """\
# msched text format 2
# streams 2, events 2, waits 2
# makespan 3, lower bound 3
s0 | x = input
s0 | cap = input
s0 | op0 = kernel(reads=[x])
s0 | buf0 = getitem(op0, 0)
s0 | record @buf0
s1 |   wait @buf0
s1 |   op1 = kernel(reads=[buf0])
s1 |   buf1 = getitem(op1, 0)
s1 |   record @buf1
s0 | wait @buf1
s0 | op2 = kernel(reads=[buf1, cap], writes=[cap])
s0 | output(())
"""


def test_the_text_puts_each_kernel_on_its_stream_lane() -> None:
    assert pictures.render_text(_program()) == EXPECTED


def test_the_svg_draws_every_kernel() -> None:
    svg = pictures.render_svg(_program())
    assert svg.startswith("<svg") and all(k in svg for k in ("op0", "op1", "op2"))
    assert svg == pictures.render_svg(_program())  # deterministic
