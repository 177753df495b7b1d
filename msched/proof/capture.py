"""The rules of CUDA-graph capture: what `msched.verify(..., cuda_graph=True)` adds.

Why: engines replay decode steps as CUDA graphs (``torch.cuda.graph``, vLLM's piecewise
graphs, TensorRT-LLM, SGLang).  A capture records the work issued on the capturing stream (the
caller's, stream 0) and on every stream that joins it, and has rules of its own that a
race-free program can still break (CUDA programming guide, "Stream Capture": cross-stream
dependencies, prohibited operations; ``torch.cuda.graph``'s default ``capture_error_mode``
is ``"global"``):

- ``capture-sync``: the host must not synchronize with the device inside the capture
  ("operation not permitted when stream is capturing"; with a relaxed capture mode the value
  one step read is baked into every replay).  Reported for a host barrier of the dialect
  (the ``torch`` dialect's ``streams.synchronize_event/stream/device``: ``Event.synchronize()``,
  ``Stream.synchronize()``, ``torch.accelerator.synchronize()``) and for the ops in
  `HOST_SYNC_OPS` (see there: a value read on the host, an output size the host must read
  first, a stream or event query), and for any node that makes a size only the device knows
  (Dynamo and AOT mark it with ``meta["unbacked_bindings"]``: ``x[x > 0]``) or indexes with
  a boolean mask (``y[y > 0] = v``).
- ``capture-fork``: a side stream joins the capture only by waiting on an event recorded on a
  capturing stream (stream 0, or a stream that joined it before the record).  Work a side
  stream issues before it joined is not captured (it runs once, eagerly, and never on replay),
  and a capturing stream that waits on an event recorded outside the capture is not allowed
  (the guide: "It is invalid to wait on a non-captured event from a stream which is being
  captured").
- ``capture-join``: every stream that joined the capture must rejoin stream 0 before the
  capture ends ("capturing stream has unjoined work"): stream 0 must wait, before ``output``,
  for the last compute node of every side stream (used or not); and a side stream whose last
  action is a wait (after its last node, or with no node at all) must be waited for after that
  wait (a record on it after the wait that stream 0 waits on, or ``wait_stream``).  The last
  rule is deliberately conservative: it asks for a direct rejoin, not one through a third
  stream.

Not checked: device-to-host copies (``.cpu()``, ``.to("cpu")``) synchronize too, but a graph
traced on CPU does not say which tensors live on the device; allocations on a side stream
(pytorch#151199) are the caching allocator's business, not the program's.

Happens-before comes from `msched.proof.clocks` (the one engine); capture membership (which
streams have joined the capture at each record and wait) is the walk of `_Membership`.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Node

from msched.analysis.nodes import INPUT_OPS
from msched.proof.clocks import Clocks
from msched.proof.dialects import target_key
from msched.proof.program import Step, StreamProgram

CAPTURE_KINDS = ("capture-sync", "capture-fork", "capture-join")

_VALUE = "reads a device value on the host"
_SIZE = "has an output size only the device knows, which the host must read first"

#: Ops (qualified name, or ``aten`` op of a Tensor method / torch function) that make the host
#: wait for the device, with why.  ``nonzero_static`` and ``repeat_interleave`` with
#: ``output_size`` have sizes the host knows and are fine; ``_assert_async`` is checked on
#: the device and is fine too.
HOST_SYNC_OPS: dict[str, str] = {
    "aten::_local_scalar_dense": f"{_VALUE} (Tensor.item())",
    "aten::item": f"{_VALUE} (Tensor.item())",
    "aten::is_nonzero": f"{_VALUE} (bool(tensor))",
    "aten::equal": f"{_VALUE} (it returns a Python bool)",
    "aten::allclose": f"{_VALUE} (it returns a Python bool)",
    "aten::nonzero": _SIZE,
    "aten::nonzero_numpy": _SIZE,
    "aten::argwhere": _SIZE,
    "aten::masked_select": _SIZE,
    "aten::_unique": _SIZE,
    "aten::_unique2": _SIZE,
    "aten::unique_dim": _SIZE,
    "aten::unique_consecutive": _SIZE,
    "aten::unique_dim_consecutive": _SIZE,
    "aten::bincount": _SIZE,
}
_REPEAT = f"{_SIZE} (repeat_interleave with a tensor of repeats and no output_size)"

# Tensor methods Dynamo records as ``call_method`` and the torch functions it records as
# ``call_function``, by the aten op they become.
_METHODS = {
    "item": "aten::item",
    "tolist": "aten::item",
    "__bool__": "aten::is_nonzero",
    "nonzero": "aten::nonzero",
    "argwhere": "aten::argwhere",
    "masked_select": "aten::masked_select",
    "unique": "aten::_unique2",
    "unique_consecutive": "aten::unique_consecutive",
    "bincount": "aten::bincount",
    "equal": "aten::equal",
    "allclose": "aten::allclose",
}
_QUERY = "asks the host whether a stream or event is done (query())"
_FUNCTIONS: dict[Any, str] = {
    torch.nonzero: "aten::nonzero",
    torch.argwhere: "aten::argwhere",
    torch.masked_select: "aten::masked_select",
    torch.unique: "aten::_unique2",
    torch.unique_consecutive: "aten::unique_consecutive",
    torch.bincount: "aten::bincount",
    torch.equal: "aten::equal",
    torch.allclose: "aten::allclose",
}


@dataclass(frozen=True)
class CaptureFault:
    """One broken capture rule: its kind (one of `CAPTURE_KINDS`), the nodes, the message
    (what is wrong and what to do) and the streams involved."""

    kind: str
    nodes: tuple[str, ...]
    message: str
    streams: tuple[int, ...] = ()


def host_sync_reason(node: Node) -> str | None:
    """Why ``node`` makes the host wait for the device (None: it does not), by its target."""
    if node.op == "call_method":
        name = str(node.target)
        if name == "query":
            return _QUERY
        if name == "repeat_interleave":
            return _repeat_reason(node, 1)
        op = _METHODS.get(name)
        return None if op is None else HOST_SYNC_OPS[op]
    if node.op != "call_function":
        return None
    target = node.target
    if target is torch.repeat_interleave:
        return _repeat_reason(node, 1)
    op = _FUNCTIONS.get(target) if _hashable(target) else None
    if op is not None:
        return HOST_SYNC_OPS[op]
    key = target_key(target)
    if key == "aten::repeat_interleave":
        return _repeat_reason(node, 0 if _overload(target) == "Tensor" else 1)
    found = HOST_SYNC_OPS.get(key) if key is not None else None
    return found or _data_dependent(node, key)


#: Ops whose indices (argument 1) may hold a boolean mask, which they turn into positions on
#: the host (``nonzero``): ``y[mask] = v`` and ``x[mask]``, at every stage.
_INDEXING = frozenset({"aten::index", "aten::index_put", "aten::index_put_",
                       "aten::_unsafe_index", "aten::_unsafe_index_put",
                       "aten::_index_put_impl_"})  # fmt: skip
_INDEXING_FUNCTIONS = (operator.getitem, operator.setitem)


def _data_dependent(node: Node, key: str | None) -> str | None:
    """A node whose result has a size only the device knows, whatever its op: it binds a
    new unbacked symbol (``meta["unbacked_bindings"]``, which Dynamo and AOT write on the
    node that makes one: ``x[x > 0]``, one-argument ``torch.where``); or an indexing with a
    boolean mask (``y[y > 0] = v`` makes no new size, yet its positions are read on the host)."""
    if node.meta.get("unbacked_bindings"):
        return _SIZE
    indexing = key in _INDEXING or (_hashable(node.target) and node.target in _INDEXING_FUNCTIONS)
    if indexing and len(node.args) > 1 and _has_bool_tensor(node.args[1]):
        return _SIZE
    return None


def _has_bool_tensor(index: Any) -> bool:
    if isinstance(index, (list, tuple)):
        return any(_has_bool_tensor(i) for i in index)
    if not isinstance(index, Node):
        return False
    value = index.meta.get("val", index.meta.get("example_value"))
    return isinstance(value, torch.Tensor) and value.dtype == torch.bool


def _hashable(target: Any) -> bool:
    try:
        hash(target)
    except TypeError:
        return False
    return True


def _overload(target: Any) -> str | None:
    name = getattr(target, "_overloadname", None)
    return name if isinstance(name, str) else None


def _repeat_reason(node: Node, repeats_at: int) -> str | None:
    """``repeat_interleave`` synchronizes when its repeats are a tensor and no
    ``output_size`` says the result's length."""
    repeats = node.args[repeats_at] if len(node.args) > repeats_at else node.kwargs.get("repeats")
    if _overload(node.target) == "self_int" or not isinstance(repeats, Node):
        return None
    if node.kwargs.get("output_size") is not None:
        return None
    return _REPEAT


