"""What Inductor's buffers say of their memory: size, stride and dtype, by buffer name.

Why: `msched.peak_memory` of a kernel order (`msched.compile.kernel_order`) needs the bytes
of every buffer the code allocates, and the program built from Inductor's final order has
no fake values.  When msched records the final order (``Scheduler.codegen``, see
`msched.compile._inductor_internals`), every buffer has its layout: a scheduler node's
buffers (``SchedulerBuffer.node``, an ``ir.Buffer``) answer ``get_output_spec()`` (an
``ir.Layout`` with ``size``, ``stride`` and ``dtype``, or one of the two below), the graph's inputs
(``GraphLowering.graph_inputs``) ``get_size()``, ``get_stride()`` and ``get_dtype()``, its
constants (``GraphLowering.constants``) are tensors.  Their interfaces are listed in
``_inductor_internals.INTERFACES`` with the others, checked on every torch version CI tests.

A size or stride that is symbolic (dynamic shapes) is evaluated at the shape environment's
hint when it has one (``GraphLowering.sizevars``); a buffer whose layout says nothing
or that cannot be read is left out: its program node then has no size, and
`msched.proof.memory.sized_memory` shows none rather than a wrong figure.  An op that
returns nothing (``NoneLayout``) allocates nothing, and a kernel with several outputs
(``MultiOutputLayout``) holds a tuple of them: no bytes of its own, each output is the
buffer of its ``MultiOutput`` node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["BufferLayout", "buffer_layouts"]


@dataclass(frozen=True)
class BufferLayout:
    """A buffer's memory as `msched.analysis.sizes.storage_bytes` reads tensor metadata:
    ``shape`` and ``stride`` in elements, ``dtype``."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


def buffer_layouts(graph: Any, scheduler: Any) -> tuple[tuple[str, BufferLayout], ...]:
    """``(buffer name, layout)`` of the graph's inputs and constants, then of every buffer
    of the scheduler's nodes, in order (see the module docstring)."""
    hint = _hint(graph)
    found: dict[str, BufferLayout] = {}
    for name, value in getattr(graph, "graph_inputs", {}).items():
        _add(found, name, _input_layout, value, hint)
    for name, value in getattr(graph, "constants", {}).items():
        _add(found, name, _tensor_layout, value, hint)
    for node in scheduler.nodes:
        for buf in node.get_outputs():
            _add(found, buf.get_name(), _buffer_layout, buf, hint)
    return tuple(found.items())


def _input_layout(value: Any) -> tuple[Any, Any, Any]:
    return value.get_size(), value.get_stride(), value.get_dtype()


def _tensor_layout(value: Any) -> tuple[Any, Any, Any]:
    return tuple(value.shape), value.stride(), value.dtype


def _buffer_layout(buf: Any) -> tuple[Any, Any, Any]:
    from torch._inductor import ir

    layout = buf.node.get_output_spec()  # get_layout() raises for NoneLayout
    if isinstance(layout, (ir.MultiOutputLayout, ir.NoneLayout)):
        # Nothing of its own: an op that returns nothing, or a tuple of the outputs its
        # MultiOutput nodes make (each with its own layout).
        return (0,), (1,), torch.uint8
    return layout.size, layout.stride, layout.dtype


def _add(
    found: dict[str, BufferLayout],
    name: str,
    read: Callable[[Any], tuple[Any, Any, Any]],
    value: Any,
    hint: Callable[[Any], int],
) -> None:
    try:
        size, stride, dtype = read(value)
        shape = tuple(hint(d) for d in size)
        strides = tuple(hint(s) for s in stride)
    except Exception:  # no layout (NoneLayout), no hint: no size known
        return
    if isinstance(dtype, torch.dtype) and len(shape) == len(strides):
        found[name] = BufferLayout(shape, strides, dtype)


def _hint(graph: Any) -> Callable[[Any], int]:
    """An int of a size: itself (an int, a sympy number), or the hint of a symbolic one
    (``sizevars.optimization_hint``, ``size_hint`` in other releases; neither: unknown, and
    the buffer is left out)."""
    sizevars = getattr(graph, "sizevars", None)
    found = (getattr(sizevars, n, None) for n in ("optimization_hint", "size_hint"))
    evaluate = next((f for f in found if f is not None), None)

    def hint(value: Any) -> int:
        if isinstance(value, int) or getattr(value, "is_number", False):
            return int(value)
        if evaluate is None:
            raise ValueError(f"no hint for {value}")
        return int(evaluate(value))

    return hint
