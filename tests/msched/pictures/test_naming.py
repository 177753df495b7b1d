"""Stable event names in the canonical text (`msched.pictures.naming`): named after the point a
record marks, the same for every dialect and process, and untouched by adding one event."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from difflib import SequenceMatcher

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.fx import GraphModule

import msched
import msched.testing.strategies as mst
from msched import pictures
from msched.models.decoders import decoder_stack
from msched.pictures.naming import event_names
from msched.pictures.text import step_text
from msched.pictures.view import view_of
from msched.proof.dialects import Dialect
from msched.proof.interpreter import interpret

from ..scheduled import Scheduled, aten, define_stream_ops

NAMESPACE = "msched_test_names"
_lib = define_stream_ops(NAMESPACE)


def _body(gm: GraphModule) -> list[str]:
    return pictures.render_text(gm).splitlines()[3:]  # the lines after the header


def _every_kind(dialect: Dialect | None = None) -> GraphModule:
    """A record before any compute node (stream 0 and an empty stream 1), two records after
    one node, a re-recorded event id, a wait on an event never recorded before it."""
    s = Scheduled(dialect)
    x, w = s.input("x"), s.input("w")
    s.record(0)  # before any compute node of stream 0 (inputs do not count)
    s.stream(1)
    s.record(9)  # stream 1 has run nothing yet
    s.wait(0)
    s.wait(5)  # never recorded before it
    a = s.op("a", aten.mm.default, x, w)
    s.record(1)
    s.record(2)  # a second record at the same point
    s.stream(0)
    s.wait(1)
    s.wait(2)
    b = s.op("b", aten.add.Tensor, a, x)
    s.record(1)  # event 1 again, at another point
    s.stream(1)
    s.wait(1)
    s.wait(9)
    c = s.op("c", aten.mul.Tensor, a, a)
    s.record(3)
    s.stream(0)
    s.wait(3)
    return s.done((b, c))


EVERY_KIND = [
    "s0 | x = input",
    "s0 | w = input",
    "s0 | record @entry.s0",
    "s1 |   record @entry.s1",
    "s1 |   wait @entry.s0",
    "s1 |   wait e5 (unrecorded)",
    "s1 |   a = aten.mm.default(x, w)",
    "s1 |   record @a",
    "s1 |   record @a#2",
    "s0 | wait @a",
    "s0 | wait @a#2",
    "s0 | b = aten.add.Tensor(a, x)",
    "s0 | record @b",
    "s1 |   wait @b",
    "s1 |   wait @entry.s1",
    "s1 |   c = aten.mul.Tensor(a, a)",
    "s1 |   record @c",
    "s0 | wait @c",
    "s0 | output((b, c))",
]


def test_names_say_which_point_of_which_stream_an_event_marks() -> None:
    assert _body(_every_kind()) == EVERY_KIND


def test_names_come_from_the_stream_program_so_every_dialect_gets_them() -> None:
    foreign = _every_kind(Dialect.from_namespace(NAMESPACE))
    assert Dialect.detect(foreign) == Dialect.from_namespace(NAMESPACE)
    assert _body(foreign) == EVERY_KIND


def test_a_node_named_entry_does_not_collide_with_the_entry_of_a_stream() -> None:
    s = Scheduled()
    x = s.input("x")
    s.record(0)
    entry = s.op("entry", aten.neg.default, x)
    s.record(1)
    s.stream(1)
    s.wait(0)
    s.wait(1)
    y = s.op("y", aten.neg.default, entry)
    s.record(2)
    s.stream(0)
    s.wait(2)
    body = _body(s.done(y))
    assert [line for line in body if "record" in line] == [
        "s0 | record @entry.s0",
        "s0 | record @entry",
        "s1 |   record @y",
    ]


def test_names_do_not_depend_on_event_ids() -> None:
    gm = _every_kind()
    before = pictures.render_text(gm)
    renumber = {0: 40, 1: 7, 2: 0, 3: 12, 5: 5, 9: 3}  # 5: an unrecorded wait shows its id
    for node in gm.graph.nodes:
        if node.target in (msched.ops.record_event, msched.ops.wait_event):
            node.args = (renumber[node.args[0]],)
    assert pictures.render_text(gm) == before


def test_step_text_alone_names_events_as_the_text_does_and_sees_edits() -> None:
    gm = _every_kind()
    program = interpret(gm)
    names = event_names(program)
    assert [step_text(s) for s in program.steps] == [step_text(s, names) for s in program.steps]
    assert view_of(gm).names == names
    # An edit (the second record after ``a`` deleted, and its wait) renames nothing else but
    # is seen by the cache of step_text.
    second = [n for n in gm.graph.nodes if n.target is msched.ops.record_event][2]
    waits = [n for n in gm.graph.nodes if n.target is msched.ops.wait_event]
    gm.graph.erase_node(waits[3])
    gm.graph.erase_node(second)
    program = interpret(gm)
    assert [step_text(s) for s in program.steps] == [
        step_text(s, event_names(program)) for s in program.steps
    ]
    assert "@a#2" not in pictures.render_text(gm)


def test_json_keeps_the_id_and_the_name() -> None:
    doc = json.loads(pictures.render_json(_every_kind()))
    records = [n for n in doc["nodes"] if n["kind"] == "record_event"]
    assert [(n["arg"], n["event_name"]) for n in records][:4] == [
        (0, "@entry.s0"),
        (9, "@entry.s1"),
        (1, "@a"),
        (2, "@a#2"),
    ]
    waits = [n for n in doc["nodes"] if n["kind"] == "wait_event"]
    assert (waits[1]["arg"], waits[1]["event_name"]) == (5, None)
    assert [(e["event"], e["name"]) for e in doc["events"]][:3] == [
        (0, "@entry.s0"),
        (9, "@entry.s1"),
        (5, None),
    ]


# --- one more node, one more event: no renumbering ------------------------------------------


def _renumber_like_an_emitter(gm: GraphModule) -> None:
    """Give the records ids 0, 1, 2, ... in host order (a wait takes its record's id), as an
    emitter counting events does: one record inserted early shifts every later id."""
    latest: dict[int, int] = {}
    count = 0
    for node in gm.graph.nodes:
        if node.target is msched.ops.record_event:
            latest[node.args[0]] = count
            node.args = (count,)
            count += 1
        elif node.target is msched.ops.wait_event:
            node.args = (latest.get(node.args[0], 10_000 + node.args[0]),)
        elif node.target is msched.ops.set_stream and len(node.args) > 1:  # records, waits
            records = list(node.args[2]) if len(node.args) > 2 else []  # type: ignore[arg-type]
            for k, event in enumerate(records):  # recorded before the switch waits
                latest[event] = records[k] = count
                count += 1
            waits = [latest.get(e, 10_000 + e) for e in node.args[1]]  # type: ignore[union-attr]
            node.args = (node.args[0], waits, records) if records else (node.args[0], waits)


def _insert_unrelated(gm: GraphModule, where: int, stream: int, join: int) -> None:
    """Insert ``extra = zeros(4)`` on ``stream`` before the ``where``-th node of the host
    order, a record right after it and, ``join`` nodes later (before ``output`` at the
    latest), a wait on it issued on the stream in effect there."""
    graph = gm.graph
    nodes = list(graph.nodes)
    program = interpret(gm)
    compute_at = [i for i, n in enumerate(nodes) if n.op != "placeholder"]
    at = nodes[compute_at[where % len(compute_at)]]
    out = graph.output_node()
    back = program.stream_of[at]
    with graph.inserting_before(at):
        graph.call_function(msched.ops.set_stream, (stream,))
        graph.call_function(aten.zeros.default, ([4],), name="extra")
        graph.call_function(msched.ops.record_event, (999,))
        graph.call_function(msched.ops.set_stream, (back,))
    later = list(graph.nodes)
    k = min(later.index(at) + join, later.index(out))
    with graph.inserting_before(later[k]):
        graph.call_function(msched.ops.wait_event, (999,))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mst.graphs(),
    st.integers(1, 3),
    st.integers(0, 200),
    st.integers(0, 2),
    st.integers(1, 30),
)
def test_one_more_node_changes_only_the_lines_of_it_and_its_sync(
    gm: GraphModule, streams: int, where: int, stream: int, join: int
) -> None:
    sched = msched.schedule(gm, streams)
    _renumber_like_an_emitter(sched.gm)
    before = _body(sched.gm)
    _insert_unrelated(sched.gm, where, min(stream, streams - 1), join)
    _renumber_like_an_emitter(sched.gm)
    after = _body(sched.gm)
    # Every line of before is still there, in order, except a record that now follows extra
    # on its stream (``@extra#2``) and the waits on it; every new or changed line names extra
    # (the node, its record, the wait on it, such a record and its waits).
    matcher = SequenceMatcher(None, before, after, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        assert tag != "delete", before[i1:i2]
        if tag in ("insert", "replace"):
            assert all("extra" in line for line in after[j1:j2]), after[j1:j2]
        if tag == "replace":  # renamed: a record after extra, or a wait naming one
            renamed = sum("@extra#" in line for line in after[j1:j2])
            assert renamed >= i2 - i1, (before[i1:i2], after[j1:j2])
    assert len(after) == len(before) + 3


def test_graph_nodes_keep_integer_event_ids() -> None:
    gm = _every_kind()
    ids = [n.args[0] for n in gm.graph.nodes if n.target is msched.ops.record_event]
    assert ids == [0, 9, 1, 2, 1, 3]  # rendering names nothing in the graph
    pictures.render_text(gm)
    assert [n.args[0] for n in gm.graph.nodes if n.target is msched.ops.record_event] == ids


# --- the same bytes everywhere -----------------------------------------------------------------


def test_names_are_byte_identical_across_processes_and_hash_seeds() -> None:
    argv = ["schedule", "--layers", "4", "--captures", "0,3", "--moe", "--streams", "3"]
    code = "import sys; from msched.cli import main; sys.exit(main(sys.argv[1:]))"
    outs = []
    for seed in ("0", "123"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", code, *argv],
            env=env,
            capture_output=True,
            check=True,
        )
        outs.append(done.stdout)
    assert outs[0] == outs[1]
    text = outs[0].decode()
    assert "record @entry" not in text  # msched records after the first node of the stream
    assert " record @" in text and " wait @" in text and " record e" not in text
    stack = decoder_stack(4, (0, 3), moe=True).with_sizes()  # the CLI shows memory
    assert text == pictures.render_text(msched.schedule(stack.gm, 3))
