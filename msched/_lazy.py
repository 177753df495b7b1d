"""`lazy_graph_module`: a ``GraphModule`` that generates its Python code only when it is needed.

``GraphModule(root, graph)`` generates and compiles the graph's Python source at once (and
again at every ``recompile()``), which costs about as much as building a small graph.  The
test helpers build modules whose code most tests never run: a decoder stack that is scheduled
(rewritten) before anyone calls it, the copy of a graph kept as the original for `msched.verify`
(which reads graphs, not code).  torch.fx's lazy graph module defers the code to the first
call or ``.code``; ``recompile()`` only marks it stale.  Where torch has none, the module is a
plain ``GraphModule``.
"""

from __future__ import annotations

from torch import nn
from torch.fx import Graph, GraphModule

from msched._torch_internals import LazyGraphModule

_LazyModule: type[GraphModule] = LazyGraphModule or GraphModule


def lazy_graph_module(root: nn.Module, graph: Graph, class_name: str) -> GraphModule:
    """``GraphModule(root, graph, class_name)`` whose code is generated on first use.

    It behaves as a ``GraphModule`` (``isinstance`` holds; calling it, ``.code``, ``str``,
    pickling and ``copy.deepcopy`` generate the code first), except that ``recompile()``
    returns None instead of the generated code.
    """
    return _LazyModule(root, graph, class_name)
