"""`msched.errors`: errors carry what their message names as data (``report``, ``piece``,
``nodes``), with the messages they always had."""

from __future__ import annotations

import pytest
import torch
from torch.fx import Graph, GraphModule

import msched
from msched.compile import compiler
from msched.models.decoders import decoder_stack
from msched.proof import actions

from .scheduled import Scheduled, aten


def _racy() -> GraphModule:
    """``b`` on stream 1 reads ``a`` of stream 0 without a wait: a race."""
    s = Scheduled()
    x = s.input("x")
    a = s.op("a", aten.neg.default, x)
    s.stream(1)
    b = s.op("b", aten.neg.default, a)
    s.record(0)
    s.stream(0)
    s.wait(0)
    return s.done(s.op("out", aten.add.Tensor, a, b))


def test_a_failed_verification_carries_its_report() -> None:
    report = msched.verify(_racy())
    assert not report.ok
    with pytest.raises(msched.ScheduleVerificationError) as raised:
        report.raise_if_failed()
    assert raised.value.report is report
    assert str(raised.value) == str(report)


def test_a_failed_piece_carries_its_name_and_report(monkeypatch: pytest.MonkeyPatch) -> None:
    report = msched.verify(_racy())
    monkeypatch.setattr(compiler, "verify", lambda *args, **kwargs: report)
    gm = decoder_stack(2, (1,)).gm
    with pytest.raises(msched.PieceVerificationError) as raised:
        compiler._schedule_piece("graph0", gm, compiler.BackendConfig(verify=True))
    assert (raised.value.piece, raised.value.report) == ("graph0", report)
    assert str(raised.value) == f"piece graph0 failed verification: {report}"
    assert isinstance(raised.value, msched.ScheduleVerificationError)


def _after_output() -> Graph:
    graph = Graph()
    x = graph.placeholder("x")
    graph.output(x)
    graph.create_node("call_function", aten.neg.default, (x,), name="late")
    return graph


def test_graph_errors_name_their_nodes_as_data() -> None:
    with pytest.raises(msched.InvalidGraphError, match="nodes after output: late;") as late:
        msched.build_dag(_after_output())
    assert late.value.nodes == ("late",)
    sched = msched.schedule(decoder_stack(2, (1,)).gm, 2)
    with pytest.raises(msched.InvalidGraphError, match="already scheduled") as again:
        msched.schedule(sched.gm, 2)
    assert set(again.value.nodes) == {
        n.name for n in sched.gm.graph.nodes if n.target in msched.ops.STREAM_OPS
    }
    node = Graph().create_node("call_function", aten.neg.default, (-1,), name="sw")
    with pytest.raises(msched.InvalidGraphError, match="'sw' has a negative id -1") as bad:
        actions.int_argument(node, 0, "switch", "stream")
    assert bad.value.nodes == ("sw",)
    assert msched.InvalidGraphError("no nodes named").nodes == ()


def test_errors_reading_a_stream_program_name_their_node() -> None:
    graph = Graph()
    x = graph.placeholder("x")
    graph.call_function(msched.ops.set_stream, (1, [-3]), name="bad_switch")
    graph.output(x)
    with pytest.raises(msched.InvalidGraphError, match="'bad_switch' waits for -3") as bad:
        msched.verify(GraphModule(torch.nn.Module(), graph))
    assert bad.value.nodes == ("bad_switch",)


def test_the_backend_refuses_training_graphs_with_a_class_of_its_own() -> None:
    b = msched.backend()
    with pytest.raises(msched.TrainingGraphError, match="inference graphs only"):
        b._refuse_training(torch.fx.symbolic_trace(torch.nn.ReLU()), [])


class _Identity(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_a_model_dynamo_runs_eagerly_is_a_no_graph_compiled_error() -> None:
    with pytest.raises(msched.NoGraphCompiledError, match="never handed a graph of _Identity"):
        compiler.compile_and_run(_Identity(), [torch.ones(2)], msched.backend())


def test_the_cli_usage_error_lives_in_errors_and_keeps_its_old_path() -> None:
    import msched.cli
    import msched.errors

    assert msched.cli.UsageError is msched.errors.UsageError is msched.UsageError
    assert issubclass(msched.UsageError, msched.MschedError)
