"""`msched.trace_streams` on model code written with PyTorch's own streams, judged by verify.

Each function below is stream code as people write it (``torch.Stream``, ``with stream:``,
``wait_stream``, ``torch.Event``, ``record_stream``); the graphs are the ones ``torch.compile``
builds on CPU, at the Dynamo stage and after AOT autograd, read in the detected ``torch``
dialect.  Nothing here runs a stream op (CPU streams cannot).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import msched
from msched.proof.dialects import Dialect, target_key
from msched.proof.interpreter import interpret

side = torch.Stream(device="cpu")
done = torch.Event(device="cpu")


def joined_with_wait_stream(x: torch.Tensor) -> torch.Tensor:
    caller = torch.accelerator.current_stream()
    side.wait_stream(caller)
    with side:
        y = x.relu() * 2
    caller.wait_stream(side)
    return y + 1


def joined_with_events(x: torch.Tensor) -> torch.Tensor:
    caller = torch.accelerator.current_stream()
    ready = torch.Event(device="cpu")
    ready.record(caller)
    ready.wait(side)
    with side:
        y = x.relu() * 2
    done.record(side)
    done.wait(caller)
    return y + 1


def joined_with_record_stream(x: torch.Tensor) -> torch.Tensor:
    caller = torch.accelerator.current_stream()
    side.wait_stream(caller)
    with side:
        y = x.relu() * 2
    caller.wait_stream(side)
    y.record_stream(caller)
    x.record_stream(side)
    return y + 1


def capture_never_joined(x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
    """The Eagle3 bug: a buffer written on a side stream that the caller never waits for."""
    caller = torch.accelerator.current_stream()
    side.wait_stream(caller)
    with side:
        buf.copy_(x * 2)
    return x + 1


def returned_without_join(x: torch.Tensor) -> torch.Tensor:
    caller = torch.accelerator.current_stream()
    side.wait_stream(caller)
    with side:
        y = x * 3
    return y


def written_while_read(x: torch.Tensor) -> torch.Tensor:
    """The shared-expert bug: the side stream reads ``x`` while the caller writes it."""
    caller = torch.accelerator.current_stream()
    side.wait_stream(caller)
    with side:
        y = x * 2
    x.add_(1)
    caller.wait_stream(side)
    return y + x


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(4), torch.zeros(4)


CLEAN = [joined_with_wait_stream, joined_with_events, joined_with_record_stream]


@pytest.mark.parametrize("stage", ["dynamo", "aot"])
@pytest.mark.parametrize("fn", CLEAN, ids=lambda f: f.__name__)
def test_joined_side_streams_verify(fn, stage: str) -> None:
    gm = msched.trace_streams(fn, inputs()[0], stage=stage)
    assert Dialect.detect(gm).name == "torch"
    program = interpret(gm)
    assert program.num_streams == 2 and program.num_waits >= 2
    assert msched.verify(gm).ok, msched.verify(gm).violations


def test_the_stream_ops_are_read_as_actions_on_the_right_streams() -> None:
    gm = msched.trace_streams(joined_with_events, inputs()[0])
    program = interpret(gm)
    kinds = [(s.kind, s.stream) for s in program.steps if s.kind not in ("compute", "host")]
    assert kinds == [("record_event", 0), ("wait_event", 1), ("record_event", 1), ("wait_event", 0)]
    ran_on = {s.node.name: s.stream for s in program.steps if s.kind == "compute"}
    assert ran_on["relu"] == ran_on["y"] == 1 and ran_on["add"] == 0
    assert gm.meta["msched_caller_stream"] == (0,)


@pytest.mark.parametrize("stage, write", [("dynamo", "copy_"), ("aot", "copy")])
def test_a_capture_never_joined_is_exit_not_joined_naming_the_write(stage: str, write) -> None:
    gm = msched.trace_streams(capture_never_joined, *inputs(), stage=stage)
    report = msched.verify(gm)
    exits = report.of_kind("exit-not-joined")
    assert [v.nodes for v in exits] == [(write, "output")]


@pytest.mark.parametrize("stage, value", [("dynamo", "y"), ("aot", "mul")])
def test_a_value_returned_without_a_join_is_named(stage: str, value: str) -> None:
    report = msched.verify(msched.trace_streams(returned_without_join, inputs()[0], stage=stage))
    assert [v.nodes for v in report.of_kind("exit-not-joined")] == [(value, "output")]


def test_a_write_on_the_caller_stream_while_the_side_stream_reads_is_a_war_race() -> None:
    report = msched.verify(msched.trace_streams(written_while_read, inputs()[0]))
    assert [(v.kind, v.hazard, v.nodes) for v in report.violations] == [
        ("race", "war", ("y", "add_"))
    ]


def test_after_aot_the_write_is_functional_and_the_graph_is_race_free() -> None:
    """Functionalization turns ``x.add_(1)`` into a new tensor the graph returns first (the
    mutated input); the side stream reads the old ``x``, so the program has no race."""
    gm = msched.trace_streams(written_while_read, inputs()[0], stage="aot")
    program = interpret(gm)
    names = [s.node.name for s in program.steps]
    add = next(n for n in gm.graph.nodes if n.name == "add")
    assert add.target is torch.ops.aten.add.Tensor and add.args[1] == 1
    assert program.stream_of[add] == 0
    join = next(s for s in program.steps if s.kind == "wait_stream" and s.stream == 0)
    assert names.index("add") < names.index(join.node.name)
    assert gm.graph.output_node().args[0][0] is add  # the new x, returned first
    assert msched.verify(gm).ok
    assert not any(n.target is torch.ops.aten.add_.Tensor for n in gm.graph.nodes)


def test_without_the_final_join_the_same_code_is_flagged() -> None:
    def forgot_join(x: torch.Tensor) -> torch.Tensor:
        caller = torch.accelerator.current_stream()
        side.wait_stream(caller)
        with side:
            y = x.relu() * 2
        return y + 1

    report = msched.verify(msched.trace_streams(forgot_join, inputs()[0]))
    assert [(v.kind, v.nodes) for v in report.violations] == [("race", ("y", "add"))]


def test_without_the_first_join_the_side_stream_races_the_caller() -> None:
    def forgot_start(x: torch.Tensor) -> torch.Tensor:
        caller = torch.accelerator.current_stream()
        with side:
            y = x.relu() * 2
        caller.wait_stream(side)
        return y + 1

    report = msched.verify(msched.trace_streams(forgot_start, inputs()[0]))
    assert [v.kind for v in report.violations] == ["race"]
    assert "without joining stream 0" in report.violations[0].message


def test_a_given_caller_stream_is_index_0_and_recorded() -> None:
    caller = torch.Stream(device="cpu")

    def named_caller(x: torch.Tensor) -> torch.Tensor:
        side.wait_stream(caller)
        with side:
            y = x.relu()
        caller.wait_stream(side)
        return y

    gm = msched.trace_streams(named_caller, inputs()[0], caller_stream=caller)
    assert gm.meta["msched_caller_stream"] == (0, 2)  # current stream, and as named
    assert interpret(gm).num_streams == 2
    assert msched.verify(gm).ok
    # Read as if no index were the caller's, the caller's stream and stream 0 differ.
    report = msched.verify(gm, dialect=Dialect.named("torch", caller_stream=None))
    assert not report.ok


class SharedExpertBlock(nn.Module):
    """vLLM-style: the shared expert runs on an auxiliary CUDA stream next to the routed one."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(8, 8)
        self.routed = nn.Linear(8, 8)
        self.aux = torch.cuda.Stream()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        current = torch.cuda.current_stream()
        self.aux.wait_stream(current)
        with torch.cuda.stream(self.aux):
            shared = self.shared(x)
        routed = self.routed(x)
        current.wait_stream(self.aux)
        return shared + routed


