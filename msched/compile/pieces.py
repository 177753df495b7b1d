"""The pieces of a graph: `Piece` (one scheduled graph of a backend) and splitting a graph
at its split ops (``piecewise=True``), shared by both compilers (`msched.compile.compiler`,
`msched.compile.inductor_backend`), which is why it sits below them.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from torch.fx import Graph, GraphModule, Node
from torch.fx.passes.split_module import split_module

from msched._torch_internals import dynamo_frame_id
from msched.analysis.effects import Effects, compute_effects
from msched.analysis.input_storages import STORAGE_META
from msched.analysis.nodes import INPUT_OPS
from msched.compile.split_ops import OP_KINDS, CallIndex, describe, qualified_op_name
from msched.errors import InvalidGraphError, SplitOpNotFoundError, SplitOpNotFoundWarning
from msched.proof.verifier import Report
from msched.scheduling.pipeline import Schedule


@dataclass(frozen=True)
class Piece:
    """One scheduled graph: ``name`` is ``graph<i>`` or ``graph<i>.submod_<k>``.

    ``gm`` is the scheduled module as the runtime calls it; ``schedule.original`` is the
    piece before scheduling; ``report`` is the verification report (None if not verified).
    With ``compiler="inductor"``: ``gm`` is the post-grad graph msched scheduled, ``code``
    Inductor's output source, ``kernel_order`` its final kernel order as a stream program
    (`msched.compile.kernel_order`) and ``report`` the verification of that program; when
    Inductor served the code from its cache, msched's pass did not run: ``schedule`` is None,
    ``gm`` is the piece as Dynamo gave it, and ``kernel_order`` is the order kept when that
    code was compiled (`msched.compile.order_records`; None when none was kept and
    ``verify=False``: a verified build compiles such a piece again).
    """

    name: str
    gm: GraphModule
    schedule: Schedule | None
    report: Report | None
    code: str = ""
    kernel_order: GraphModule | None = None


_OP_KINDS = OP_KINDS
#: ``meta`` key of a split module: the names of its submodules that are split calls.
SPLIT_CALLS_META = "msched_split_calls"


def _is_split_op(node: Node, split_ops: tuple[Any, ...]) -> bool:
    """Whether ``node`` calls one of ``split_ops`` (`msched.compile.split_ops`)."""
    return CallIndex(node.graph.owning_module).matches(node, split_ops)


def find_split_calls(graph: Graph, split_ops: tuple[Any, ...]) -> dict[Node, str]:
    """Every node of ``graph`` that calls one of ``split_ops``, with the call of the user's
    program it belongs to (`CallIndex.call_of`): consecutive nodes of one call are one piece."""
    index = CallIndex(graph.owning_module)
    return {n: index.call_of(n) for n in graph.nodes if index.matches(n, split_ops)}


def check_split_ops_occur(
    graph: Graph,
    split_ops: tuple[Any, ...],
    name: str = "graph",
    calls: dict[Node, str] | None = None,
    warned: set[tuple[Any, ...]] | None = None,
) -> None:
    """Say so when no op of ``split_ops`` is called in ``graph`` (``calls``: its
    `find_split_calls`, found again when not given).

    ``warned`` (a backend's own set) makes the warning once per graph: Dynamo compiles one
    function again for other sizes (static first, then dynamic) and restarts some compiles,
    and each of those warned again, twice per rank for every attention-free graph a graph
    break left.  A warning is keyed by the function Dynamo compiles (its frame) and what
    the graph calls, and said once per key.

    AOT autograd may decompose a split op, and splitting at nothing would silently give one
    piece: when the graph calls ops that look related (their name holds every word of a
    split op's name), raise `SplitOpNotFoundError` naming them.  A graph with nothing
    related has nothing to split (the graph after a graph break, say): it stays one piece,
    with a `SplitOpNotFoundWarning` naming everything it calls (ops, torch-level functions,
    Tensor methods, modules), each once, sorted.
    """
    if calls is None:
        calls = find_split_calls(graph, split_ops)
    if calls:
        return
    index = CallIndex(graph.owning_module)
    nodes = [n for n in graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    targets = sorted(
        {qualified_op_name(n.target) for n in nodes if isinstance(n.target, _OP_KINDS)}
    )
    for op in split_ops:
        is_op = isinstance(op, _OP_KINDS) or (isinstance(op, str) and "::" in op)
        words = set(_op_words(op)) if is_op else None
        related = [t for t in targets if words and words <= set(_op_words(t))]
        if related:
            raise SplitOpNotFoundError(
                f"split op {describe(op)} never occurs in {name}: it was decomposed (AOT "
                f"autograd decomposes ops); ops of the graph that look related: "
                f"{', '.join(related)}; "
                f"split at those (split_ops={related!r})"
            )
    called = sorted({index.call(n).label for n in nodes})
    ops = ", ".join(map(describe, split_ops))
    if warned is not None:
        key = (dynamo_frame_id(), ops, tuple(called))
        if key in warned:
            return
        warned.add(key)
    warnings.warn(
        SplitOpNotFoundWarning(
            f"{name} calls no split op ({ops}), so it is one piece; "
            f"it calls: {', '.join(called) or 'nothing'}"
        ),
        stacklevel=2,
    )


def _op_words(op: Any) -> list[str]:
    """The words of an op's name without namespace and overload: ``aten.mm.default`` -> mm."""
    parts = qualified_op_name(op).replace("::", ".").split(".")  # namespace.name[.overload]
    return [w for w in parts[min(1, len(parts) - 1)].split("_") if w]


def split_pieces(
    gm: GraphModule, split_ops: tuple[Any, ...], calls: dict[Node, str] | None = None
) -> GraphModule:
    """Split ``gm`` so that every call of a ``split_ops`` op is a piece of its own
    (``calls``: the graph's `find_split_calls`, found again when not given).

    Pieces are the maximal runs of program order between split calls, so running them in
    order runs the program in order (mutations included); consecutive nodes of one call
    (a kernel and the ``getitem`` of its output) are one split piece.  Returns the stitching
    module; its ``submod_<k>`` attributes are the pieces, whose placeholders are labelled with
    the storage they receive (`label_piece_inputs`), and ``meta[SPLIT_CALLS_META]`` names
    the split pieces (`split_call_pieces`).
    """
    if calls is None:
        calls = find_split_calls(gm.graph, split_ops)
    effects = compute_effects(gm.graph)
    partition: dict[Node, int] = {}
    current, last_call = 0, None
    for node in gm.graph.nodes:
        if node.op in INPUT_OPS or node.op == "output":
            continue
        call = calls.get(node)
        if call is not None and call != last_call:
            current += 1 if current % 2 == 0 else 2
        elif call is None and current % 2 == 1:
            current += 1
        partition[node] = current
        last_call = call
    module = split_module(
        gm,
        gm,
        partition.__getitem__,
        keep_original_order=True,
        keep_original_node_name=True,
        keep_original_input_name=True,
    )
    label_piece_inputs(module, gm.graph, effects)
    split = {f"submod_{k}" for k in partition.values() if k % 2 == 1}
    module.meta[SPLIT_CALLS_META] = tuple(s for s in _submodule_calls(module) if s in split)
    return module


def split_call_pieces(module: GraphModule) -> tuple[str, ...]:
    """The submodules of a `split_pieces` module that are split calls, in order."""
    return tuple(module.meta.get(SPLIT_CALLS_META, ()))


def label_piece_inputs(module: GraphModule, parent: Graph, effects: Effects) -> None:
    """Set ``meta["msched_storage"]`` on every placeholder of every piece of ``module``.

    The label names the storage, in ``parent`` (the unsplit graph), of the value the
    placeholder receives, so placeholders that receive views of one storage (``select`` of
    ``arg0_1`` and ``arg0_1`` itself) carry one label and `msched.analysis.effects` sees one
    storage.  Storages that may alias each other there (the result of a call msched knows
    nothing about and its inputs) get one label too: coarser, never unsound.  ``split_module`` (with
    ``keep_original_input_name``) makes each placeholder's target the name of the node of
    ``parent`` it receives.
    """
    by_name = {n.name: n for n in parent.nodes}
    label = _storage_labels(parent, effects)
    for sub in _submodule_calls(module):
        for placeholder in getattr(module, sub).graph.find_nodes(op="placeholder"):
            value = by_name.get(str(placeholder.target))
            if value is None:
                raise InvalidGraphError(
                    f"piece {sub}: input {placeholder.name!r} names no node of the split graph, "
                    "so msched cannot tell which storage it receives",
                    nodes=(placeholder.name,),
                )
            placeholder.meta[STORAGE_META] = label[effects.root[value]]


def _storage_labels(parent: Graph, effects: Effects) -> dict[Node, str]:
    """One label per class of storages that may alias (union of `Effects.aliases`): the name
    of the class's first storage in graph order."""
    leader: dict[Node, Node] = {}

    def find(s: Node) -> Node:
        while leader.get(s, s) is not s:
            s = leader[s]
        return s

    order = {n: i for i, n in enumerate(parent.nodes)}
    for storages in effects.aliases.values():
        heads = sorted({find(s) for s in storages}, key=lambda s: order.get(s, len(order)))
        for other in heads[1:]:
            leader[other] = heads[0]
    return {r: find(r).name for r in set(effects.root.values())}


def _submodule_calls(module: GraphModule) -> list[str]:
    return [str(n.target) for n in module.graph.nodes if n.op == "call_module"]


__all__ = [
    "SPLIT_CALLS_META",
    "Piece",
    "check_split_ops_occur",
    "find_split_calls",
    "label_piece_inputs",
    "split_call_pieces",
    "split_pieces",
]
