"""The plain functions behind the plugin, without running pytest inside pytest."""

from __future__ import annotations

import re

import pytest
import torch
from syrupy.terminal import disable_color

import msched
from msched import pictures
from msched.models.decoders import decoder_stack
from msched.pictures.text import render_text
from msched.testing.checks import excerpt
from pytest_msched import (
    ScheduledGraphExtension,
    assert_exit_waits_on,
    assert_survives_recompile,
)
from pytest_msched._options import parse_streams, parse_streams_text
from pytest_msched._session import GraphRecord, SessionStats

from ..msched.faults import drop_last_wait


@pytest.fixture(scope="module")
def scheduled() -> tuple[msched.Schedule, list[str]]:
    stack = decoder_stack(n_layers=2, capture_layers=(0, 1))
    sched = msched.schedule(stack.gm, 2)
    return sched, [c.name for c in stack.captures]


@pytest.mark.parametrize("value", [[0], [2, 2], [], "23", (True,), [2.0], 3, None])
def test_parse_streams_rejects(value: object) -> None:
    with pytest.raises(ValueError, match="expected a list of distinct stream counts >= 1"):
        parse_streams(value)


def test_parse_streams_text_keeps_order() -> None:
    assert parse_streams_text(" 4, 2 3") == (4, 2, 3)
    with pytest.raises(ValueError, match="separated by commas"):
        parse_streams_text("2;3")


def test_stats_travel_between_processes_as_plain_data() -> None:
    worker = SessionStats()
    worker.add(GraphRecord(num_streams=2, num_events=5, num_waits=4, violations=0))
    worker.add(GraphRecord(num_streams=3, num_events=7, num_waits=6, violations=None))
    controller = SessionStats()
    controller.add(GraphRecord(num_streams=2, num_events=1, num_waits=1, violations=2))
    controller.merge_wire(worker.to_wire())
    controller.merge_wire(None)
    assert controller.summary_lines() == [
        "graphs scheduled: 3 (streams2: 2, streams3: 1)",
        "total waits: 11",
        "violations: 2 (1 graph not verified: --msched-verify=off)",
    ]
    assert SessionStats().summary_lines() == []


def test_the_summary_names_the_tests_whose_scheduler_used_fewer_streams() -> None:
    worker = SessionStats()
    for k in range(12):  # asked for 4 streams, used 2: counted as streams4
        worker.add(GraphRecord(4, 1, 1, 0, used=2, test=f"t.py::test_{k:02}[streams4]"))
    worker.add(GraphRecord(3, 1, 1, 0, used=3, test="t.py::test_full[streams3]"))
    controller = SessionStats()
    controller.merge_wire(worker.to_wire())
    lines = controller.summary_lines()
    assert lines[0] == "graphs scheduled: 13 (streams3: 1, streams4: 12)"
    shown = ", ".join(f"t.py::test_{k:02}[streams4] (2 of 4)" for k in range(10))
    assert lines[-1] == (f"fewer streams used than requested: 12 graphs: {shown}, and 2 more")
    assert "test_full" not in lines[-1]


def test_snapshot_text_of_schedule_and_module_is_the_canonical_rendering(
    scheduled: tuple[msched.Schedule, list[str]],
) -> None:
    sched, _ = scheduled
    extension = ScheduledGraphExtension()
    assert extension.serialize(sched) == render_text(sched)
    assert extension.serialize(sched.gm) == render_text(sched.gm)
    with pytest.raises(TypeError, match="snapshots a msched.Schedule, a torch.fx.GraphModule"):
        extension.serialize(42)


def _kernel_order() -> torch.fx.GraphModule:
    """A two-stream final order as msched reads it from Inductor: a kernel on stream 1, a
    wait, then a kernel of the caller's stream that reads its buffer."""
    import torch._dynamo.variables.streams  # noqa: F401  (registers torch.ops.streams)

    from msched.compile._inductor_internals import FinalOrder, ScheduledNode
    from msched.compile.kernel_order import kernel_order_program
    from msched.compile.native_streams import CALLER, EVENT_BASE

    streams = torch.ops.streams
    nodes = (
        ScheduledNode("op0", "kernel", CALLER + 1, ("buf0",), ("x",), (), ("sin",)),
        ScheduledNode("op1", "stream", CALLER + 1, (), (), (), (), streams.record_event.default,
                      (EVENT_BASE, CALLER + 1)),
        ScheduledNode("op2", "stream", None, (), (), (), (), streams.wait_event.default,
                      (EVENT_BASE, CALLER)),
        ScheduledNode("op3", "kernel", None, ("buf1",), ("buf0",), (), ("cos",)),
    )  # fmt: skip
    return kernel_order_program(FinalOrder(nodes, ("x",), ("buf1",)), (CALLER,))


def test_a_compiled_piece_snapshots_as_its_kernel_order_in_the_torch_dialect() -> None:
    from msched.compile.pieces import Piece

    program = _kernel_order()
    piece = Piece("graph0", program, None, None, "code", program)
    text = ScheduledGraphExtension().serialize(piece)
    assert text == render_text(msched.read_schedule(program, dialect="torch"))
    assert "s1 |   op0 = kernel(reads=[x])" in text and "s0 | wait @buf0" in text
    with pytest.raises(TypeError, match="piece graph0 has no kernel order to snapshot"):
        ScheduledGraphExtension().serialize(Piece("graph0", program, None, None))


def test_snapshot_diff_covers_the_whole_text() -> None:
    old = "\n".join(["# header 1"] + [f"s0 | n{i}" for i in range(300)]) + "\n"
    new = old.replace("# header 1", "# header 2").replace("s0 | n250\n", "s1 |   n250\n")
    with disable_color():
        lines = list(ScheduledGraphExtension().diff_lines(new, old))
    assert "- s0 | n250" in lines
    assert "+ s1 |   n250" in lines
    assert lines[:3] == ["@@ -1,3 +1,3 @@", "- # header 1", "+ # header 2"]


