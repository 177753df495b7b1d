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

from msched._torch_internals import OpOverload, OpOverloadPacket, qualified_name, schema_of
from msched.analysis.effects import STORAGE_META, Effects, compute_effects
from msched.analysis.nodes import INPUT_OPS
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


_OP_KINDS = (OpOverload, OpOverloadPacket)


def qualified_op_name(op: Any) -> str:
    """``op`` spelled as ``split_ops`` takes it: ``"aten::mm.default"``, ``"aten::mm"``."""
    if isinstance(op, OpOverload):
        schema = schema_of(op)
        return f"{schema.name}.{schema.overload_name or 'default'}"
    if isinstance(op, OpOverloadPacket):
        return qualified_name(op)
    return str(op)


def _is_split_op(node: Node, split_ops: tuple[Any, ...]) -> bool:
    """Whether ``node`` calls one of ``split_ops`` (see `backend` for how each is matched)."""
    if node.op != "call_function":
        return False
    target = node.target
    packet = getattr(target, "overloadpacket", None)
    return any(
        target is op or (packet is not None and packet is op) or _has_name(target, op)
        for op in split_ops
    )


def _has_name(target: Any, name: Any) -> bool:
    """Whether the op ``target`` is the one the qualified name ``name`` stands for (an
    ``OpOverloadPacket``, as Dynamo's graphs call custom ops, by a name without overload)."""
    if isinstance(name, str) and isinstance(target, OpOverloadPacket):
        return "." not in name and qualified_name(target) == name
    if not isinstance(name, str) or not isinstance(target, OpOverload):
        return False
    schema = schema_of(target)
    if "." not in name:
        return bool(schema.name == name)
    return f"{schema.name}.{schema.overload_name or 'default'}" == name


def check_split_ops_occur(graph: Graph, split_ops: tuple[Any, ...], name: str = "graph") -> None:
    """Say so when no op of ``split_ops`` is called in ``graph``.

    AOT autograd may decompose a split op (``aten.scaled_dot_product_attention``), and
    splitting at nothing would silently give one piece: when the graph has ops that look
    related (their name holds every word of a split op's name), raise `SplitOpNotFoundError`
    naming them.  A graph with nothing related has nothing to split (the graph after a graph
    break, say): it stays one piece, with a `SplitOpNotFoundWarning` naming its ops.
    """
    calls = [n for n in graph.nodes if n.op == "call_function"]
    if any(_is_split_op(n, split_ops) for n in calls):
        return
    targets = sorted(
        {qualified_op_name(n.target) for n in calls if isinstance(n.target, _OP_KINDS)}
    )
    for op in split_ops:
        words = set(_op_words(op))
        related = [t for t in targets if words <= set(_op_words(t))]
        if related:
            raise SplitOpNotFoundError(
                f"split op {qualified_op_name(op)} never occurs in {name}: AOT autograd "
                f"decomposed it; ops of the graph that look related: {', '.join(related)}; "
                f"split at those (split_ops={related!r})"
            )
    shown = ", ".join(targets[:12]) + (", ..." if len(targets) > 12 else "")
    ops = ", ".join(map(str, split_ops))
    warnings.warn(
        SplitOpNotFoundWarning(
            f"{name} calls no split op ({ops}), so it is one piece; its ops: {shown or 'none'}"
        ),
        stacklevel=2,
    )


def _op_words(op: Any) -> list[str]:
    """The words of an op's name without namespace and overload: ``aten.mm.default`` -> mm."""
    parts = str(op).replace("::", ".").split(".")  # namespace.name[.overload]
    return [w for w in parts[min(1, len(parts) - 1)].split("_") if w]


def split_pieces(gm: GraphModule, split_ops: tuple[Any, ...]) -> GraphModule:
    """Split ``gm`` so that every call of a ``split_ops`` op is a piece of its own.

    Pieces are the maximal runs of program order between split calls, so running them in
    order runs the program in order (mutations included).  Returns the stitching module;
    its ``submod_<k>`` attributes are the pieces, whose placeholders are labelled with the
    storage they receive (`label_piece_inputs`).
    """
    effects = compute_effects(gm.graph)
    partition: dict[Node, int] = {}
    current = 0
    for node in gm.graph.nodes:
        if node.op in INPUT_OPS or node.op == "output":
            continue
        if _is_split_op(node, split_ops):
            partition[node] = current + 1
            current += 2
        else:
            partition[node] = current
    module = split_module(
        gm,
        gm,
        partition.__getitem__,
        keep_original_order=True,
        keep_original_node_name=True,
        keep_original_input_name=True,
    )
    label_piece_inputs(module, gm.graph, effects)
    return module


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
    "Piece",
    "check_split_ops_occur",
    "label_piece_inputs",
    "qualified_op_name",
    "split_pieces",
]
