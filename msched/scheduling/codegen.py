"""Code generation of scheduled graphs: stream ops called on the runtime, not the dispatcher.

`direct_stream_calls(gm)` gives ``gm.graph`` a code generator whose Python source calls
`msched.ops.direct_set_stream` (and the three others) where the default one writes
``torch.ops.msched.set_stream.default``; everything else of the source is the graph's own
code generator's (the pytree code generator of an exported graph stays one; FX's private
code-generation hook is reached through `msched._torch_internals`).  The graph itself is
unchanged: its nodes keep the ops as targets, so every reader of the graph (verify, the
snapshots, re-tracing with ``make_fx`` or ``torch.compile``) sees the ops, and the direct
calls fall back to the ops wherever anything could intercept them (`msched.ops`).

Why: a stream op through the dispatcher costs 1.2-1.9 µs per call on the host (an ``int[]``
argument alone is ~0.7 µs of parsing), the direct call ~0.4 µs; a scheduled 61-layer MoE
stack has about 680 of them per forward.  `msched.schedule` and the ``torch.compile`` backend
install it; a downstream scheduler that emits msched's ops can call `direct_stream_calls` on
its module too.

The four names (``msched_set_stream``, ``msched_record_event``, ``msched_wait_event``,
``msched_record_stream``) are FX custom builtins, so that code written out of the module
(``GraphModule.to_folder``, the import block of a pickled module) imports them from
`msched.ops`, and FX names no node like them.  A parameter called so (a placeholder's, or an
argument name a pytree code generator writes) would hide it: in such a graph that op keeps
its call through the dispatcher.
"""

from __future__ import annotations

from torch.fx import GraphModule
from torch.fx.graph import CodeGen

from msched import ops
from msched._torch_internals import (
    PyTreeCodeGen,
    SourceRewriting,
    codegen_of,
    register_custom_builtin,
)

# For each stream op: how the default code generator writes its call (each node is an
# assignment: ``set_stream_3 = torch.ops.msched.set_stream.default(1, [4])``), and the name
# of its direct function in generated code.
_CALLS: list[tuple[str, str]] = []
for _op, _fn in ops.DIRECT_CALLS.items():
    _name = f"msched_{_op.overloadpacket.__name__}"
    _CALLS.append((f" = torch.ops.msched.{_op.overloadpacket.__name__}.default(", _name))
    register_custom_builtin(_name, f"from msched.ops import {_fn.__name__} as {_name}", _fn)


def _names_something(src: str, name: str) -> bool:
    """Whether ``name`` is an identifier in ``src`` (a parameter would hide the global)."""
    start = src.find(name)
    while start >= 0:
        before = src[start - 1] if start else " "
        after = src[start + len(name) : start + len(name) + 1]
        if not (before.isalnum() or before in "_.") and not (after.isalnum() or after == "_"):
            return True
        start = src.find(name, start + 1)
    return False


class DirectStreamCalls(SourceRewriting):
    """Mixed in before a graph's code generator class (`direct_stream_calls`)."""

    __slots__ = ()

    def rewrite_source(self, src: str) -> str:
        for call, name in _CALLS:  # str.replace: a regular expression is 10x slower here
            if call in src and not _names_something(src, name):
                src = src.replace(call, f" = {name}(")
        return src


class DirectStreamCallsCodeGen(DirectStreamCalls, CodeGen):
    """The default code generator with direct stream calls."""

    __slots__ = ()


class DirectStreamCallsPyTreeCodeGen(DirectStreamCalls, PyTreeCodeGen):
    """The code generator of exported graphs (pytree inputs and outputs), with direct calls."""

    __slots__ = ()


# Other code generators get a class made here (whose graphs, unlike these, cannot be pickled).
_CLASSES: dict[type, type] = {
    CodeGen: DirectStreamCallsCodeGen,
    PyTreeCodeGen: DirectStreamCallsPyTreeCodeGen,
}


def _with_direct_calls(codegen: CodeGen) -> CodeGen:
    base = type(codegen)
    if issubclass(base, DirectStreamCalls):
        return codegen
    cls = _CLASSES.get(base)
    if cls is None:
        name = f"DirectStreamCalls{base.__name__}"
        cls = type(name, (DirectStreamCalls, base), {"__slots__": (), "__module__": __name__})
        _CLASSES[base] = cls
    new: CodeGen = object.__new__(cls)
    new.__dict__.update(getattr(codegen, "__dict__", {}))
    for klass in base.__mro__:  # and the values of its slots, if its class has any
        slots = getattr(klass, "__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot not in ("__dict__", "__weakref__") and hasattr(codegen, slot):
                setattr(new, slot, getattr(codegen, slot))
    return new


def direct_stream_calls(gm: GraphModule, *, recompile: bool = True) -> GraphModule:
    """Make the code of ``gm`` call msched's stream ops without the dispatcher; returns ``gm``.

    Only the generated Python changes (``gm.code`` shows ``msched_set_stream(1, [3])``
    instead of ``torch.ops.msched.set_stream.default(1, [3])``); the graph, its nodes and
    their targets do not.  Idempotent.  ``recompile=False`` leaves the code as it is until
    the caller recompiles.  If recompiling fails, the code generator is put back and the
    error raised.
    """
    graph = gm.graph
    old = codegen_of(graph)
    codegen = _with_direct_calls(old)
    if codegen is not old:
        graph.set_codegen(codegen)
        if recompile:
            try:
                gm.recompile()
            except BaseException:
                graph.set_codegen(old)
                raise
    return gm
