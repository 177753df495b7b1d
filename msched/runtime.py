"""Host-side runtime behind the msched stream ops.

The stream ops carry only integers, so the streams and events they mean live in a
`StreamRuntime`.  Stream 0 is always the stream that was current when the scheduled graph
started issuing work; auxiliary streams and events are created lazily, per device, the first
time an id is used, and then reused by every later call.

A compiled module owns one runtime and activates it around each call
(``with runtime.active(): ...``): entering records the caller's stream as stream 0, leaving
puts the caller back on that stream even if the graph raised half-way.  Without an active
runtime the stream ops act on a process-wide default runtime, which captures stream 0 on the
first switch away from it.

On a machine without CUDA every operation is a no-op, so a scheduled graph runs unchanged on
CPU.  The CUDA calls go through ``api`` (``torch.cuda`` unless a test passes a fake), which
needs ``is_available()``, ``current_stream()``, ``set_stream(s)``, ``Stream(device=...)`` and
``Event()``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch


class StreamRuntime:
    """Owns the auxiliary CUDA streams and the events of one scheduled module.

    Stream and event ids are the integers of the stream ops; the objects behind them are
    keyed by ``(device, id)`` so that a module moved to another GPU gets streams there.
    """

    def __init__(self, api: Any = None) -> None:
        self._api = torch.cuda if api is None else api
        self._enabled: bool | None = None
        self._streams: dict[tuple[Any, int], Any] = {}
        self._events: dict[tuple[Any, int], Any] = {}
        self._base: Any = None
        self._current = 0
        self._depth = 0

    def enabled(self) -> bool:
        """Whether stream ops do anything: CUDA is available (checked once)."""
        if self._enabled is None:
            self._enabled = bool(self._api.is_available())
        return self._enabled

    def _base_stream(self) -> Any:
        if self._base is None:
            self._base = self._api.current_stream()
        return self._base

    def _stream(self, stream: int) -> Any:
        base = self._base_stream()
        if stream == 0:
            return base
        key = (getattr(base, "device", None), stream)
        if key not in self._streams:
            self._streams[key] = self._api.Stream(device=key[0])
        return self._streams[key]

    def _event(self, event: int) -> Any:
        key = (getattr(self._base_stream(), "device", None), event)
        if key not in self._events:
            self._events[key] = self._api.Event()
        return self._events[key]

    def set_stream(
        self,
        stream: int,
        wait_events: Sequence[int] | None = None,
        record_events: Sequence[int] | None = None,
    ) -> None:
        """Record each of ``record_events`` on the current stream, then issue later work on
        ``stream`` (0: the caller's stream), after it waited for the last record of each of
        ``wait_events`` (`msched.ops`: the records before a switch, the switch, its waits)."""
        if not self.enabled():
            return
        if record_events:
            old = self._stream(self._current)
            for event in record_events:
                self._event(event).record(old)
        target = self._stream(stream)
        if wait_events:
            for event in wait_events:
                target.wait_event(self._event(event))
        self._api.set_stream(target)
        self._current = stream
        if stream == 0 and self._depth == 0:
            # Not inside active(): the next graph may start on another caller stream.
            self._base = None

    def record_event(self, event: int) -> None:
        if self.enabled():
            self._event(event).record(self._stream(self._current))

    def wait_event(self, event: int) -> None:
        if self.enabled():
            self._stream(self._current).wait_event(self._event(event))

    def record_stream(self, tensor: torch.Tensor, stream: int) -> None:
        if self.enabled() and tensor.is_cuda:
            tensor.record_stream(self._stream(stream))

    @property
    def num_streams_created(self) -> int:
        return len(self._streams)

    @property
    def num_events_created(self) -> int:
        return len(self._events)

    @contextlib.contextmanager
    def active(self) -> Iterator[StreamRuntime]:
        """Make this runtime the target of this thread's stream ops for the ``with`` block.

        On CUDA the caller's current stream becomes stream 0 for the block and is current
        again when the block ends, however it ends.  Re-entrant: a nested activation (a
        compiled module calling another piece of itself) restores the outer state.
        """
        saved = (self._base, self._current)
        if self.enabled():
            self._base, self._current = self._api.current_stream(), 0
        self._depth += 1
        stack = _stack()
        stack.append(self)
        try:
            yield self
        finally:
            stack.pop()
            self._depth -= 1
            if self.enabled() and self._current != 0:
                self._api.set_stream(self._base)
            self._base, self._current = saved


_local = threading.local()
_default = StreamRuntime()


def _stack() -> list[StreamRuntime]:
    if not hasattr(_local, "stack"):
        _local.stack = []
    stack: list[StreamRuntime] = _local.stack
    return stack


def current_runtime() -> StreamRuntime:
    """The runtime that the stream ops of this thread act on."""
    stack = _stack()
    return stack[-1] if stack else _default
