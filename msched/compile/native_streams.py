"""msched's schedule in PyTorch's own stream encoding, for Inductor to compile.

`to_native` rewrites a graph msched scheduled (``torch.ops.msched`` stream ops) the way
Dynamo writes user stream code: every node issued on stream ``s >= 1`` gets
``meta["custom"]["stream"] = stream_index(s)``, and each record / wait / record_stream
becomes a ``torch.ops.streams`` call on table indices msched owns (`stream_index`,
`event_index`), far above the indices Dynamo hands out.  Stream 0 is the caller's stream:
its nodes carry no annotation (Inductor runs them on the stream current at call time).

`tie_waits` makes Inductor keep the program order that matters.  Inductor (2.13) gives a
``wait_event`` no users, so it moves kernels in front of it: every stream op is wrapped in
``control_deps`` after the work its stream issued since its previous stream op (a wait also
after the record it waits for), and every node after a wait on its stream is tied to the wait
(``preserve_node_ordering``) unless every storage it reads or writes was made on its stream
after that wait: ties hold per kernel, since Inductor may lower one node into several kernels
(``cat`` into one copy per input), each ordered only by the data it reads.

`NativeStreams` owns the streams and events the indices stand for and writes them into
Dynamo's table before every call (CUDA: real streams and events, index `CALLER` the
caller's current stream; CPU: stand-ins whose record and wait do nothing, and a
``record_stream`` that does nothing, which ``aten`` lacks for CPU tensors).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch.fx import GraphModule, Node

from msched import ops as mops
from msched._torch_internals import set_dynamo_external_objects
from msched.analysis.effects import compute_effects
from msched.compile._inductor_internals import AFTER_WAIT_META

#: Table index of msched's stream 0 (the caller's current stream), of stream s >= 1, and of
#: event e: far from Dynamo's 0, 1, ... (one per stream or event a traced frame names), so
#: user stream code and msched never collide; and near enough for torch 2.15, whose table
#: is a list that msched pads up to the highest index it writes.
CALLER = 1_000
EVENT_BASE = 2_000


def stream_index(stream: int) -> int:
    return CALLER + stream


def event_index(event: int) -> int:
    return EVENT_BASE + event


def _streams() -> Any:
    import torch._dynamo.variables.streams  # noqa: F401  (registers torch.ops.streams)

    return torch.ops.streams


def to_native(gm: GraphModule) -> None:
    """Rewrite msched's stream ops in ``gm`` (see the module docstring); in place."""
    graph = gm.graph
    streams = _streams()
    current = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        target = node.target
        with graph.inserting_before(node):
            if target is mops.set_stream:
                current = _switch(graph, node, current, streams)
            elif target is mops.record_event:
                graph.call_function(streams.record_event.default, _event_args(node, current))
            elif target is mops.wait_event:
                graph.call_function(streams.wait_event.default, _event_args(node, current))
            elif target is mops.record_stream:
                tensor, stream = node.args[0], _int(node.args[1])
                graph.call_function(streams.record_stream.default, (tensor, stream_index(stream)))
            else:
                if current:
                    node.meta["custom"] = {
                        **node.meta.get("custom", {}),
                        "stream": stream_index(current),
                    }
                continue
        graph.erase_node(node)
    graph.lint()


def _int(value: Any) -> int:
    """A literal int argument of a stream op (msched's emitter writes only those)."""
    return int(value)


def _event_args(node: Node, current: int) -> tuple[int, int]:
    return (event_index(_int(node.args[0])), stream_index(current))


def _switch(graph: Any, node: Node, current: int, streams: Any) -> int:
    """``set_stream(s, waits, records)``: records on the old stream, waits on the new one."""
    target = _int(node.args[0])
    waits = _listed(node, 1, "wait_events")
    records = _listed(node, 2, "record_events")
    for event in records:
        graph.call_function(
            streams.record_event.default, (event_index(event), stream_index(current))
        )
    for event in waits:
        graph.call_function(streams.wait_event.default, (event_index(event), stream_index(target)))
    return target


