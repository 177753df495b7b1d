"""What a stream op does on the host timeline: the actions a `msched.Dialect` reads a node as.

Every reader of a scheduled graph (`msched.verify`, the executor, the timeline, the pictures,
the plugin) sees stream code only as these actions, in host order, so one engine's stream ops
and another's mean the same thing once read.  A dialect maps a node to a sequence of them
(`Reader`); a node that maps to none is host-only bookkeeping (it runs no work on a stream).

- `switch(s)`: later work is issued on stream ``s`` (the current stream);
- `record(e, s)`: event ``e`` is recorded on stream ``s`` (the current one when None);
- `wait(e, s)`: stream ``s`` (current when None) waits for the latest earlier record of ``e``;
- `wait_stream(s, t)`: stream ``s`` waits for all work issued on stream ``t`` so far;
- `record_stream(x, s)`: tensor ``x`` is used on stream ``s`` (the caching allocator's rule);
- `synchronize(stream=s)`, `synchronize(event=e)`, `synchronize()`: the host blocks until
  the stream, the event or the whole device is done; later work on every stream comes after;
- `passes(x)`: the node's value is ``x`` (an identity passthrough: readers see through it).

Streams and events are named by any hashable key.  An ``int`` is a stream id as the graph
writes it (0 is the caller's stream; ids stay as they are, below `msched.MAX_STREAMS`); any
other key (a PyTorch stream table index, an AutoDeploy stream name) is numbered after the
int ids in order of first appearance, except the dialect's ``caller_stream`` key, which is 0.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import NamedTuple, TypeGuard

from torch.fx import Node

from msched.errors import InvalidGraphError

ACTION_KINDS = (
    "set_stream",
    "record_event",
    "wait_event",
    "wait_stream",
    "record_stream",
    "synchronize",
)


class Action(NamedTuple):
    """One thing a stream op does; build it with the functions of this module.

    ``stream`` is the stream acted on (None: the current one); ``to_stream`` the stream a
    switch goes to, a `wait_stream` waits for, a `record_stream` marks or a `synchronize`
    waits for; ``event`` the event recorded, waited for or synchronized; ``tensor`` the
    tensor of a `record_stream` (None when it is not a node of the graph).
    """

    kind: str
    stream: Hashable | None = None
    event: Hashable | None = None
    to_stream: Hashable | None = None
    tensor: Node | None = None


Reader = Callable[[Node], Sequence[Action]]
"""A dialect's reading of one of its stream ops: the actions of a node, in order."""


def switch(stream: Hashable) -> Action:
    """Later work is issued on ``stream``."""
    return Action("set_stream", to_stream=stream)


def record(event: Hashable, stream: Hashable | None = None) -> Action:
    """``event`` is recorded on ``stream`` (the current stream when None)."""
    return Action("record_event", stream=stream, event=event)


def wait(event: Hashable, stream: Hashable | None = None) -> Action:
    """``stream`` (the current stream when None) waits for the latest earlier record of
    ``event``; a wait on an event not recorded before it waits for nothing."""
    return Action("wait_event", stream=stream, event=event)


def wait_stream(stream: Hashable | None, other: Hashable) -> Action:
    """``stream`` (the current stream when None) waits for all work issued on ``other`` so
    far (``torch.Stream.wait_stream``)."""
    return Action("wait_stream", stream=stream, to_stream=other)


def record_stream(tensor: Node | None, stream: Hashable) -> Action:
    """``tensor`` is used on ``stream``: its memory is not reused before that stream's work
    issued so far is done (``Tensor.record_stream``)."""
    return Action("record_stream", to_stream=stream, tensor=tensor)


def synchronize(*, stream: Hashable | None = None, event: Hashable | None = None) -> Action:
    """The host waits for ``stream``, for ``event``'s latest record, or (neither given) for
    the whole device; everything issued later, on any stream, comes after."""
    if stream is not None and event is not None:
        raise InvalidGraphError("synchronize waits for a stream or an event, not both")
    return Action("synchronize", event=event, to_stream=stream)


def passes(value: Node) -> Action:
    """The stream op's value is ``value`` itself (AutoDeploy's passthrough functions, the
    ``getitem`` of PyTorch's ``control_deps``): users of the node use ``value``."""
    return Action("alias", tensor=value)


def int_argument(node: Node, index: int, op: str, name: str | None = None) -> int:
    """Argument ``index`` (or keyword ``name``) of ``node``: a literal non-negative int.

    For readers: raises `msched.InvalidGraphError` naming the node and its ``op`` (for
    example ``"wait_event"``) when the argument is missing, not an int literal, or negative.
    """
    which = f"argument {index}" + (f" ({name})" if name else "")
    if len(node.args) > index:
        value = node.args[index]
    elif name is not None and name in node.kwargs:
        value = node.kwargs[name]
    elif len(node.args) + len(node.kwargs) > index:
        value = (tuple(node.args) + tuple(node.kwargs.values()))[index]
    else:
        raise InvalidGraphError(f"{op} node {node.name!r} has no {which}", nodes=(node.name,))
    if is_literal_id(value):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidGraphError(
            f"{op} node {node.name!r} takes a literal int as {which}, got {value!r}; stream "
            "and event ids must be constants in the graph",
            nodes=(node.name,),
        )
    raise InvalidGraphError(
        f"{op} node {node.name!r} has a negative id {value} as {which}", nodes=(node.name,)
    )


def is_literal_id(value: object) -> TypeGuard[int]:
    """Whether ``value`` is a stream id, event id or table index as a graph writes one: a
    non-negative ``int`` (not a ``bool``)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def tensor_argument(node: Node, index: int = 0, name: str = "t") -> Node | None:
    """Argument ``index`` (or keyword ``name``) of ``node`` when it is a node of the graph."""
    value = node.args[index] if len(node.args) > index else node.kwargs.get(name)
    return value if isinstance(value, Node) else None


__all__ = [
    "ACTION_KINDS",
    "Action",
    "Reader",
    "int_argument",
    "is_literal_id",
    "passes",
    "record",
    "record_stream",
    "switch",
    "synchronize",
    "tensor_argument",
    "wait",
    "wait_stream",
]