def test_excerpt_marks_the_focus_with_streams(
    scheduled: tuple[msched.Schedule, list[str]],
) -> None:
    sched, captures = scheduled
    text = excerpt(sched.gm, [captures[-1], "output"], radius=1).splitlines()
    stream = sched.stream_of(captures[-1])
    marked = [line for line in text if line.startswith("  > ")]
    assert marked[0].startswith(f"  > s{stream} | {'  ' * stream}{captures[-1]} = ")
    assert marked[-1].startswith("  > s0 | output(")
    assert text[0] == "    ..."


def test_excerpt_shows_a_switch_and_its_waits_on_one_line_as_the_snapshot_does(
    scheduled: tuple[msched.Schedule, list[str]],
) -> None:
    sched, captures = scheduled
    text = excerpt(sched.gm, [captures[-1]], radius=3).splitlines()
    switches = [line for line in text if "switch, wait @" in line]
    assert switches, text
    assert not any(line.strip().endswith("| wait @" + captures[-1]) for line in text)
    canonical = set(pictures.render_text(sched.gm).splitlines())
    assert all(line[4:] in canonical for line in text if line != "    ...")


def test_exit_waits_on_every_capture_and_names_the_missing_join(
    scheduled: tuple[msched.Schedule, list[str]],
) -> None:
    sched, captures = scheduled
    for name in captures:
        assert_exit_waits_on(sched.gm, name)
    gm = torch.fx.GraphModule(sched.gm, sched.gm.graph.__deepcopy__())
    drop_last_wait(gm)
    with pytest.raises(
        AssertionError, match=rf"output on stream 0 does not wait for {captures[-1]}"
    ):
        assert_exit_waits_on(gm, captures[-1])


def test_survives_recompile_sees_a_capture_that_changed_nothing() -> None:
    stack = decoder_stack(n_layers=2, capture_layers=(0, 1))
    msched.schedule(stack.gm, 2)
    assert_survives_recompile(stack.gm, stack.captures, inputs=stack.example_inputs())
    x, _ = stack.example_inputs()
    _, already_captured = stack.reference()
    with pytest.raises(
        AssertionError, match=r"capture_1 \(stream \d\) did not write dest\[\.\.\., 8:16\]"
    ):
        assert_survives_recompile(stack.gm, ["capture_1"], inputs=(x, already_captured))


@torch.library.custom_op("msched_plugin_tests::registered_capture", mutates_args=())
def registered_capture(dest: torch.Tensor, src: torch.Tensor, start: int, end: int) -> None:
    """Writes ``dest[..., start:end]`` without declaring it; registered below."""
    dest[..., start:end].copy_(src)


@torch.library.custom_op("msched_plugin_tests::unregistered_capture", mutates_args=())
def unregistered_capture(dest: torch.Tensor, src: torch.Tensor, start: int, end: int) -> None:
    """The same undeclared write, never registered: msched cannot know it."""
    dest[..., start:end].copy_(src)


msched.register_mutation(torch.ops.msched_plugin_tests.registered_capture, "dest")


def _undeclared_capture_graph(op: object) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    x, dest = graph.placeholder("x"), graph.placeholder("dest")
    y = graph.call_function(torch.ops.aten.sin.default, (x,))
    graph.create_node("call_function", op, (dest, y), {"start": 2, "end": 4}, name="capture")
    graph.output(graph.call_function(torch.ops.aten.cos.default, (x,)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_helpers_see_writes_registered_with_register_mutation() -> None:
    gm = _undeclared_capture_graph(torch.ops.msched_plugin_tests.registered_capture.default)
    sched = msched.schedule(gm, 2)
    assert_exit_waits_on(gm, "capture")
    assert_survives_recompile(gm, ["capture"], inputs=(torch.ones(3, 2), torch.zeros(3, 4)))
    already = torch.zeros(3, 4)
    already[..., 2:4] = torch.sin(torch.ones(3, 2))
    with pytest.raises(
        AssertionError, match=r"capture \(stream \d\) did not write dest\[\.\.\., 2:4\]"
    ):
        assert_survives_recompile(sched.gm, ["capture"], inputs=(torch.ones(3, 2), already))


def test_helpers_do_not_guess_writes_a_schema_does_not_declare() -> None:
    gm = _undeclared_capture_graph(torch.ops.msched_plugin_tests.unregistered_capture.default)
    with pytest.raises(AssertionError, match="^capture writes no graph input"):
        assert_survives_recompile(gm, ["capture"], inputs=(torch.ones(3, 2), torch.zeros(3, 4)))


def test_a_snapshot_mismatch_starts_with_the_schedule_summary() -> None:
    from pytest_msched import ScheduledGraphExtension

    old = render_text(msched.schedule(decoder_stack(6, (1, 5)).gm, 3))
    new = render_text(msched.schedule(decoder_stack(6, (0, 1, 5)).gm, 3))
    plain = [
        re.sub(r"\x1b\[[0-9;]*m", "", line)
        for line in ScheduledGraphExtension().diff_lines(new, old)
    ]
    assert plain[0] == "schedule changes (msched diff):"
    # Counts first (pytest cuts long messages from the end), then what changed.
    assert plain[1].startswith("  nodes 216 → 217, events ")
    assert plain[2].startswith("  + capture_0 on s")
    assert any(line.startswith("+ ") and "capture_0" in line for line in plain)
    # The same text: no summary, nothing to show.
    assert list(ScheduledGraphExtension().diff_lines(old, old)) == []