def _listed(node: Node, position: int, name: str) -> list[int]:
    value: Any = node.args[position] if len(node.args) > position else node.kwargs.get(name, ())
    return [_int(e) for e in value]


def _sync_ops() -> tuple[Any, ...]:
    streams = _streams()
    return (streams.record_event.default, streams.wait_event.default)


def _stream_of(node: Node) -> int:
    if node.target in _sync_ops():
        return _int(node.args[1])
    custom = node.meta.get("custom") or {}
    return int(custom.get("stream", CALLER))


class _Ties:
    """The state of `tie_waits`' walk over the graph in program order."""

    def __init__(self, gm: GraphModule) -> None:
        self.gm = gm
        self.inputs = list(gm.graph.find_nodes(op="placeholder"))
        self.effects = compute_effects(gm.graph)
        self.since_sync: dict[int, list[Node]] = {}
        self.last_sync: dict[int, Node] = {}
        self.last_record: dict[int, Node] = {}
        self.waits_of: dict[int, list[Node]] = {}
        self.after_wait: dict[int, tuple[Node, set[Node]]] = {}
        self.followers: dict[Node, Node] = {}
        self.wait_streams: dict[str, int] = {}  # wait (its control_deps node) -> stream
        self.syncs: set[str] = set()  # every stream op's control_deps node

    def sync(self, node: Node, wrap: Any) -> None:
        stream, event = _stream_of(node), _int(node.args[0])
        is_wait = node.target is _streams().wait_event.default
        after = list(self.since_sync.get(stream, ()))
        if not after:
            after = [self.last_sync[stream]] if stream in self.last_sync else self.inputs
        if is_wait and event in self.last_record:
            after.insert(0, self.last_record[event])
        if not is_wait:
            after += self.waits_of.get(event, [])
        ctrl = wrap(self.gm, node, after)
        self.syncs.add(ctrl.name)
        if is_wait:
            self.wait_streams[ctrl.name] = stream
            self.waits_of.setdefault(event, []).append(ctrl)
            self.after_wait[stream] = (ctrl, set())
        else:
            self.last_record[event] = ctrl
        self.last_sync[stream] = ctrl
        self.since_sync[stream] = []

    def compute(self, node: Node) -> None:
        stream = _stream_of(node)
        self.since_sync.setdefault(stream, []).append(node)
        if stream in self.after_wait:
            wait, made_since = self.after_wait[stream]
            if not self._only_touches(node, made_since):
                self.followers[node] = wait
            if self._touches_any(node):
                made_since.add(node)

    def _touches_any(self, node: Node) -> bool:
        """Whether ``node`` reads or writes a storage.  One that does not (``full``,
        ``arange``) may lower to a value Inductor computes only where a later node needs it
        realized: its kernel then reads nothing and is ordered by nothing, unless the node
        that realizes it is tied, so its users do not count it as made after the wait."""
        return bool(self.effects.reads.get(node) or self.effects.writes.get(node))

    def _only_touches(self, node: Node, made_since: set[Node]) -> bool:
        """Whether every storage ``node`` reads or writes was made on its stream after the
        stream's last wait (by a node in ``made_since``): then each kernel Inductor lowers
        ``node`` into is ordered after the wait through the data it touches.  A storage
        from before the wait or from another stream (also through a view, which makes no
        kernel: ``cat`` of a slice of another stream's value lowers to a copy kernel that
        reads that value) needs the tie; so does a node that touches no storage."""
        effects = self.effects
        touched = (*effects.reads.get(node, ()), *effects.writes.get(node, ()))
        return bool(touched) and all(self._made(s, made_since) for s in touched)

    @staticmethod
    def _made(storage: Node, made_since: set[Node]) -> bool:
        if storage.target is operator.getitem and isinstance(storage.args[0], Node):
            storage = storage.args[0]  # a result of a multi-output node
        return storage in made_since


