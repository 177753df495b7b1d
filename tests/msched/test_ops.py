from __future__ import annotations

import torch
from torch.fx import Graph, GraphModule

import msched
from msched.runtime import StreamRuntime, current_runtime


def _graph_with_stream_ops() -> GraphModule:
    g = Graph()
    x = g.placeholder("x")
    g.call_function(msched.ops.set_stream, (1,))
    g.call_function(msched.ops.wait_event, (0,))
    y = g.call_function(torch.ops.aten.relu.default, (x,))
    g.call_function(msched.ops.record_stream, (y, 0))
    g.call_function(msched.ops.record_event, (1,))
    g.call_function(msched.ops.set_stream, (0,))
    g.call_function(msched.ops.wait_event, (1,))
    g.output(y)
    return GraphModule(torch.nn.Module(), g)


def test_stream_ops_are_real_ops_in_the_msched_namespace() -> None:
    schemas = {op._schema.name: str(op._schema) for op in msched.ops.STREAM_OPS}
    assert schemas == {
        "msched::set_stream": (
            "msched::set_stream(int stream, int[] wait_events=[], int[] record_events=[]) -> ()"
        ),
        "msched::record_event": "msched::record_event(int event) -> ()",
        "msched::wait_event": "msched::wait_event(int event) -> ()",
        "msched::record_stream": "msched::record_stream(Tensor t, int stream) -> ()",
    }


def test_stream_ops_survive_dead_code_elimination_and_recompile() -> None:
    gm = _graph_with_stream_ops()
    before = [n.name for n in gm.graph.nodes]
    gm.graph.eliminate_dead_code()
    gm.recompile()
    assert [n.name for n in gm.graph.nodes] == before
    assert gm.code.count("torch.ops.msched.") == 6


def test_stream_ops_do_nothing_on_cpu() -> None:
    gm = _graph_with_stream_ops()
    x = torch.tensor([-1.0, 2.0])
    assert torch.equal(gm(x), torch.tensor([0.0, 2.0]))
    assert current_runtime().num_streams_created == 0


def test_runtime_can_be_activated_per_module() -> None:
    runtime = StreamRuntime()
    with runtime.active():
        assert current_runtime() is runtime
    assert current_runtime() is not runtime