class UnjoinedSharedExpertBlock(SharedExpertBlock):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        current = torch.cuda.current_stream()
        self.aux.wait_stream(current)
        with torch.cuda.stream(self.aux):
            shared = self.shared(x)
        return shared + self.routed(x)


@pytest.mark.parametrize("stage", ["dynamo", "aot"])
def test_cuda_stream_code_traces_on_cpu_inside_cuda_streams_on_cpu(stage: str) -> None:
    with msched.cuda_streams_on_cpu():
        block = SharedExpertBlock()
        gm = msched.trace_streams(block, torch.randn(2, 8), stage=stage)
        bad = msched.trace_streams(UnjoinedSharedExpertBlock(), torch.randn(2, 8), stage=stage)
    assert msched.verify(gm).ok
    assert interpret(gm).num_waits == 2
    assert [v.kind for v in msched.verify(bad).violations] == ["race"]
    assert torch.cuda.Stream is not type(block.aux)  # the real names are back


def test_cuda_stream_code_does_not_build_on_cpu_without_it() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA build makes real CUDA streams")
    # torch.cuda.Stream refuses to be made: a CPU build says why, a CUDA build without a GPU
    # fails to initialise CUDA (both RuntimeError).
    cpu_build = not torch.backends.cuda.is_built()
    match = r"torch\.cuda\.Stream requires CUDA support" if cpu_build else "CUDA"
    with pytest.raises(RuntimeError, match=match):
        SharedExpertBlock()


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(msched.InvalidArgumentError, match="stage must be one of"):
        msched.trace_streams(joined_with_events, inputs()[0], stage="triton")
    with pytest.raises(msched.InvalidArgumentError, match="needs a callable"):
        msched.trace_streams(3)
    with pytest.raises(msched.InvalidArgumentError, match="caller_stream must be a torch"):
        msched.trace_streams(joined_with_events, inputs()[0], caller_stream=0)