def tie_waits(gm: GraphModule) -> int:
    """Wrap stream ops in ``control_deps`` and tie followers of waits (module docstring);
    returns how many nodes were tied to a wait."""
    from msched.compile import _inductor_internals as internals

    ties = _Ties(gm)
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in _sync_ops():
            ties.sync(node, internals.wrap_in_control_deps)
        elif "val" in node.meta and node.target is not operator.getitem:
            ties.compute(node)
    internals.order_after(gm.graph, ties.followers)
    gm.graph.lint()
    gm.meta[AFTER_WAIT_META] = _after_waits(gm, ties.wait_streams, ties.syncs)
    return len(ties.followers)


def _after_waits(gm: GraphModule, waits: dict[str, int], syncs: set[str]) -> dict[str, Any]:
    """What `msched.compile._inductor_internals` needs to tie every *kernel* to the wait its
    node follows (`tie_kernels`): a node Inductor lowers to a value it computes only where
    another node needs it (a pointwise ``add``) is realized inside that node, which may be
    a stream op's ``control_deps`` whose dependencies get no tie; its kernel was then
    ordered by its data alone and ran before its stream's wait (a static KV cache)."""
    positions: dict[str, int] = {}
    latest: dict[int, tuple[str, int]] = {}
    after: dict[str, tuple[str, int]] = {}
    for i, node in enumerate(gm.graph.nodes):
        positions[node.name] = i
        if node.op != "call_function":
            continue
        if node.name in waits:
            latest[waits[node.name]] = (node.name, i)
        if node.name in syncs:
            continue
        stream = _stream_of(node)  # a tied node's control_deps keeps its custom stream
        if stream in latest:
            after[node.name] = latest[stream]
    return {"after": after, "positions": positions}


class _CpuStream(torch.Stream):
    """A CPU stream that can be entered and waited on (nothing runs on CPU streams)."""

    def wait_stream(self, stream: Any) -> None:
        return None

    def __enter__(self) -> _CpuStream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _CpuEvent(torch.Event):
    """A CPU event whose record and wait do nothing (CPU work runs in program order)."""

    def record(self, stream: Any = None) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None


class NativeStreams:
    """The streams and events one compiled graph's table indices stand for."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self._streams: dict[int, torch.Stream] = {}
        self._events: dict[int, torch.Event] = {}
        self._cpu_caller = _CpuStream(device="cpu")
        if not self.cuda:
            from msched.compile._inductor_internals import let_cpu_tensors_record_streams

            let_cpu_tensors_record_streams()

    def stream(self, stream: int) -> torch.Stream:
        if stream == 0:
            return torch.cuda.current_stream(self.device) if self.cuda else self._cpu_caller
        if stream not in self._streams:
            made = torch.cuda.Stream(self.device) if self.cuda else _CpuStream(device="cpu")
            self._streams[stream] = made
        return self._streams[stream]

    def event(self, event: int) -> torch.Event:
        if event not in self._events:
            made = torch.cuda.Event() if self.cuda else _CpuEvent(device="cpu")
            self._events[event] = made
        return self._events[event]

    def install(self, num_streams: int, num_events: int) -> Callable[[], None]:
        """Write this graph's streams and events into Dynamo's table (before every call:
        Dynamo's frame prologue clears entries it did not register).  The table is one per
        process and every build uses the same indices: a caller keeps the table as installed
        until its code has run (`msched.compile.inductor_backend.CompiledPiece` holds a lock
        from here to the return of the code), then undoes the install (the returned
        callable): Dynamo's own objects at these indices, in a frame that made over 1000
        streams or events, are back for the code after the graph."""
        objects: dict[int, Any] = {stream_index(s): self.stream(s) for s in range(num_streams)}
        objects.update((event_index(e), self.event(e)) for e in range(num_events))
        return set_dynamo_external_objects(objects)


__all__ = [
    "CALLER",
    "EVENT_BASE",
    "NativeStreams",
    "event_index",
    "stream_index",
    "tie_waits",
    "to_native",
]
