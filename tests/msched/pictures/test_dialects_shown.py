"""Every picture and ``explain`` read an engine's graph in the dialect they are given.

The engine is `tests.plugin.myeng` (string-named events, a stream-wide ``join``): no built-in
dialect reads it, so without ``dialect=`` each reader raises `msched.UnreadStreamOpsError`
(`tests.msched.proof.test_lookalikes`); with it, each shows the pass's three streams.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable

import pytest
from torch.fx import GraphModule

import msched
from msched.models.decoders import decoder_stack
from msched.pictures import render_dot, render_json, render_perfetto, render_svg, render_text
from msched.pictures.explain import explain_lines
from tests.plugin import foreign, myeng


@pytest.fixture
def engine_graph() -> GraphModule:
    gm = myeng.model()
    myeng.schedule(gm, 3)
    return gm


def _svg_lanes(text: str) -> int:
    lanes = ET.fromstring(text).iter("{http://www.w3.org/2000/svg}rect")
    return len([r for r in lanes if r.get("class") == "lane"])


def _trace_tracks(text: str) -> int:
    return len([e for e in json.loads(text)["traceEvents"] if e.get("name") == "thread_name"])


STREAMS_SHOWN: dict[str, tuple[Callable[..., str], Callable[[str], int]]] = {
    "render_svg": (render_svg, _svg_lanes),
    "render_dot": (render_dot, lambda text: text.count("subgraph cluster_")),
    "render_perfetto": (render_perfetto, _trace_tracks),
    "render_text": (render_text, lambda text: int(text.split("# streams ")[1].split(",")[0])),
    "render_json": (render_json, lambda text: json.loads(text)["streams"]),
}


@pytest.mark.parametrize("renderer", list(STREAMS_SHOWN))
def test_each_picture_reads_an_engine_graph_in_the_dialect_given(
    engine_graph: GraphModule, renderer: str
) -> None:
    render, streams_in = STREAMS_SHOWN[renderer]
    with pytest.raises(msched.UnreadStreamOpsError):
        render(engine_graph)
    assert streams_in(render(engine_graph, dialect=myeng.DIALECT)) == 3
    # A Schedule read back in the dialect carries it; a picture given it again agrees.
    sched = msched.read_schedule(engine_graph, dialect=myeng.DIALECT)
    assert (
        render(sched)
        == render(engine_graph, dialect=myeng.DIALECT)
        == render(sched, dialect=myeng.DIALECT)
    )


@pytest.mark.parametrize("renderer", list(STREAMS_SHOWN))
def test_a_picture_takes_a_dialect_by_name_as_verify_does(renderer: str) -> None:
    render, streams_in = STREAMS_SHOWN[renderer]
    gm = foreign.schedule_copy(decoder_stack(2, (1,)).gm, 3)
    named = render(gm, dialect=foreign.NAMESPACE)
    assert named == render(gm, dialect=foreign.DIALECT) and streams_in(named) > 1
    with pytest.raises(msched.InvalidArgumentError, match="unknown dialect 'no_such_engine'"):
        render(gm, dialect="no_such_engine")


def test_explain_reads_an_engine_graph_in_the_dialect_given(engine_graph: GraphModule) -> None:
    with pytest.raises(msched.UnreadStreamOpsError):
        explain_lines(engine_graph, "stash_default_1")
    lines = explain_lines(engine_graph, "stash_default_1", dialect=myeng.DIALECT)
    assert lines[0] == "stash_default_1 = myeng.stash.default(dest, mm_1, 4, 8)"
    assert lines[1].startswith("  stream 2, time ")
    assert "  placed on stream 2 by the pass that scheduled the graph." in lines
    assert any(line.startswith("  output ") and "exit" in line for line in lines)
    # The same from a Schedule read back in the dialect, and from the node itself.
    sched = msched.read_schedule(engine_graph, dialect=myeng.DIALECT)
    node = next(n for n in engine_graph.graph.nodes if n.name == "stash_default_1")
    assert explain_lines(sched, node) == lines
    assert explain_lines(engine_graph, "wait_default_1", dialect=myeng.DIALECT)[0] == (
        "wait_default_1: wait @stash_default, a stream op issued on stream 0"
    )
