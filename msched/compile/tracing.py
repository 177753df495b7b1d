"""`trace_streams`: the graph PyTorch builds from a model's own stream code, on CPU.

``torch.compile`` turns code written with ``torch.Stream`` / ``with stream:`` /
``s.wait_stream(t)`` / ``torch.Event`` / ``Tensor.record_stream`` into a graph with
``torch.ops.streams.*`` ops (the ``torch`` dialect, `msched.proof.torch_streams`).
`trace_streams` compiles a function with a backend that keeps that graph and never runs it
(CPU streams cannot run event ops), so ``msched.verify(trace_streams(fn, x))`` checks a
model's hand-written stream code on a machine without a GPU.

The caller's stream: on CUDA, Dynamo puts the stream current at trace time at index 0 of its
table of streams and events.  A CPU-only build registers no current stream (and
``torch.accelerator.current_stream()`` fails to trace), so while tracing on such a build
`trace_streams` makes Dynamo register ``caller_stream`` there, as it does on CUDA.  The
index is written to ``gm.meta["msched_caller_stream"]``, which the ``torch`` dialect reads.

`cuda_streams_on_cpu` lets code written against ``torch.cuda`` (``torch.cuda.Stream()``,
``torch.cuda.Event()``, ``torch.cuda.current_stream()``, ``torch.cuda.stream(s)``) build and
trace on a CPU-only machine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.fx import GraphModule

from msched._torch_internals import aot_autograd, dynamo_current_stream, dynamo_external_objects
from msched.errors import (
    InductorInterfaceError,
    InvalidArgumentError,
    MschedError,
    TorchInternalsError,
)
from msched.proof.dialects import mark_made
from msched.proof.torch_streams import CALLER_META

STAGES = ("dynamo", "aot", "inductor")
# The caller's streams of the `cuda_streams_on_cpu` blocks being run, innermost last.
_AMBIENT: list[torch.Stream] = []


def trace_streams(
    fn: Callable[..., Any],
    *example_inputs: Any,
    caller_stream: torch.Stream | None = None,
    stage: str = "dynamo",
) -> GraphModule:
    """The ``GraphModule`` ``torch.compile`` builds for ``fn(*example_inputs)``, stream ops
    included, ready for ``msched.verify(gm)``; ``fn``'s stream ops never run.

    ``stage="dynamo"`` returns Dynamo's graph (torch-level calls, in-place ops as written);
    ``stage="aot"`` the inference graph after AOT autograd (functional aten ops; a mutated
    input comes back as an extra output; sync ops wrapped in ``control_deps``);
    ``stage="inductor"`` the final kernel order Inductor generates for that graph (after
    fusion, reordering and buffer reuse; `msched.compile.kernel_order`: its collective and
    wait kernels are calls of their ops, each collective with ``meta["msched_issue"]``, its
    place in the graph Inductor lowered, so ``verify`` checks their order), compiled with
    the caches that could serve compiled code instead off (Inductor's FX graph cache, AOT
    autograd's), so that it is generated and read, never run; compiled C++ kernels are
    reused from Inductor's cache folder.  Traced under
    ``torch.no_grad()`` with ``fullgraph=True``.  ``caller_stream`` is the stream current
    while tracing (a fresh CPU stream when None); its table indices (Dynamo registers it as
    the current stream, and again where the code names it) are recorded in
    ``gm.meta["msched_caller_stream"]`` (None when it has none), and the graph is marked
    as msched's, in the ``torch`` dialect (`msched.proof.dialects.mark_made`).  Resets
    Dynamo's caches first (``torch.compiler.reset()``), so a function traced before is traced again.

    Raises `msched.InvalidArgumentError` for a bad argument, and when ``fn`` cannot be traced
    in one graph (the message says why; ``torch.cuda`` names on a CPU-only machine need
    `cuda_streams_on_cpu`).
    """
    if not callable(fn):
        raise InvalidArgumentError(f"trace_streams needs a callable, got {type(fn).__name__}")
    if stage not in STAGES:
        raise InvalidArgumentError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
    if caller_stream is not None and not isinstance(caller_stream, torch.Stream):
        raise InvalidArgumentError(
            f"caller_stream must be a torch.Stream, got {type(caller_stream).__name__}"
        )
    if caller_stream is not None:
        caller = caller_stream
    elif _AMBIENT:  # inside cuda_streams_on_cpu: its torch.cuda.current_stream()
        caller = _AMBIENT[-1]
    else:
        caller = _new_caller_stream()
    # A table of a type msched does not know is said now: Dynamo (or msched's hook in it)
    # would fail on it inside the trace, as if ``fn`` could not be traced.
    dynamo_external_objects()
    capture = _Capture(stage, caller)
    torch.compiler.reset()
    compiled = torch.compile(fn, backend=capture, fullgraph=True)
    with _registered_caller(caller), caller, torch.no_grad():
        try:
            compiled(*example_inputs)
        except Exception as error:
            if capture.graph is None:
                raise _untraced(fn, error) from error
            # The graph was captured; what failed is the call of its stand-in (it returns
            # placeholders for the graph's outputs, and the code around it may use them).
    torch.compiler.reset()
    if capture.graph is None:
        raise InvalidArgumentError(
            f"{getattr(fn, '__qualname__', type(fn).__name__)} ran no tensor operation on "
            "its inputs: there is no graph to trace"
        )
    return capture.graph


def _new_caller_stream() -> torch.Stream:
    if torch.accelerator.is_available():
        return torch.accelerator.current_stream()
    return torch.Stream(device="cpu")


class _Capture:
    """The backend: keeps the graph of ``stage`` and returns a stand-in that runs nothing."""

    def __init__(self, stage: str, caller: torch.Stream) -> None:
        self.stage = stage
        self.caller = caller
        self.graph: GraphModule | None = None

    def __call__(self, gm: GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        table = _table()
        if self.stage == "inductor":
            graph = _inductor_program(gm, example_inputs)
        elif self.stage == "aot":
            found: list[GraphModule] = []

            def keep(inner: GraphModule, inputs: list[Any]) -> Callable[..., Any]:
                found.append(inner)
                return _stand_in(inner)

            aot_autograd(fw_compiler=keep)(gm, example_inputs)
            graph = found[0]
        else:
            graph = gm
        caller = tuple(i for i, o in sorted(table.items()) if o is self.caller)
        graph.meta[CALLER_META] = caller or None
        self.graph = mark_made(graph, "torch")
        return _stand_in(gm)


class _InductorFailed(InvalidArgumentError):
    """Inductor raised while compiling a graph Dynamo traced (`trace_streams` names ``fn``)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(_first_line(error))


def _inductor_program(gm: GraphModule, example_inputs: list[Any]) -> GraphModule:
    from msched.compile import _inductor_internals as internals
    from msched.compile.kernel_order import kernel_order_program

    with internals.recording_final_orders() as orders:
        try:
            internals.compile_fx_uncached(gm, example_inputs)
        except MschedError:
            raise
        except Exception as error:  # Inductor's own failure, not a graph break
            raise _InductorFailed(error) from error
    if not orders:
        raise InvalidArgumentError("Inductor generated no code for the traced graph")
    return kernel_order_program(orders[-1])


def _stand_in(gm: GraphModule) -> Callable[..., Any]:
    """A function returning as many placeholders as ``gm`` has outputs."""
    outputs = gm.graph.output_node().args[0]
    count = len(outputs) if isinstance(outputs, (tuple, list)) else 1
    return lambda *args: [None] * count


def _table() -> dict[int, Any]:
    """Dynamo's table of external objects (streams, events) as it is while a graph compiles."""
    return dynamo_external_objects()


@contextlib.contextmanager
def _registered_caller(caller: torch.Stream) -> Iterator[None]:
    """While tracing on a build without an accelerator: Dynamo registers ``caller`` as the
    current stream at index 0, as it registers the current stream on CUDA."""
    if torch.accelerator.is_available():
        yield
        return
    with dynamo_current_stream(caller):
        yield


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def _untraced(fn: Callable[..., Any], error: Exception) -> MschedError:
    """The error `trace_streams` raises when no graph was kept: Dynamo could not trace ``fn``
    in one graph, or (``stage="inductor"``) Inductor failed on the graph it traced."""
    changed = _interface_error(error)
    if changed is not None:  # a torch interface msched reads changed: not fn's fault
        return changed
    inner = getattr(error, "inner_exception", None)
    if not isinstance(inner, _InductorFailed):
        return InvalidArgumentError(_why_not(fn, error))
    name = getattr(fn, "__qualname__", type(fn).__name__)
    return InvalidArgumentError(
        f"Inductor (torch {torch.__version__}) failed to compile the graph traced from {name} "
        f'({inner}); the graph itself traced: verify it with stage="aot" or stage="dynamo"'
    )


def _interface_error(error: BaseException) -> MschedError | None:
    """The `TorchInternalsError` or `InductorInterfaceError` behind ``error`` (Dynamo wraps
    what a backend raised in ``inner_exception``, what its own tracing raised as a cause)."""
    seen: set[int] = set()
    found: BaseException | None = error
    while found is not None and id(found) not in seen:
        if isinstance(found, (TorchInternalsError, InductorInterfaceError)):
            return found
        seen.add(id(found))
        found = getattr(found, "inner_exception", None) or found.__cause__ or found.__context__
    return None


def _why_not(fn: Callable[..., Any], error: Exception) -> str:
    name = getattr(fn, "__qualname__", type(fn).__name__)
    # Dynamo wraps what the capturing backend (AOT autograd, Inductor) raised; its own
    # message ends with "raised:" and says nothing.
    error = getattr(error, "inner_exception", None) or error
    text = str(error).lower()
    hint = ""
    if "support events" in text:
        hint = (
            "; on a CPU-only build Stream.record_event() cannot be traced: create the event "
            "(torch.Event()) and call event.record(stream)"
        )
    elif "no accelerator available" in text:
        hint = (
            "; on a CPU-only build torch.accelerator.synchronize() cannot be traced: "
            "synchronize the stream or the event instead"
        )
    elif "cuda" in text:
        hint = "; code written against torch.cuda traces on CPU inside msched.cuda_streams_on_cpu()"
    return f"cannot trace {name} in one graph: {_first_line(error)}{hint}"


@contextlib.contextmanager
def cuda_streams_on_cpu() -> Iterator[torch.Stream]:
    """Stand device-generic CPU streams in for ``torch.cuda``'s names while the block runs.

    ``torch.cuda.Stream(...)`` makes a ``torch.Stream(device="cpu")``, ``torch.cuda.Event(...)``
    a ``torch.Event(device="cpu")`` (timing and IPC flags are dropped),
    ``torch.cuda.current_stream()`` is the caller's stream (the one yielded, outside a
    compile; ``torch.accelerator.current_stream()`` while tracing; `trace_streams` inside
    the block takes it as its default ``caller_stream``, so a model that kept
    ``torch.cuda.current_stream()`` in ``__init__`` joins the right stream) and
    ``torch.cuda.stream(s)`` enters ``s``.  Build the model and call `trace_streams` inside
    the block.  Code that bound the names before the block (``from torch.cuda import
    Stream``) keeps the real ones; ``isinstance(x, torch.cuda.Stream)`` is False; nothing
    can run these streams' events on CPU.
    """
    names = ("Stream", "Event", "current_stream", "stream", "default_stream")
    saved = {name: getattr(torch.cuda, name) for name in names}
    ambient = torch.Stream(device="cpu")
    _AMBIENT.append(ambient)

    def stream_factory(device: Any = None, priority: int = 0, **kwargs: Any) -> torch.Stream:
        return torch.Stream(device="cpu")

    def event_factory(*args: Any, **kwargs: Any) -> torch.Event:
        return torch.Event(device="cpu")

    def current_stream(device: Any = None) -> torch.Stream:
        if torch.compiler.is_compiling():
            return torch.accelerator.current_stream()
        return ambient

    def enter(stream: torch.Stream | None) -> Any:
        return stream if stream is not None else contextlib.nullcontext()

    torch.cuda.Stream = stream_factory  # type: ignore[assignment,misc]
    torch.cuda.Event = event_factory  # type: ignore[assignment,misc]
    torch.cuda.current_stream = current_stream  # type: ignore[assignment]
    torch.cuda.default_stream = current_stream  # type: ignore[assignment]
    torch.cuda.stream = enter
    try:
        yield ambient
    finally:
        _AMBIENT.pop()
        for name, value in saved.items():
            setattr(torch.cuda, name, value)


__all__ = ["STAGES", "cuda_streams_on_cpu", "trace_streams"]