def capture_faults(program: StreamProgram, clocks: Clocks) -> list[CaptureFault]:
    """Every broken capture rule of ``program`` (see the module), in host order per rule."""
    found: list[CaptureFault] = []
    found += _syncs(program)
    membership = _Membership(program, clocks)
    found += membership.faults
    found += _unjoined(program, clocks, membership.members)
    return found


def _syncs(program: StreamProgram) -> list[CaptureFault]:
    found: list[CaptureFault] = []
    for step in _before_output(program):
        node, s = step.node, step.stream
        if step.kind == "synchronize":
            what = _barrier_what(step)
            found.append(
                CaptureFault(
                    "capture-sync",
                    (node.name,),
                    f"`{node.name}` makes the host wait for {what} inside the program: a "
                    "CUDA-graph capture fails (operation not permitted when stream is "
                    "capturing); synchronize before or after the captured region instead",
                    (s,),
                )
            )
        elif step.kind == "compute":
            why = host_sync_reason(node)
            if why is not None:
                found.append(_sync_op(node, s, why))
    return found


def _barrier_what(step: Step) -> str:
    if step.event is not None:
        return f"event {step.event}"
    if step.to_stream is not None:
        return f"stream {step.to_stream}"
    return "the whole device"


def _sync_op(node: Node, s: int, why: str) -> CaptureFault:
    shown = target_key(node.target) or str(node.target)
    return CaptureFault(
        "capture-sync",
        (node.name,),
        f"`{node.name}` ({shown}, stream {s}) {why}: the host synchronizes with the device "
        "inside the program, which a CUDA-graph capture does not allow (a relaxed capture "
        "mode bakes one step's value into every replay); give it a size the host knows "
        "(nonzero_static, repeat_interleave(output_size=...)) or move it out of the "
        "captured region",
        (s,),
    )


