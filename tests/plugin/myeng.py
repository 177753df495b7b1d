"""An inference engine of its own design, for the plugin's trust tests: ``myeng``.

It shares nothing with msched's stream encoding:

- stream ops ``myeng::switch(int stream)`` (later work runs on ``stream``),
  ``myeng::record(str name)`` / ``myeng::wait(str name)`` (events named by strings, recorded
  and waited on the current stream) and a stream-wide ``myeng::join(int stream)`` (the current
  stream waits for everything issued on ``stream``); `DIALECT` reads them, and a host-only
  ``myeng::event_create(str name)`` (it makes an event on the host: nothing happens on a
  stream; `DIALECT` reads no action in it, the pass does not emit it);
- a capture op ``myeng::stash(Tensor(a!) dest, Tensor src, int start, int end)`` and an
  in-place op ``myeng::scale_(Tensor(a!) x, float factor)``;
- a model (`model`): per layer ``h = h @ w_i`` (a weight loaded with ``get_attr``), a stash
  of ``h`` into columns of ``dest``, then (every layer but the last) ``scale_(h)`` in place;
- a multi-stream pass (`schedule`): each stash runs on an auxiliary stream (round robin over
  streams ``1..num_streams-1``) after a wait for the event recorded after ``h``; stream 0
  waits for the stash's event before ``scale_`` overwrites ``h``; ``output`` joins every
  auxiliary stream.

`BUG` switches on one of three bugs of that pass: ``"after_output"`` (the last stash and its
stream ops end up after ``output``), ``"no_join"`` (no join before ``output``: the last stash
races with the exit), ``"war"`` (no wait before ``scale_``: a stash on an auxiliary stream
reads ``h`` while stream 0 overwrites it).  `LAZY` makes the pass use stream 1 only.

The module registers its namespace on import, once per process: the tests import it as
``tests.plugin.myeng``, and the downstream repositories of ``test_trust`` copy it as
``myeng.py`` (each pytest there runs in a process of its own).
"""

from __future__ import annotations

import torch
from torch.fx import Graph, GraphModule, Node
from torch.fx.node import has_side_effect

import msched
from msched.proof import actions

NAMESPACE = "myeng"
HIDDEN = 4
LAYERS = 3

_lib = torch.library.Library(NAMESPACE, "DEF")
_lib.define("switch(int stream) -> ()")
_lib.define("record(str name) -> ()")
_lib.define("wait(str name) -> ()")
_lib.define("join(int stream) -> ()")
_lib.define("event_create(str name) -> ()")
_lib.define("stash(Tensor(a!) dest, Tensor src, int start, int end) -> ()")
_lib.define("scale_(Tensor(a!) x, float factor) -> ()")


def _nothing(*args: object) -> None:
    return None


def _stash(dest: torch.Tensor, src: torch.Tensor, start: int, end: int) -> None:
    dest.narrow(-1, start, end - start).copy_(src)


def _scale(x: torch.Tensor, factor: float) -> None:
    x.mul_(factor)


for _name, _impl in (
    ("switch", _nothing),
    ("record", _nothing),
    ("wait", _nothing),
    ("join", _nothing),
    ("event_create", _nothing),
    ("stash", _stash),
    ("scale_", _scale),
):
    _lib.impl(_name, _impl, "CompositeExplicitAutograd")

_ops = torch.ops.myeng
SWITCH, RECORD, WAIT, JOIN, EVENT_CREATE = (
    _ops.switch.default,
    _ops.record.default,
    _ops.wait.default,
    _ops.join.default,
    _ops.event_create.default,
)
STASH, SCALE = _ops.stash.default, _ops.scale_.default
for _op in (SWITCH, RECORD, WAIT, JOIN, EVENT_CREATE):
    has_side_effect(_op)


