"""Host-side runtime behind the msched stream ops.

The stream ops carry only integers, so the streams and events they mean live in a
`StreamRuntime`.  Stream 0 is always the stream that was current when the scheduled graph
started issuing work (captured on the first switch away from stream 0); auxiliary streams and
events are created lazily, per device, the first time an id is used.

On CPU (no CUDA tensors involved, or CUDA unavailable) every operation is a no-op, so a
scheduled graph runs unchanged on a machine without a GPU.

A compiled module can own its runtime and activate it around each call
(``with runtime.active(): ...``); without one, a process-wide default runtime is used.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch


class StreamRuntime:
    """Owns the auxiliary CUDA streams and the events of one scheduled module."""

    def __init__(self) -> None:
        self._streams: dict[int, Any] = {}
        self._events: dict[int, Any] = {}
        self._base: Any = None
        self._current = 0

    @staticmethod
    def enabled() -> bool:
        return torch.cuda.is_available()

    def _stream(self, stream: int) -> Any:
        if stream == 0:
            return self._base if self._base is not None else torch.cuda.current_stream()
        if stream not in self._streams:
            self._streams[stream] = torch.cuda.Stream()
        return self._streams[stream]

    def _event(self, event: int) -> Any:
        if event not in self._events:
            self._events[event] = torch.cuda.Event()
        return self._events[event]

    def set_stream(self, stream: int) -> None:
        if not self.enabled():
            return
        if self._current == 0:
            # Leaving stream 0: remember which stream the caller was on.
            self._base = torch.cuda.current_stream()
        torch.cuda.set_stream(self._stream(stream))
        self._current = stream
        if stream == 0:
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
        """Make this runtime the target of the stream ops issued by this thread."""
        stack = _stack()
        stack.append(self)
        try:
            yield self
        finally:
            stack.pop()


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
