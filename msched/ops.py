"""The msched stream ops: real ``torch.library`` custom ops in the ``msched`` namespace.

| op | meaning |
|---|---|
| ``msched::set_stream(int stream, int[] wait_events=[], int[] record_events=[])`` | records |
| | each of ``record_events`` on the current (old) stream, then issues later ops on ``stream`` |
| | (0 = caller's stream), which first waits for the last record of each of ``wait_events`` |
| ``msched::record_event(int event)`` | record ``event`` on the current stream |
| ``msched::wait_event(int event)`` | the current stream waits for the last record of ``event`` |
| ``msched::record_stream(Tensor t, int stream)`` | ``t`` is used on ``stream`` (allocator) |

A switch, the records right before it and the waits right after it are one node: most records
of a schedule mark the last node a stream issues before the host switches away, most waits
directly follow a switch, and every node costs code generation when the module is compiled and
a dispatcher call on every forward.  ``set_stream(s, [a, b], [c])`` means exactly
``record_event(c)`` (on the old stream), ``set_stream(s)``, ``wait_event(a)``,
``wait_event(b)``; ``set_stream(s)`` and ``set_stream(s, [a, b])`` are the ops of older graphs,
unchanged.

They are registered as side-effectful with ``torch.fx`` so that ``eliminate_dead_code`` keeps
them, and they act on `msched.runtime.current_runtime()`: no-ops on CPU.

Direct calls: the module of a scheduled graph does not go through the dispatcher for its stream
ops (about 1 µs each per forward, measured in ``benchmarks/bench_forward.py``).  Its code
calls `direct_set_stream`, `direct_record_event`, `direct_wait_event` and
`direct_record_stream` (`msched.scheduling.codegen`), which call the runtime exactly as the ops'
kernels do, and call the op itself whenever something could intercept it: while Dynamo
traces (``torch.compile`` of a scheduled module sees the ops), under a dispatch or
``__torch_function__`` mode (``make_fx``, fake and functional tensors, a user's logging mode),
while the profiler runs (it shows the ops), under a ``torch.func`` transform, and for a tensor
subclass given to ``record_stream``.  The graph keeps the ops as node targets.  What they
skip: a kernel of your own registered for an msched op, and tools that watch ops through
``RecordFunction`` callbacks without the profiler (``ExecutionTraceObserver``); turn them off
for those with `use_direct_calls` or ``MSCHED_DIRECT_CALLS=0``.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.fx.node import has_side_effect

from msched._torch_internals import (
    dispatch_mode_depth,
    function_mode_enabled,
    functorch_active,
    profiler_enabled,
)
from msched.runtime import current_runtime

_lib = torch.library.Library("msched", "FRAGMENT")
_lib.define("set_stream(int stream, int[] wait_events=[], int[] record_events=[]) -> ()")
_lib.define("record_event(int event) -> ()")
_lib.define("wait_event(int event) -> ()")
_lib.define("record_stream(Tensor t, int stream) -> ()")


def _set_stream(
    stream: int, wait_events: list[int] | None = None, record_events: list[int] | None = None
) -> None:
    current_runtime().set_stream(stream, wait_events, record_events)


def _record_event(event: int) -> None:
    current_runtime().record_event(event)


def _wait_event(event: int) -> None:
    current_runtime().wait_event(event)


def _record_stream(t: torch.Tensor, stream: int) -> None:
    current_runtime().record_stream(t, stream)


def _noop_meta(*args: object) -> None:
    return None


for _name, _fn in (
    ("set_stream", _set_stream),
    ("record_event", _record_event),
    ("wait_event", _wait_event),
):
    _lib.impl(_name, _fn, "CompositeExplicitAutograd")
    _lib.impl(_name, _noop_meta, "Meta")
_lib.impl("record_stream", _record_stream, "CompositeExplicitAutograd")
_lib.impl("record_stream", _noop_meta, "Meta")

set_stream = torch.ops.msched.set_stream.default
record_event = torch.ops.msched.record_event.default
wait_event = torch.ops.msched.wait_event.default
record_stream = torch.ops.msched.record_stream.default

STREAM_OPS = (set_stream, record_event, wait_event, record_stream)
for _op in STREAM_OPS:
    has_side_effect(_op)


# Direct calls (see the module docstring).  The checks are bound once: each costs ~50 ns, the
# dispatcher round trip they save about 1 µs.  `torch.compiler.is_compiling` comes first, so
# that Dynamo, which reads it as True, traces nothing else here.
_is_compiling = torch.compiler.is_compiling
_dispatch_modes = dispatch_mode_depth
_function_modes = function_mode_enabled
_profiling = profiler_enabled
_functorch = functorch_active
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_direct = os.environ.get("MSCHED_DIRECT_CALLS", "1") != "0"


def use_direct_calls(enabled: bool) -> bool:
    """Whether the direct calls skip the dispatcher from now on (in every thread); returns the
    previous setting.  Off, every direct call calls its op: for a kernel of your own
    registered for an msched op, or a tool that observes ops through ``RecordFunction``
    callbacks without the profiler (``torch.profiler.ExecutionTraceObserver``).  The
    environment variable ``MSCHED_DIRECT_CALLS=0`` starts a process with them off."""
    global _direct
    previous, _direct = _direct, bool(enabled)
    return previous


def _intercepted() -> bool:
    """Whether a call of a stream op could reach anything but its kernel."""
    return (
        not _direct
        or _is_compiling()
        or _dispatch_modes() > 0
        or _function_modes()
        or _profiling()
        or _functorch()
    )


# The arguments are passed on as the node gave them (the runtime's methods take the names of
# the ops' schemas), so that what intercepts sees the call the graph has.  Unlike the op, a
# direct call does not check them against the schema: `msched.verify` rejects a graph whose
# stream ops have arguments of the wrong type, and `msched.schedule` emits none.


def direct_set_stream(*args: Any, **kwargs: Any) -> None:
    """``set_stream(stream, wait_events=[], record_events=[])`` without the dispatcher."""
    if _intercepted():
        return set_stream(*args, **kwargs)
    current_runtime().set_stream(*args, **kwargs)
    return None


def direct_record_event(*args: Any, **kwargs: Any) -> None:
    """``record_event(event)`` without the dispatcher."""
    if _intercepted():
        return record_event(*args, **kwargs)
    current_runtime().record_event(*args, **kwargs)
    return None


def direct_wait_event(*args: Any, **kwargs: Any) -> None:
    """``wait_event(event)`` without the dispatcher."""
    if _intercepted():
        return wait_event(*args, **kwargs)
    current_runtime().wait_event(*args, **kwargs)
    return None


def direct_record_stream(t: torch.Tensor, stream: int) -> None:
    """``record_stream(t, stream)`` without the dispatcher (a tensor subclass takes the op)."""
    if type(t) not in _PLAIN_TENSORS or _intercepted():
        return record_stream(t, stream)
    current_runtime().record_stream(t, stream)
    return None


DIRECT_CALLS = {
    set_stream: direct_set_stream,
    record_event: direct_record_event,
    wait_event: direct_wait_event,
    record_stream: direct_record_stream,
}