def _literal(node: Node, kind: type) -> object:
    value = node.args[0] if node.args else next(iter(node.kwargs.values()))
    if not isinstance(value, kind):
        raise msched.InvalidGraphError(f"{node.name}: expected a literal {kind.__name__}")
    return value


DIALECT = msched.Dialect.define(
    "myeng",
    {
        "myeng::switch": lambda n: (actions.switch(_literal(n, int)),),
        "myeng::record": lambda n: (actions.record(_literal(n, str)),),
        "myeng::wait": lambda n: (actions.wait(_literal(n, str)),),
        "myeng::join": lambda n: (actions.wait_stream(None, _literal(n, int)),),
        "myeng::event_create": lambda n: (),
    },
)

BUG: str | None = None
"""The bug the pass reproduces: None, ``"after_output"``, ``"no_join"`` or ``"war"``."""
LAZY = False
"""When true, the pass runs every stash on stream 1, whatever stream count it is given."""


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        for i in range(LAYERS):
            weight = torch.randn(HIDDEN, HIDDEN, generator=generator)
            self.register_buffer(f"w{i}", weight)

    def forward(self, x: torch.Tensor, dest: torch.Tensor) -> torch.Tensor:
        h = x
        for i in range(LAYERS):
            h = torch.mm(h, getattr(self, f"w{i}"))
            STASH(dest, h, i * HIDDEN, (i + 1) * HIDDEN)
            if i < LAYERS - 1:
                SCALE(h, 0.5)
        return h


def model() -> GraphModule:
    """The engine's model, traced: ``(x, dest) -> h``; it stashes every layer into ``dest``."""
    return torch.fx.symbolic_trace(Model())


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, dest)``: a fixed input and a zero buffer for the stashes."""
    x = torch.randn(2, HIDDEN, generator=torch.Generator().manual_seed(1))
    return x, torch.zeros(2, HIDDEN * LAYERS)


def stashes(gm: GraphModule) -> list[Node]:
    return [n for n in gm.graph.nodes if n.target is STASH]


def _insert(graph: Graph, before: Node, op: object, arg: object) -> Node:
    with graph.inserting_before(before):
        return graph.call_function(op, (arg,))


def _scale_of(stash: Node) -> Node | None:
    """The ``scale_`` that overwrites the stash's source after it, if any."""
    src = stash.args[1]
    assert isinstance(src, Node)
    return next((u for u in src.users if u.target is SCALE), None)


def _aux_stream(k: int, num_streams: int) -> int:
    return 1 if LAZY else 1 + k % (num_streams - 1)


def schedule(gm: GraphModule, num_streams: int) -> None:
    """Run every stash on an auxiliary stream, in place (``num_streams`` >= 2); see the
    module docstring for the encoding and `BUG` for what can go wrong."""
    graph = gm.graph
    output = graph.output_node()
    used: list[int] = []
    for k, stash in enumerate(stashes(gm)):
        stream = _aux_stream(k, num_streams)
        used += [stream] if stream not in used else []
        _insert(graph, stash, RECORD, f"src{k}")
        _insert(graph, stash, SWITCH, stream)
        _insert(graph, stash, WAIT, f"src{k}")
        after = stash.next
        _insert(graph, after, RECORD, f"stash{k}")
        _insert(graph, after, SWITCH, 0)
        scale = _scale_of(stash)
        if scale is not None and BUG != "war":
            _insert(graph, scale, WAIT, f"stash{k}")
    if BUG != "no_join":
        for stream in used:
            _insert(graph, output, JOIN, stream)
    if BUG == "after_output":
        _move_after_output(graph, stashes(gm)[-1])
    gm.recompile()


def _move_after_output(graph: Graph, stash: Node) -> None:
    """The bug: the last stash, from its record to its switch back, goes after ``output``."""
    first, last = stash.prev.prev.prev, stash.next.next
    block = []
    node = first
    while node is not last.next:
        block.append(node)
        node = node.next
    at = graph.output_node()
    for node in block:
        at.append(node)
        at = node