def test_code_that_cannot_be_traced_in_one_graph_says_why() -> None:
    def breaks(x: torch.Tensor) -> torch.Tensor:
        print("host side effect")
        torch._dynamo.graph_break()
        return x + 1

    with pytest.raises(
        msched.InvalidArgumentError, match=r"cannot trace .*breaks in one graph: Unsupported"
    ):
        msched.trace_streams(breaks, inputs()[0])


def side_stream_without_any_sync(x: torch.Tensor) -> torch.Tensor:
    with side:
        y = x * 2
    return y + 1


@pytest.mark.parametrize("stage", ["dynamo", "aot"])
def test_a_side_stream_with_no_stream_op_at_all_is_read_from_the_annotations(stage: str) -> None:
    """After AOT the graph may hold no stream op: the stream annotations still say where
    each node runs, so the graph is read in the torch dialect."""
    gm = msched.trace_streams(side_stream_without_any_sync, inputs()[0], stage=stage)
    assert Dialect.detect(gm).name == "torch"
    report = msched.verify(gm)
    assert {v.kind for v in report.violations} == {"race"} and len(report.violations) == 2
    gm.meta.pop("msched_caller_stream")  # annotations alone are enough
    assert not msched.verify(gm).ok


class KeepsItsMainStream(nn.Module):
    """Models often keep ``torch.cuda.current_stream()`` from ``__init__`` for their joins."""

    def __init__(self) -> None:
        super().__init__()
        self.main = torch.cuda.current_stream()
        self.aux = torch.cuda.Stream()
        self.shared = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.aux.wait_stream(self.main)
        with torch.cuda.stream(self.aux):
            shared = self.shared(x)
        self.main.wait_stream(self.aux)
        return shared + x


@pytest.mark.parametrize("stage", ["dynamo", "aot"])
def test_inside_cuda_streams_on_cpu_the_caller_is_its_current_stream(stage: str) -> None:
    with msched.cuda_streams_on_cpu() as caller:
        model = KeepsItsMainStream()
        assert model.main is caller
        gm = msched.trace_streams(model, torch.randn(2, 8), stage=stage)
    assert msched.verify(gm).ok


def test_nothing_to_trace_and_untraceable_cpu_calls_say_so() -> None:
    with pytest.raises(msched.InvalidArgumentError, match="ran no tensor operation"):
        msched.trace_streams(lambda x: None, inputs()[0])

    def records_on_the_stream(x: torch.Tensor) -> torch.Tensor:
        event = side.record_event()
        event.wait()
        return x + 1

    with pytest.raises(msched.InvalidArgumentError, match=r"create the event \(torch.Event"):
        msched.trace_streams(records_on_the_stream, inputs()[0])


