"""Inductor's final order as a stream program (`msched.compile.kernel_order`), then verified.

The first tests build `FinalOrder`s by hand (no compiler): each checks one rule of the
conversion through what `msched.verify` says.  The last ones compile user stream code with
Inductor (`msched.trace_streams(..., stage="inductor")`, one compile each, shared by the
module) and check that the proof covers what Inductor emits.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo.variables.streams  # noqa: F401  (registers torch.ops.streams)

import msched
from msched.analysis.collectives import collectives_in, waits_of
from msched.compile._inductor_internals import Buffer, FinalOrder, ScheduledNode
from msched.compile.kernel_order import KERNEL_WRITES, kernel_names, kernel_order_program

streams = torch.ops.streams
CALLER, SIDE, FORK, JOIN = 0, 1, 2, 3


def kernel(name, outputs, reads=(), stream=None, mutates=()):
    return ScheduledNode(name, "kernel", stream, tuple(outputs), tuple(reads), tuple(mutates), ())


def sync(op, *args):
    return ScheduledNode(f"{op._schema.name}{args}", "stream", None, (), (), (), (), op, args)


def used_on_caller(buffer):
    op = streams.record_stream.default
    return ScheduledNode("record", "stream", None, (), (buffer,), (), (), op, (CALLER,))


def fork_join(*side_work, after_join=()):
    """Stream 0 makes buf0; the side stream joins, runs ``side_work``, records JOIN; the
    caller waits for JOIN and runs ``after_join``."""
    return (
        kernel("k0", ["buf0"], ["x"]),
        sync(streams.record_event.default, FORK, CALLER),
        sync(streams.wait_event.default, FORK, SIDE),
        *side_work,
        sync(streams.record_event.default, JOIN, SIDE),
        sync(streams.wait_event.default, JOIN, CALLER),
        *after_join,
    )


def verify(nodes, outputs, reuses=()):
    order = FinalOrder(tuple(nodes), ("x",), tuple(outputs), tuple(reuses))
    return msched.verify(kernel_order_program(order, caller_stream=(CALLER,)))


def test_a_joined_fork_verifies_and_names_every_kernel() -> None:
    nodes = fork_join(kernel("k1", ["buf1"], ["buf0"], SIDE), after_join=[
        kernel("k2", ["buf2"], ["buf0", "buf1"])])  # fmt: skip
    order = FinalOrder(nodes, ("x",), ("buf2",))
    gm = kernel_order_program(order, caller_stream=(CALLER,))
    assert kernel_names(gm) == ["k0", "k1", "k2"]
    assert msched.verify(gm).ok


def test_a_consumer_before_the_wait_is_a_race_naming_the_kernels() -> None:
    nodes = fork_join(kernel("k1", ["buf1"], ["buf0"], SIDE))
    early = (*nodes[:4], kernel("k2", ["buf2"], ["buf1"]), *nodes[4:])
    report = verify(early, ["buf2"])
    races = [v for v in report.violations if v.kind == "race"]
    assert [sorted(v.nodes) for v in races] == [["buf1", "k2"]]


def test_a_buffer_reused_across_streams_without_a_sync_is_a_war_race() -> None:
    # buf1 (side) is last read by k2 (caller) after the join; the side stream then makes
    # buf3, joined again before k4 reads it.  Written into buf1's memory, buf3 is a write
    # after k2's read with no wait between them (the record_stream only tells the caching
    # allocator; Inductor's own reuse never asks it).
    nodes = fork_join(
        kernel("k1", ["buf1"], ["buf0"], SIDE),
        after_join=[
            kernel("k2", ["buf2"], ["buf1"]),
            used_on_caller("buf1"),
            kernel("k3", ["buf3"], ["x"], SIDE),
            sync(streams.record_event.default, 4, SIDE),
            sync(streams.wait_event.default, 4, CALLER),
            kernel("k4", ["buf4"], ["buf2", "buf3"]),
        ],
    )
    assert verify(nodes, ["buf4"]).ok
    report = verify(nodes, ["buf4"], reuses=[("buf1", "buf3")])
    races = [v for v in report.violations if v.kind == "race"]
    assert [(v.hazard, set(v.nodes)) for v in races] == [("war", {"k2", "k3"})]


def test_a_mutation_writes_the_mutated_buffer() -> None:
    # The side stream writes the graph input x in place while the caller still reads it.
    nodes = (
        sync(streams.record_event.default, FORK, CALLER),
        sync(streams.wait_event.default, FORK, SIDE),
        kernel("k1", ["buf1"], ["x"], SIDE, mutates=[("buf1", "x")]),
        kernel("k2", ["buf2"], ["x"]),
        sync(streams.record_event.default, JOIN, SIDE),
        sync(streams.wait_event.default, JOIN, CALLER),
    )
    gm = kernel_order_program(FinalOrder(nodes, ("x",), ("buf2",)), caller_stream=(CALLER,))
    k1 = next(n for n in gm.graph.nodes if n.target is KERNEL_WRITES and n.args[0] == "k1")
    assert [w.name for w in k1.args[2]] == ["x"]
    races = [v for v in msched.verify(gm).violations if v.kind == "race"]
    assert races and set(races[0].nodes) == {"k1", "k2"}


def test_reads_no_node_makes_become_inputs() -> None:
    nodes = (kernel("k0", ["buf0"], ["x", "_frozen_param0"]),)
    gm = kernel_order_program(FinalOrder(nodes, ("x",), ("buf0",)))
    assert [n.name for n in gm.graph.find_nodes(op="placeholder")] == ["x", "_frozen_param0"]


def _side_made_caller_read(code):
    """The side stream makes buf1, the caller reads it after the join, then the side stream
    runs k3 unordered after that read: freed at its last use (k2), buf1's memory could go
    to k3 while k2 still reads it, unless the code never frees it."""
    nodes = fork_join(
        kernel("k1", ["buf1"], ["buf0"], SIDE),
        after_join=[
            kernel("k2", ["buf2"], ["buf1"]),
            kernel("k3", ["buf3"], ["x"], SIDE),
            sync(streams.record_event.default, 4, SIDE),
            sync(streams.wait_event.default, 4, CALLER),
            kernel("k4", ["buf4"], ["buf2", "buf3"]),
        ],
    )
    order = FinalOrder(nodes, ("x",), ("buf4",), code=code)
    return msched.verify(kernel_order_program(order, caller_stream=(CALLER,)))


ALLOCATION = "    buf{} = empty_strided_cpu((4,), (1,), torch.float32)\n"
ALLOCATIONS = "".join(ALLOCATION.format(i) for i in range(5))


def test_a_buffer_the_code_never_frees_needs_no_record_stream() -> None:
    """Inductor never frees a buffer it must not reuse (msched's guard: one another stream
    reads); it lives until the call returns.  Read as freed at its last use, such a buffer
    was a missing-record-stream that the code cannot have."""
    freed = ALLOCATIONS + "    del buf0\n    del buf1\n    del buf2\n    del buf3\n"
    for code in ("", freed):  # no code: the stricter reading; the code frees buf1
        kinds = [v.kind for v in _side_made_caller_read(code).violations]
        assert kinds == ["missing-record-stream"]
    kept = ALLOCATIONS + "    del buf0\n    buf9 = buf2; del buf2  # reuse\n    del buf3\n"
    assert _side_made_caller_read(kept).ok


def test_the_outputs_of_one_kernel_are_separate_buffers() -> None:
    """A kernel that makes buf1 and buf2: the side stream reads buf1 while the caller writes
    buf2 in place; read as one storage, that was a race between different buffers."""
    record = streams.record_stream.default

    def nodes(written):
        return (
            kernel("k0", ["buf1", "buf2"], ["x"]),
            sync(streams.record_event.default, FORK, CALLER),
            sync(streams.wait_event.default, FORK, SIDE),
            kernel("k1", ["buf3"], ["buf1"], SIDE),
            ScheduledNode("record", "stream", None, (), ("buf1",), (), (), record, (SIDE,)),
            kernel("k2", ["buf4"], [written], mutates=[("buf4", written)]),
            sync(streams.record_event.default, JOIN, SIDE),
            sync(streams.wait_event.default, JOIN, CALLER),
            kernel("k5", ["buf5"], ["buf3", written]),
        )

    assert verify(nodes("buf2"), ["buf5"]).ok
    races = [v for v in verify(nodes("buf1"), ["buf5"]).violations if v.kind == "race"]
    assert [(v.hazard, set(v.nodes)) for v in races] == [("war", {"k1", "k2"})]


WRITING_KERNELS = {
    # k0 writes x in place and makes buf1 and buf2
    "in place": ((kernel("k0", ["bufx", "buf1", "buf2"], ["x"], mutates=[("bufx", "x")]),), ()),
    # k0 writes buf1 into the memory of buf0 (dead after k0) and makes buf2
    "reuse": ((kernel("k00", ["buf0"], ["x"]), kernel("k0", ["buf1", "buf2"], ["buf0"])),
              (("buf0", "buf1"),)),
}  # fmt: skip


@pytest.mark.parametrize(
    ("writes", "side_reads", "caller_writes", "race"),
    [
        ("in place", "buf1", "buf2", False),
        ("in place", "buf1", "x", False),
        ("in place", "x", "x", True),
        ("in place", "buf1", "buf1", True),
        ("reuse", "buf1", "buf2", False),
        ("reuse", "buf2", "buf1", False),
        ("reuse", "buf1", "buf0", True),
    ],
)
def test_the_new_buffers_of_a_kernel_that_writes_are_buffers_of_their_own(
    writes, side_reads, caller_writes, race
) -> None:
    """A kernel that writes (a buffer in place, or a reused buffer's memory) and makes new
    buffers: read as ``out=`` results, its new buffers were aliases of what it writes, so
    the side stream reading one while the caller writes another was a race (a real compile
    failed so: test_inductor_review.py).  A race on the written memory is still one."""
    made, reuses = WRITING_KERNELS[writes]
    nodes = (
        *made,
        sync(streams.record_event.default, FORK, CALLER),
        sync(streams.wait_event.default, FORK, SIDE),
        kernel("k1", ["buf3"], [side_reads], SIDE),
        ScheduledNode("record", "stream", None, (), (side_reads,), (), (),
                      streams.record_stream.default, (SIDE,)),
        kernel("k2", ["buf4"], [caller_writes], mutates=[("buf4", caller_writes)]),
        sync(streams.record_event.default, JOIN, SIDE),
        sync(streams.wait_event.default, JOIN, CALLER),
        kernel("k5", ["buf5"], ["buf3", "buf1", "buf2"]),
    )  # fmt: skip
    report = verify(nodes, ["buf5"], reuses)
    races = [(v.hazard, set(v.nodes)) for v in report.violations if v.kind == "race"]
    assert races == ([("war", {"k1", "k2"})] if race else [])
    assert report.ok is not race


# --- Inductor compiles user stream code (CPU: compiled, never run) -----------------------

with msched.cuda_streams_on_cpu():
    side = torch.cuda.Stream()
    forked, joined = torch.cuda.Event(), torch.cuda.Event()


def joined_with_events(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    caller = torch.cuda.current_stream()
    a = x.sin() + 1
    forked.record(caller)
    with torch.cuda.stream(side):
        forked.wait(side)
        b = y.cos() * 2
        joined.record(side)
    joined.wait(caller)
    return a + (b + 3)


def all_reduce(name, buffer, issue, group="0", stream=None):
    """Inductor's in-place all-reduce kernel of ``buffer`` (``buf_<name>`` is its own name,
    ``m_<name>`` the mutation of ``buffer``), issued ``issue``-th by the program."""
    return ScheduledNode(
        name, "extern", stream, (f"buf_{name}", f"m_{name}"), (buffer,),
        ((f"m_{name}", buffer),), (), comm_op="_c10d_functional.all_reduce_.default",
        comm_args=(Buffer(buffer), "sum", group), issue=issue,
    )  # fmt: skip


def wait(name, buffer, stream=None):
    return ScheduledNode(
        name, "extern", stream, (f"buf_{name}", f"m_{name}"), (buffer,),
        ((f"m_{name}", buffer),), (), comm_op="_c10d_functional.wait_tensor.default",
        comm_args=(Buffer(buffer),),
    )  # fmt: skip


def two_all_reduces(first_issued_second=False):
    """k1 and k2 make buf1 and buf2; both are all-reduced in place (in the order the program
    issued them, or the second first: a hand-edited kernel order), waited, and summed."""
    ar1, ar2 = all_reduce("ar1", "buf1", 0), all_reduce("ar2", "buf2", 1)
    issued = (ar2, ar1) if first_issued_second else (ar1, ar2)
    return (
        kernel("k1", ["buf1"], ["x"]),
        kernel("k2", ["buf2"], ["x"]),
        *issued,
        wait("w1", "buf1"),
        wait("w2", "buf2"),
        kernel("k3", ["buf3"], ["buf1", "buf2"]),
    )


def test_collective_kernels_are_calls_of_their_ops_in_their_group() -> None:
    gm = kernel_order_program(FinalOrder(two_all_reduces(), ("x",), ("buf3",)))
    found = collectives_in(gm.graph)
    assert [(c.op, c.group, c.node.name) for c in found] == [
        ("all_reduce_", "0", "ar1"),
        ("all_reduce_", "0", "ar2"),
    ]
    assert [n.meta["msched_issue"] for n in (c.node for c in found)] == [0, 1]
    assert {w.name for ws in waits_of(gm.graph).values() for w in ws} == {"w1", "w2"}
    assert msched.verify(gm).ok


def test_a_kernel_order_with_two_collectives_swapped_is_a_collective_order_fault() -> None:
    swapped = FinalOrder(two_all_reduces(first_issued_second=True), ("x",), ("buf3",))
    report = msched.verify(kernel_order_program(swapped))
    assert [v.kind for v in report.violations] == ["collective-order"], report
    assert set(report.violations[0].nodes) == {"ar1", "ar2"}


def test_a_kernel_order_program_edited_to_swap_two_collectives_fails() -> None:
    gm = kernel_order_program(FinalOrder(two_all_reduces(), ("x",), ("buf3",)))
    ar1, ar2 = (n for n in gm.graph.nodes if n.name in ("ar1", "ar2"))
    ar2.append(ar1)  # the first all-reduce now issued after the second
    gm.recompile()
    report = msched.verify(gm)
    assert [v.kind for v in report.violations] == ["collective-order"], report


def test_a_read_of_an_all_reduced_buffer_before_its_wait_is_a_race() -> None:
    nodes = list(two_all_reduces())
    nodes.insert(4, kernel("early", ["buf4"], ["buf1"]))  # reads buf1 before w1
    report = verify(nodes, ["buf3", "buf4"])
    races = [v for v in report.violations if v.kind == "race"]
    assert races and {"early"} <= set(races[0].nodes), report


@pytest.mark.skipif(
    not hasattr(torch.ops._c10d_functional, "wait_tensors"), reason="torch 2.15's wait_tensors"
)
def test_one_wait_tensors_waits_for_every_collective_of_its_list() -> None:
    """torch 2.15 lowers the waits of a coalesced all-reduce to one ``wait_tensors`` of the
    list: read as a collective of its own (it is a ``_c10d_functional`` op), it waited for
    nothing, and every use of the reduced buffers was a race."""
    both = ScheduledNode(
        "ws", "extern", None, ("buf_ws", "m1", "m2"), ("buf1", "buf2"),
        (("m1", "buf1"), ("m2", "buf2")), (), comm_op="_c10d_functional.wait_tensors.default",
        comm_args=((Buffer("buf1"), Buffer("buf2")),),
    )  # fmt: skip
    nodes = [*two_all_reduces()[:4], both, two_all_reduces()[-1]]
    gm = kernel_order_program(FinalOrder(tuple(nodes), ("x",), ("buf3",)))
    assert {w.name for ws in waits_of(gm.graph).values() for w in ws} == {"ws"}
    assert msched.verify(gm).ok
    early = [*nodes[:4], kernel("early", ["buf4"], ["buf2"]), *nodes[4:]]
    report = verify(early, ["buf3", "buf4"])
    assert [v.kind for v in report.violations] == ["race"], report


def joined_with_wait_stream(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    caller = torch.cuda.current_stream()
    a = x.sin() + 1
    side.wait_stream(caller)
    with torch.cuda.stream(side):
        b = y.cos() * 2
    caller.wait_stream(side)
    return a + (b + 3)


def _trace(fn, stage):
    with msched.cuda_streams_on_cpu():
        return msched.trace_streams(fn, torch.randn(8), torch.randn(8), stage=stage)


@pytest.fixture(scope="module")
def event_join_compiled():
    return _trace(joined_with_events, "inductor")


# torch 2.14 wraps wait_event in control_deps too, and orders this join right.
ORDERS_EVENT_WAITS = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 14)


def test_an_event_join_inductor_2_13_misorders_is_a_race(event_join_compiled) -> None:
    assert msched.verify(_trace(joined_with_events, "aot")).ok  # the graph Inductor got
    report = msched.verify(event_join_compiled)
    if ORDERS_EVENT_WAITS:
        assert report.ok, report
        return
    races = [v for v in report.violations if v.kind == "race"]
    assert races, report
    # The fused caller-stream kernel reads the side stream's buffer before the wait.
    names = kernel_names(event_join_compiled)
    assert any(n in names for v in races for n in v.nodes)


def test_the_same_join_with_wait_stream_verifies() -> None:
    gm = _trace(joined_with_wait_stream, "inductor")
    assert msched.verify(gm).ok
    assert len(kernel_names(gm)) < 6  # fused: sin+add, cos+mul, add+add


def test_a_bucket_a_pass_made_leaves_the_stamped_collectives_checked() -> None:
    """A post-grad pass that makes one bucket (a collective msched never stamped) and moves
    two stamped all-reduces: the graph Inductor lowers used to take its own order as a whole,
    so the move went unchecked.  The stamped ones keep their positions; the bucket has none."""
    from types import SimpleNamespace

    from torch.fx import Graph, GraphModule

    from msched.compile._inductor_comm import issue_positions
    from msched.compile.final_order import ISSUE_META

    fc = torch.ops._c10d_functional
    g = Graph()
    x = g.placeholder("x")
    made = {}
    for name, stamp in (("ar_b", 1), ("ar_a", 0), ("bucket", None)):
        made[name] = g.create_node(
            "call_function", fc.all_reduce.default, (x, "sum", "0"), name=name
        )
        if stamp is not None:
            made[name].meta[ISSUE_META] = stamp
    g.output(tuple(g.call_function(fc.wait_tensor.default, (n,)) for n in made.values()))
    lowered = SimpleNamespace(module=GraphModule(torch.nn.Module(), g))
    assert issue_positions(lowered) == {"ar_b": 1, "ar_a": 0}
    for node in made.values():
        node.meta.pop(ISSUE_META, None)
    assert issue_positions(lowered) == {"ar_b": 0, "ar_a": 1, "bucket": 2}  # nobody stamped