def _before_output(program: StreamProgram) -> list[Step]:
    steps: list[Step] = []
    for step in program.steps:
        steps.append(step)
        if step.node is program.output:
            break
    return steps


class _Membership:
    """Which streams have joined the capture, walked in host order (stream 0 captures from
    the start; a stream joins by waiting on a record made by a member); the ``capture-fork``
    faults met on the way; ``members``: the streams that joined, with the last step at which
    each did (its joining wait, or None for stream 0)."""

    def __init__(self, program: StreamProgram, clocks: Clocks) -> None:
        self.members: dict[int, Step | None] = {0: None}
        self.faults: list[CaptureFault] = []
        inside: dict[Step, bool] = {}  # record -> made by a member
        started: set[int] = {0}
        for step in _before_output(program):
            s = step.stream
            if step.kind == "record_event":
                inside[step] = s in self.members
            elif step.kind == "wait_event":
                record = clocks.binding.get(step)
                if record is not None:  # an unrecorded wait is `unrecorded-event`
                    self._wait(step, record, inside[record])
            elif step.kind == "wait_stream":
                assert step.to_stream is not None
                self._wait(step, None, step.to_stream in self.members)
            elif step.kind == "compute" and step.node.op not in INPUT_OPS and s not in started:
                started.add(s)
                if s not in self.members:
                    self.faults.append(_early_work(step.node, s))

    def _wait(self, step: Step, record: Step | None, from_member: bool) -> None:
        s = step.stream
        if from_member:
            self.members[s] = step
        elif s in self.members:
            self.faults.append(_outside_wait(step, record))