def test_a_report_names_the_pytorch_table_index_of_each_stream() -> None:
    report = msched.verify(msched.trace_streams(side_stream_without_any_sync, inputs()[0]))
    assert report.legend == ("stream 1 = PyTorch stream table index 1",)
    assert "where stream 1 = PyTorch stream table index 1" in str(report)


# The AOT graph of the same code differs between the tested torch releases (2.13, 2.14, 2.15):
# 2.14 and 2.15 also wrap the first wait of the side stream in ``control_deps`` (ordered after
# the record it waits for), where 2.13 leaves it bare.  The torch dialect reads both; verify
# agrees.
AOT_OPS_OF_JOINED_WITH_EVENTS = {
    (2, 13): [
        "streams::record_event", "streams::wait_event", "aten::relu", "aten::mul",
        "control_deps", "getitem", "control_deps", "aten::add",
    ],
    (2, 14): [
        "streams::record_event", "control_deps", "aten::relu", "aten::mul",
        "control_deps", "getitem", "control_deps", "getitem", "aten::add",
    ],
}  # fmt: skip
AOT_OPS_OF_JOINED_WITH_EVENTS[(2, 15)] = AOT_OPS_OF_JOINED_WITH_EVENTS[(2, 14)]


def test_after_aot_torch_2_14_also_wraps_the_first_wait_and_both_are_race_free() -> None:
    release = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    expected = AOT_OPS_OF_JOINED_WITH_EVENTS.get(release)
    if expected is None:
        pytest.fail(f"torch {torch.__version__} is not a tested release: add its AOT graph here")
    gm = msched.trace_streams(joined_with_events, inputs()[0], stage="aot")
    ops = [target_key(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert ops == expected, f"torch {torch.__version__} changed the AOT graph of stream code"
    wrapped = [
        [target_key(m.target) for m in getattr(gm, n.args[1].target).graph.nodes]
        for n in gm.graph.nodes
        if target_key(n.target) == "control_deps"
    ]
    waits = sum(ops.count("streams::wait_event") for ops in wrapped)
    assert waits == (1 if release == (2, 13) else 2)
    program = interpret(gm)
    syncs = [s.kind for s in program.steps if s.kind in ("record_event", "wait_event")]
    assert syncs == ["record_event", "wait_event", "record_event", "wait_event"]
    assert msched.verify(gm).ok


def test_a_capturing_backend_failure_says_what_it_raised() -> None:
    """Dynamo's BackendCompilerFailed says only "raised:"; the error names the inner one.
    (Inductor cannot compile a side stream's copy into an input slice.)"""
    with msched.cuda_streams_on_cpu():
        side = torch.cuda.Stream()

        def side_capture(x, cap):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                cap[: x.shape[0]].copy_(x.relu())
            return x * 2

        with pytest.raises(
            msched.InvalidArgumentError,
            match=r"Inductor \(torch .*\) failed to compile the graph traced from .*side_capture "
            r"\(AssertionError",
        ):
            msched.trace_streams(
                side_capture, torch.randn(4, 8), torch.zeros(16, 8), stage="inductor"
            )


def doubled(x: torch.Tensor) -> torch.Tensor:
    return x.relu() * 2


@pytest.mark.parametrize("fn", [doubled, joined_with_wait_stream], ids=lambda f: f.__name__)
def test_the_inductor_stage_is_never_served_from_a_cache(
    fn, tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tracing the same code twice with the same shapes generates Inductor's code twice: its FX
    graph cache and AOT autograd's cache would serve the second compile without code generation,
    so there would be no kernel order to read.  (Compiled C++ kernels are reused.)"""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    first = msched.trace_streams(fn, torch.ones(4), stage="inductor")
    second = msched.trace_streams(fn, torch.ones(4), stage="inductor")
    assert str(first.graph) == str(second.graph)
    assert msched.verify(second).ok
