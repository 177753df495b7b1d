"""Code generation of scheduled graphs: stream ops called on the runtime, not the dispatcher.

`direct_stream_calls(gm)` gives ``gm.graph`` a code generator whose Python source calls
`msched.ops.direct_set_stream` (and the three others) where the default one writes
``torch.ops.msched.set_stream.default``; everything else of the source is the graph's own
code generator's (a ``_PyTreeCodeGen`` of an exported graph stays one).  The graph itself is
unchanged: its nodes keep the ops as targets, so every reader of the graph (verify, the
snapshots, re-tracing with ``make_fx`` or ``torch.compile``) sees the ops, and the direct
calls fall back to the ops wherever anything could intercept them (`msched.ops`).

Why: a stream op through the dispatcher costs 1.2-1.9 µs per call on the host (an ``int[]``
argument alone is ~0.7 µs of parsing), the direct call ~0.4 µs; a scheduled 61-layer MoE
stack has about 680 of them per forward.  `msched.schedule` and the ``torch.compile`` backend
install it; a downstream scheduler that emits msched's ops can call `direct_stream_calls` on
its module too.
"""

from __future__ import annotations

from typing import Any

from torch.fx import GraphModule
from torch.fx.graph import CodeGen, PythonCode, _Namespace, _PyTreeCodeGen

from msched import ops

# The direct function of each stream op, by the name of the op.
_OPS = {op._overloadpacket.__name__: fn for op, fn in ops.DIRECT_CALLS.items()}


def _call(op: str) -> str:
    """How the default code generator writes a call of the stream op named ``op`` (each node
    is an assignment: ``set_stream_3 = torch.ops.msched.set_stream.default(1, [4])``)."""
    return f" = torch.ops.msched.{op}.default("


class DirectStreamCalls:
    """Mixed in before a graph's code generator class (`direct_stream_calls`)."""

    def _gen_python_code(
        self, nodes: Any, root_module: str, namespace: _Namespace, **kwargs: Any
    ) -> PythonCode:
        # Named first, so that a node called like one of them is the one renamed; a
        # placeholder keeps its name as the parameter's, so the name must differ from those.
        parameters = {n.target for n in nodes if n.op == "placeholder"}
        names = {op: _global_name(namespace, f"msched_{op}", parameters) for op in _OPS}
        code: PythonCode = super()._gen_python_code(  # type: ignore[misc]
            nodes, root_module, namespace, **kwargs
        )
        for op, name in names.items():  # str.replace: a regular expression is 10x slower here
            if _call(op) in code.src:
                code.src = code.src.replace(_call(op), f" = {name}(")
                code.globals[name] = _OPS[op]
        return code


def _global_name(namespace: _Namespace, hint: str, taken: set[Any]) -> str:
    name, suffix = namespace.create_name(hint, None), 0
    while name in taken:
        suffix += 1
        name = namespace.create_name(f"{hint}_{suffix}", None)
    return name


class DirectStreamCallsCodeGen(DirectStreamCalls, CodeGen):
    """The default code generator with direct stream calls."""


class DirectStreamCallsPyTreeCodeGen(DirectStreamCalls, _PyTreeCodeGen):
    """The code generator of exported graphs (pytree inputs and outputs), with direct calls."""


# Other code generators get a class made here (whose graphs, unlike these, cannot be pickled).
_CLASSES: dict[type, type] = {
    CodeGen: DirectStreamCallsCodeGen,
    _PyTreeCodeGen: DirectStreamCallsPyTreeCodeGen,
}


def _with_direct_calls(codegen: CodeGen) -> CodeGen:
    base = type(codegen)
    if issubclass(base, DirectStreamCalls):
        return codegen
    cls = _CLASSES.get(base)
    if cls is None:
        cls = type(f"DirectStreamCalls{base.__name__}", (DirectStreamCalls, base), {})
        cls.__module__ = __name__
        _CLASSES[base] = cls
    new: CodeGen = object.__new__(cls)
    new.__dict__.update(codegen.__dict__)
    return new


def direct_stream_calls(gm: GraphModule, *, recompile: bool = True) -> GraphModule:
    """Make the code of ``gm`` call msched's stream ops without the dispatcher; returns ``gm``.

    Only the generated Python changes (``gm.code`` shows ``msched_set_stream(1, [3])``
    instead of ``torch.ops.msched.set_stream.default(1, [3])``); the graph, its nodes and
    their targets do not.  Idempotent.  ``recompile=False`` leaves the code as it is until
    the caller recompiles.
    """
    graph = gm.graph
    codegen = _with_direct_calls(graph._codegen)
    if codegen is not graph._codegen:
        graph.set_codegen(codegen)
        if recompile:
            gm.recompile()
    return gm