def _early_work(node: Node, s: int) -> CaptureFault:
    return CaptureFault(
        "capture-fork",
        (node.name,),
        f"stream {s} issues `{node.name}` before it joined the capture: a side stream joins a "
        "CUDA-graph capture only by waiting on an event recorded on a capturing stream, and "
        f"work issued before that is not captured (it never runs on replay); wait on an event "
        f"recorded on stream 0 on stream {s} before `{node.name}`",
        (s,),
    )


def _outside_wait(step: Step, record: Step | None) -> CaptureFault:
    s, name = step.stream, step.node.name
    nodes: tuple[str, ...]
    if record is None:
        t = step.to_stream
        what, nodes = f"all work of stream {t}", (name,)
    else:
        t = record.stream
        what = f"event {step.event}, recorded by `{record.node.name}` on stream {t}"
        nodes = (record.node.name, name)
    return CaptureFault(
        "capture-fork",
        nodes,
        f"`{name}` on stream {s}, which is capturing, waits for {what}, which has not joined "
        "the capture: a capturing stream may not wait on work recorded outside the capture; "
        f"make stream {t} join first (wait on an event recorded on stream 0)",
        (t, s) if t is not None else (s,),
    )


def _unjoined(
    program: StreamProgram, clocks: Clocks, members: dict[int, Step | None]
) -> list[CaptureFault]:
    """``capture-join``: per side stream that joined, its last node that ``output`` does not
    happen after, or a last wait after it that stream 0 never waits for."""
    last_node: dict[int, Node] = {}
    last_wait: dict[int, tuple[int, Step]] = {}
    steps = _before_output(program)
    for i, step in enumerate(steps):
        if step.kind == "compute" and step.node.op not in INPUT_OPS:
            last_node[step.stream] = step.node
            last_wait.pop(step.stream, None)
        elif step.kind in ("wait_event", "wait_stream"):
            last_wait[step.stream] = (i, step)
    found: list[CaptureFault] = []
    for s in sorted(members):
        if s == 0:
            continue
        node = last_node.get(s)
        if node is not None and not clocks.exit_happens_after(node):
            found.append(_unjoined_node(node, s))
        elif s in last_wait and not _rejoined_after(steps, last_wait[s][0], s, clocks):
            found.append(_unjoined_wait(last_wait[s][1], s))
    return found


def _rejoined_after(steps: list[Step], position: int, s: int, clocks: Clocks) -> bool:
    """Whether stream 0 waits, after ``steps[position]``, for a record on ``s`` made after it
    (or for stream ``s`` itself)."""
    later = steps[position + 1 :]
    records = {id(st) for st in later if st.kind == "record_event" and st.stream == s}
    for st in later:
        if st.stream != 0:
            continue
        if st.kind == "wait_stream" and st.to_stream == s:
            return True
        bound = clocks.binding.get(st) if st.kind == "wait_event" else None
        if bound is not None and id(bound) in records:
            return True
    return False


def _unjoined_node(node: Node, s: int) -> CaptureFault:
    return CaptureFault(
        "capture-join",
        (node.name,),
        f"stream {s} runs `{node.name}` and stream 0 never waits for it before output: a "
        "CUDA-graph capture ends with a side stream not joined (capturing stream has unjoined "
        f"work), used or not; record an event on stream {s} after `{node.name}` and wait on it "
        "on stream 0 before output",
        (s,),
    )


def _unjoined_wait(wait: Step, s: int) -> CaptureFault:
    name = wait.node.name
    return CaptureFault(
        "capture-join",
        (name,),
        f"stream {s} joined the capture (its last action is `{name}`) and stream 0 never "
        "waits for it afterwards: a CUDA-graph capture ends with a side stream not joined; "
        f"record an event on stream {s} after `{name}` and wait on it on stream 0 before output",
        (s,),
    )


__all__ = ["CAPTURE_KINDS", "HOST_SYNC_OPS", "CaptureFault", "capture_faults", "host_sync_reason"]
