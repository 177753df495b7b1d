"""Facts about FX graphs that every stage shares: which nodes are graph inputs, the graph of a
module, and a node by its name.

One definition each, so that the scheduler, the verifier, the pictures and the tests agree:

- `INPUT_OPS`: the node ops whose value exists before the graph runs (placeholders and
  ``get_attr``); they cost nothing and are ready on the caller's stream;
- `graph_of`: the ``torch.fx.Graph`` of a GraphModule (or the graph itself), or an
  `msched.InvalidArgumentError` saying what was expected;
- `node_named`: the node of a graph with a given name (`msched.schedule` keeps names), or an
  `msched.InvalidArgumentError` naming what is missing;
- `NodeList`: what a pass over a graph's nodes in program order reads (a `Graph`, or a
  stand-in listing another graph's nodes); `inputs_first`: a graph's nodes with every node
  after its inputs, for a graph whose order may use a node early (a broken schedule).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from torch.fx import Graph, GraphModule, Node

from msched.errors import InvalidArgumentError

#: The ops of nodes that are graph inputs: their values exist before the graph runs.
INPUT_OPS = ("placeholder", "get_attr")


def graph_of(gm: GraphModule | Graph) -> Graph:
    """The graph of ``gm`` (a ``GraphModule``), or ``gm`` itself when it is a ``Graph``."""
    if isinstance(gm, GraphModule):
        return gm.graph
    if isinstance(gm, Graph):
        return gm
    raise InvalidArgumentError(
        f"expected a torch.fx.GraphModule or Graph, got {type(gm).__name__}; "
        "trace your module with torch.fx.symbolic_trace or torch.compile first"
    )


def node_named(gm: GraphModule | Graph, name: str, where: str = "the graph") -> Node:
    """The node of ``gm`` named ``name``; `msched.InvalidArgumentError` when there is none.

    ``where`` names the graph in the message (``"the scheduled graph"``, ...).  One pass over
    the nodes: look nodes up once, not in a loop over a large graph.
    """
    for node in graph_of(gm).nodes:
        if node.name == name:
            return node
    raise InvalidArgumentError(f"no node named {name!r} in {where}")


class NodeList(Protocol):
    """What `msched.analysis.effects.compute_effects` reads of a graph: its nodes in program
    order.  A `Graph`, or a stand-in listing another graph's nodes (`inputs_first` lists a
    broken schedule's nodes inputs-first)."""

    @property
    def nodes(self) -> Iterable[Node]: ...


def inputs_first(graph: Graph) -> NodeList:
    """``graph``, or a stand-in listing its nodes inputs-first when some node is used before
    its definition (a broken schedule): a pass in program order needs every input seen first."""
    seen: set[Node] = set()
    for node in graph.nodes:
        if any(i not in seen for i in node.all_input_nodes):
            return _Listed(_topological(graph))
        seen.add(node)
    return graph


@dataclass(frozen=True)
class _Listed:
    nodes: tuple[Node, ...]


def _topological(graph: Graph) -> tuple[Node, ...]:
    """Every node after its inputs, otherwise in graph order."""
    done: dict[Node, None] = {}
    for node in graph.nodes:
        stack = [node]
        while stack:
            top = stack[-1]
            if top in done:
                stack.pop()
                continue
            missing = [i for i in top.all_input_nodes if i not in done]
            if missing:
                stack.extend(missing)
            else:
                done[stack.pop()] = None
    return tuple(done)
