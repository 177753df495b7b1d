"""Custom ops of the toy engine, in the ``toyeng`` namespace.

Stream ops (the shape msched's plugin reads: ``ns::set_stream``, ``ns::record_event``,
``ns::wait_event``, ``ns::record_stream``):

| op | meaning |
|---|---|
| ``toyeng::set_stream(int stream) -> ()`` | later ops are issued on ``stream`` (0 = caller's) |
| ``toyeng::record_event(int event) -> ()`` | record ``event`` on the current stream |
| ``toyeng::wait_event(int event) -> ()`` | the current stream waits for the last record of it |
| ``toyeng::record_stream(Tensor t, int stream) -> ()`` | ``t`` is used on ``stream`` |

They return nothing, so they are registered as side-effectful with ``torch.fx`` (else
``eliminate_dead_code`` would drop them).  They act on the `cuda_streams` pool that is active;
without one (on CPU) they do nothing.

The Eagle3 capture op:

``toyeng::inplace_slice_copy(Tensor(a!) dest, Tensor src, int start, int end) -> ()`` writes
``src`` into ``dest[..., start:end]``.  It returns nothing: no node of the graph uses it, which
is what makes it easy for a scheduler to lose.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.fx.node import has_side_effect

NAMESPACE = "toyeng"

_lib = torch.library.Library(NAMESPACE, "DEF")
_lib.define("set_stream(int stream) -> ()")
_lib.define("record_event(int event) -> ()")
_lib.define("wait_event(int event) -> ()")
_lib.define("record_stream(Tensor t, int stream) -> ()")
_lib.define("inplace_slice_copy(Tensor(a!) dest, Tensor src, int start, int end) -> ()")


class StreamPool:
    """The CUDA streams and events the stream ops of one forward pass act on.

    Stream 0 is the caller's current stream; streams ``1..num_streams-1`` are new ones.
    """

    def __init__(self, num_streams: int, device: torch.device | None = None) -> None:
        main = torch.cuda.current_stream(device)
        self.streams = [main] + [torch.cuda.Stream(device) for _ in range(num_streams - 1)]
        self.events: dict[int, torch.cuda.Event] = {}


_active: StreamPool | None = None


@contextmanager
def cuda_streams(num_streams: int, device: torch.device | None = None) -> Iterator[StreamPool]:
    """Run scheduled graphs on real CUDA streams inside this block."""
    global _active
    previous, _active = _active, StreamPool(num_streams, device)
    try:
        yield _active
    finally:
        torch.cuda.set_stream(_active.streams[0])
        _active = previous


def _set_stream(stream: int) -> None:
    if _active is not None:
        torch.cuda.set_stream(_active.streams[stream])


def _record_event(event: int) -> None:
    if _active is not None:
        recorded = torch.cuda.Event()
        recorded.record()
        _active.events[event] = recorded


def _wait_event(event: int) -> None:
    if _active is not None:
        torch.cuda.current_stream().wait_event(_active.events[event])


def _record_stream(t: torch.Tensor, stream: int) -> None:
    if _active is not None and t.is_cuda:
        t.record_stream(_active.streams[stream])


def _inplace_slice_copy(dest: torch.Tensor, src: torch.Tensor, start: int, end: int) -> None:
    dest.narrow(-1, start, end - start).copy_(src)


def _nothing(*args: object) -> None:
    return None


for _name, _impl in (
    ("set_stream", _set_stream),
    ("record_event", _record_event),
    ("wait_event", _wait_event),
    ("record_stream", _record_stream),
    ("inplace_slice_copy", _inplace_slice_copy),
):
    _lib.impl(_name, _impl, "CompositeExplicitAutograd")
    _lib.impl(_name, _nothing, "Meta")

set_stream = torch.ops.toyeng.set_stream.default
record_event = torch.ops.toyeng.record_event.default
wait_event = torch.ops.toyeng.wait_event.default
record_stream = torch.ops.toyeng.record_stream.default
inplace_slice_copy = torch.ops.toyeng.inplace_slice_copy.default

STREAM_OPS = (set_stream, record_event, wait_event, record_stream)
for _op in STREAM_OPS:
    has_side_effect(_op)
