"""Ops that look like stream ops but that no dialect reads are an error, never a one-stream ok.

The engine is `tests.plugin.myeng`: string-named events and a stream-wide ``join`` that no
built-in dialect reads.  Without the change every reader below took its graph for one stream
with no stream op and said "ok" (or drew one lane).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.fx import Graph, GraphModule

import msched
from msched.errors import LIBRARY_DIALECT_HINT, dialect_hint
from msched.pictures import render_dot, render_perfetto, render_svg, render_text
from msched.pictures.explain import explain_lines
from msched.proof import actions
from msched.proof.interpreter import interpret
from msched.proof.lookalikes import stream_look
from tests.plugin import myeng

MYENG_OPS = ("myeng::join", "myeng::record", "myeng::switch", "myeng::wait")

_lib = torch.library.Library("msched_test_look", "DEF")
_lib.define("record_metrics(Tensor x) -> ()")  # a weak word, in a namespace of no stream op
_lib.define("tile_stream(Tensor x) -> Tensor")  # named like a stream op: strong
_lib.impl("record_metrics", lambda x: None, "CPU")
_lib.impl("tile_stream", lambda x: x.clone(), "CPU")
LOOK = torch.ops.msched_test_look
_alone = torch.library.Library("msched_test_look_alone", "DEF")  # no stream op in it
_alone.define("record_metrics(Tensor x) -> ()")
_alone.impl("record_metrics", lambda x: None, "CPU")


@pytest.fixture
def scheduled() -> tuple[GraphModule, GraphModule]:
    gm = myeng.model()
    original = copy.deepcopy(gm)
    myeng.schedule(gm, 3)
    return gm, original


READERS = {
    "verify": lambda gm: msched.verify(gm),
    "read_schedule": lambda gm: msched.read_schedule(gm),
    "simulate": lambda gm: msched.simulate(gm),
    "render_text": render_text,
    "render_svg": render_svg,
    "render_dot": render_dot,
    "render_perfetto": render_perfetto,
    "explain": lambda gm: explain_lines(msched.read_schedule(gm), gm.graph.output_node()),
}


@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_refuses_a_graph_of_unread_stream_ops(
    scheduled: tuple[GraphModule, GraphModule], reader: str
) -> None:
    gm, _ = scheduled
    with pytest.raises(msched.UnreadStreamOpsError) as raised:
        READERS[reader](gm)
    error = raised.value
    assert isinstance(error, msched.InvalidGraphError)
    assert error.ops == MYENG_OPS
    assert {"join_default", "record_default", "switch_default", "wait_default"} <= set(error.nodes)
    message = str(error)
    assert "myeng::join (join_default, join_default_1)" in message
    # A function of msched's says how it takes a dialect, not how the plugin or the CLI do.
    assert error.hint == LIBRARY_DIALECT_HINT
    assert "Give the dialect of these ops: pass dialect=... (a msched.Dialect" in message
    assert "msched_dialect" not in message and "--dialect" not in message


def test_the_tool_that_reads_the_graph_says_how_it_takes_a_dialect(
    scheduled: tuple[GraphModule, GraphModule],
) -> None:
    gm, _ = scheduled
    with dialect_hint("pass --dialect NAME"), pytest.raises(msched.UnreadStreamOpsError) as raised:
        render_svg(gm)
    assert raised.value.hint == "pass --dialect NAME"
    assert "Give the dialect of these ops: pass --dialect NAME (" in str(raised.value)
    assert "dialect=" not in str(raised.value)
    with pytest.raises(msched.UnreadStreamOpsError) as raised:
        render_svg(gm)  # outside the tool's extent: the library's words again
    assert raised.value.hint == LIBRARY_DIALECT_HINT


def test_the_dialect_of_the_ops_reads_them(scheduled: tuple[GraphModule, GraphModule]) -> None:
    gm, original = scheduled
    report = msched.verify(gm, original=original, dialect=myeng.DIALECT)
    assert report.ok and report.num_streams == 3
    assert "s2 |" in render_text(msched.read_schedule(gm, dialect=myeng.DIALECT))


def test_a_dialect_that_misses_one_op_is_told_which(
    scheduled: tuple[GraphModule, GraphModule],
) -> None:
    gm, _ = scheduled
    readers = dict(myeng.DIALECT.readers)
    del readers["myeng::join"]
    partial = msched.Dialect.define("myeng-without-join", readers)
    with pytest.raises(msched.UnreadStreamOpsError, match="myeng-without-join dialect") as raised:
        interpret(gm, partial)
    assert raised.value.ops == ("myeng::join",)
    assert raised.value.nodes == ("join_default", "join_default_1")


def _graph_calling(*ops: object) -> Graph:
    graph = Graph()
    x = graph.placeholder("x")
    for op in ops:
        graph.call_function(op, (x,))
    graph.output(x)
    return graph


def test_what_looks_like_a_stream_op() -> None:
    assert stream_look(myeng.JOIN) == ("myeng::join", True)  # the name
    assert stream_look(myeng.SWITCH) == ("myeng::switch", True)  # ``int stream``
    assert stream_look(myeng.WAIT) == ("myeng::wait", False)  # only by its namespace
    assert stream_look(LOOK.tile_stream.default) == ("msched_test_look::tile_stream", True)
    assert stream_look(torch.ops.aten.record_stream.default) is None  # PyTorch's own
    assert stream_look(myeng.STASH) is None
    assert stream_look(torch.add) is None


def test_a_weak_word_counts_only_in_a_namespace_with_stream_ops() -> None:
    # "record" is a stream word; msched_test_look registers tile_stream, a stream op by its
    # name (not in the graph: the dispatcher knows it), msched_test_look_alone none.
    metrics = torch.ops.msched_test_look_alone.record_metrics.default
    assert msched.verify(_graph_calling(metrics)).ok
    with pytest.raises(msched.UnreadStreamOpsError) as raised:
        msched.verify(_graph_calling(LOOK.record_metrics.default))
    assert raised.value.ops == ("msched_test_look::record_metrics",)


def test_an_op_that_is_no_stream_op_is_read_as_compute_when_said_so() -> None:
    graph = _graph_calling(LOOK.tile_stream.default)
    with pytest.raises(msched.UnreadStreamOpsError, match="msched_test_look::tile_stream"):
        msched.verify(graph)
    compute = msched.Dialect() | msched.Dialect.define(
        "mine", {"msched_test_look::tile_stream": lambda node: None}
    )
    assert msched.verify(graph, dialect=compute).ok


def test_an_unread_op_next_to_a_read_one_is_still_refused() -> None:
    # The engine's switch is read (four-op shape in a dialect of its own), its wait is not.
    dialect = msched.Dialect.define(
        "switch-only", {"myeng::switch": lambda n: (actions.switch(n.args[0]),)}
    )
    graph = Graph()
    x = graph.placeholder("x")
    graph.call_function(myeng.SWITCH, (1,))
    graph.call_function(myeng.WAIT, ("a",))
    graph.call_function(myeng.SWITCH, (0,))
    graph.output(x)
    with pytest.raises(msched.UnreadStreamOpsError) as raised:
        msched.verify(graph, dialect=dialect)
    assert raised.value.ops == ("myeng::wait",)


def test_a_report_names_only_the_events_its_violations_involve(
    scheduled: tuple[GraphModule, GraphModule],
) -> None:
    gm, original = scheduled
    output = gm.graph.output_node()
    joins = [n for n in gm.graph.nodes if n.target is myeng.JOIN]
    for join in joins:  # the last stash races with the exit: no event involved
        gm.graph.erase_node(join)
    with gm.graph.inserting_before(output):
        gm.graph.call_function(myeng.WAIT, ("ghost",))  # waits for an event never recorded
    report = msched.verify(gm, original=original, dialect=myeng.DIALECT)
    assert {v.kind for v in report.violations} == {"exit-not-joined", "unrecorded-event"}
    assert report.legend == ("event 7 = 'ghost'",)  # not the six events of the stashes
