"""`msched.backend`: torch.compile of TinyDecoder end to end, re-inplacing, pieces, errors.

Compiling the 12-layer decoder takes seconds, so each configuration of the acceptance matrix
is one test that compiles once (`trace_decoder`) and checks everything about the result; that
also keeps the number of compilations fixed under ``pytest -n``.
"""

from __future__ import annotations

import importlib.util
import operator
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.fx import Graph, GraphModule, Node
from torch.fx.experimental.proxy_tensor import make_fx

import msched
from msched.analysis._targets import REGISTERED_MUTATIONS, REGISTERED_SIDE_EFFECTS
from msched.compile import _reinplace, compiler, pieces
from msched.compile._reinplace import reinplace
from msched.compile.compiler import MschedBackend, Piece, compile_and_run
from msched.models.decoders import TinyDecoder
from msched.proof.executor import execute
from msched.proof.verifier import verify
from msched.testing.traced import TracedDecoder, record_piece_inputs, trace_decoder

from ..faults import drop_last_wait

CAPTURE = torch.ops.msched.inplace_slice_copy.default
# One stream (no stream op emitted) is the slow tier's; two and three streams the default's.
CONFIGS = [
    pytest.param(s, p, marks=pytest.mark.slow if s == 1 else ())
    for s in (1, 2, 3)
    for p in (False, True)
]
CONFIG_IDS = [
    f"streams{s}-{'piecewise' if p else 'whole'}" for s in (1, 2, 3) for p in (False, True)
]
MOE = [pytest.param(False, id="mlp"), pytest.param(True, id="moe", marks=pytest.mark.slow)]
HIDDEN, TOKENS = 8, 6


def captures(gm: GraphModule) -> list[Node]:
    return [n for n in gm.graph.nodes if n.target is CAPTURE]


def capture_of(gm: GraphModule, columns: tuple[int, int]) -> Node:
    (node,) = [n for n in captures(gm) if tuple(n.args[2:4]) == columns]
    return node


def input_index(gm: GraphModule, node: object) -> int:
    return list(gm.graph.find_nodes(op="placeholder")).index(node)


# --- the acceptance matrix ---------------------------------------------------------------


@pytest.mark.parametrize("moe", MOE)
@pytest.mark.parametrize(("num_streams", "piecewise"), CONFIGS, ids=CONFIG_IDS)
def test_compiled_decoder(moe: bool, num_streams: int, piecewise: bool) -> None:
    t = trace_decoder(num_streams, piecewise=piecewise, moe=moe, hidden=HIDDEN, tokens=TOKENS)
    assert len(t.pieces) == (25 if piecewise else 1)  # 12 attention pieces + 13 between
    check_equals_eager_exactly(t)
    for piece in t.pieces:
        check_verifies(piece, num_streams)
    check_last_capture_before_return_and_joined(t)
    if num_streams == 3:
        check_adversarial_order_gives_the_same_results(t)


def check_equals_eager_exactly(t: TracedDecoder) -> None:
    # Same float32 kernels on the same values: scheduling only reorders independent nodes,
    # so the results are bitwise equal, not merely close.
    assert torch.equal(t.output, t.reference_output)
    assert torch.equal(t.capture, t.reference_capture)
    assert t.capture.abs().amin(dim=0).gt(0).all()  # every captured column was written


def check_verifies(piece: Piece, num_streams: int) -> None:
    assert piece.report is not None and piece.report.ok, piece.name  # the backend verified
    report = verify(piece.gm, original=piece.schedule.original, num_streams=num_streams)
    assert report.ok, f"{piece.name}: {report}"
    assert piece.schedule.num_streams == num_streams


def check_last_capture_before_return_and_joined(t: TracedDecoder) -> None:
    piece = t.piece_capturing(11)
    if t.piecewise:
        assert piece is t.pieces[-1]  # the piece after the last attention: no path to output
    columns = t.model.capture_slice(11)
    code = piece.gm.code
    line = f"{capture_of(piece.gm, columns).name} = torch.ops.msched.inplace_slice_copy"
    assert 0 < code.index(line) < code.index("\n    return ")
    dag = msched.build_dag(piece.schedule.original)
    assert "exit" in dag.dependencies(dag.output)[capture_of(piece.schedule.original, columns)]


def check_adversarial_order_gives_the_same_results(t: TracedDecoder) -> None:
    """Every piece, with auxiliary streams as late as the stream ops allow, leaves its
    inputs (the capture buffer among them) as a plain run of the unscheduled piece does."""
    for piece in t.pieces:
        inputs = t.piece_inputs[piece.name]
        late = execute(piece.gm, *inputs, order="late-aux")
        assert late.after_output == (), piece.name
        expected = [v.clone() if isinstance(v, torch.Tensor) else v for v in inputs]
        piece.schedule.original(*expected)
        for got, want in zip(late.inputs_at_output, expected, strict=True):
            if isinstance(want, torch.Tensor):
                assert torch.equal(got, want), piece.name
    last = t.piece_capturing(11)
    columns = t.model.capture_slice(11)
    dest = input_index(last.gm, capture_of(last.gm, columns).args[0])
    late = execute(last.gm, *t.piece_inputs[last.name], order="late-aux")
    assert torch.equal(
        late.inputs_at_output[dest][:, slice(*columns)], t.reference_capture[:, slice(*columns)]
    )


# --- dynamic shapes ------------------------------------------------------------------------


def _fresh(model: TinyDecoder, tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    return model.example_inputs(tokens, seed=seed)


def _check_call(compiled: Any, model: TinyDecoder, tokens: int, seed: int) -> None:
    x, buf = _fresh(model, tokens, seed)
    ref_buf = torch.zeros_like(buf)
    with torch.no_grad():
        ref = model(x, ref_buf)
        out = compiled(x, buf)
    assert torch.equal(out, ref)
    assert torch.equal(buf, ref_buf)


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [None, True], ids=["recompile", "dynamic"])
def test_second_call_with_other_token_count_and_fresh_buffer(dynamic: bool | None) -> None:
    model = TinyDecoder(12, HIDDEN, (1, 5, 11), moe=True)
    b = msched.backend(num_streams=3, piecewise=True)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=b, dynamic=dynamic)
    _check_call(compiled, model, tokens=5, seed=1)
    _check_call(compiled, model, tokens=9, seed=2)
    _check_call(compiled, model, tokens=3, seed=3)
    # dynamic=None: the second token count recompiles with a symbolic size, once.
    assert len(b.graphs) == (2 if dynamic is None else 1)
    first = b.graphs[-1].pieces[0].gm
    shapes = [n.meta["val"].shape for n in first.graph.find_nodes(op="placeholder")]
    assert any(isinstance(d, torch.SymInt) for shape in shapes for d in shape)
    assert all(p.report is not None and p.report.ok for p in b.pieces)


# --- a custom op nobody registered ---------------------------------------------------------


@torch.library.custom_op("msched_test::scale_into", mutates_args=("out",))
def scale_into(out: torch.Tensor, x: torch.Tensor, factor: float) -> None:
    out.copy_(x * factor)


class ScaleInto(torch.nn.Module):
    """Writes ``2 * tanh(x @ w)`` into ``buf`` through a custom op; returns ``x @ w + 1``."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8), requires_grad=False)

    def forward(self, x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        h = x @ self.w
        torch.ops.msched_test.scale_into(buf, torch.tanh(h), 2.0)
        return (h + 1) @ self.w


def test_unregistered_custom_op_is_scheduled_and_joined_at_exit() -> None:
    op = torch.ops.msched_test.scale_into
    assert op not in REGISTERED_MUTATIONS and op.default not in REGISTERED_MUTATIONS
    assert op.default not in REGISTERED_SIDE_EFFECTS
    model = ScaleInto()
    x, buf, ref_buf = torch.randn(4, 8), torch.zeros(4, 8), torch.zeros(4, 8)
    ref = model(x, ref_buf)
    b, compiled = compile_and_run(model, (x, buf), msched.backend(num_streams=2))
    (piece,) = b.pieces
    (call,) = [n for n in piece.gm.graph.nodes if n.target is op.default]
    assert piece.schedule.stream_of(call) == 1  # off the critical path, so the exit must join
    assert piece.report is not None and piece.report.ok
    dag = msched.build_dag(piece.schedule.original)
    original_call = next(n for n in dag.nodes if n.target is op.default)
    assert "exit" in dag.dependencies(dag.output)[original_call]
    assert piece.gm.code.index("scale_into") < piece.gm.code.index("return")
    assert torch.equal(buf, ref_buf)
    with torch.no_grad():
        assert torch.equal(compiled(x, buf), ref)


# --- ablation: without exit edges the last capture races ------------------------------------


def test_without_exit_edges_the_last_capture_races_and_verify_says_so() -> None:
    model = TinyDecoder(12, HIDDEN, (1, 5, 11))
    b = msched.backend(num_streams=3, piecewise=True, verify=False, exit_edges=False)
    _, compiled = compile_and_run(model, model.example_inputs(TOKENS), b)
    last = b.pieces[-1]
    columns = model.capture_slice(11)
    capture = capture_of(last.gm, columns)

    report = verify(last.gm, original=last.schedule.original)
    assert [(v.kind, v.nodes) for v in report.violations] == [
        ("exit-not-joined", (capture.name, "output"))
    ], str(report)

    # On CPU the host order hides the race: the buffer is right after the call.  The
    # adversarial executor shows it as a number: at output, the columns of layer 11 still hold
    # what they held before the piece ran (zeros), because the capture runs after output.
    x, buf = model.example_inputs(TOKENS)
    with torch.no_grad(), record_piece_inputs([last]) as seen:
        compiled(x, buf)
    assert buf[:, slice(*columns)].ne(0).all()
    late = execute(last.gm, *seen[last.name], order="late-aux")
    assert capture.name in late.after_output
    at_output = late.inputs_at_output[input_index(last.gm, capture.args[0])]
    assert torch.equal(at_output[:, slice(*columns)], torch.zeros(TOKENS, HIDDEN))


# --- errors --------------------------------------------------------------------------------


def test_piece_failing_verification_raises_naming_the_piece() -> None:
    model = TinyDecoder(12, HIDDEN, (1, 5, 11))
    inputs = model.example_inputs(TOKENS)
    match = r"piece graph0\.submod_24 failed"
    with pytest.raises(msched.PieceVerificationError, match=match) as info:
        msched.compile_pieces(model, *inputs, num_streams=3, piecewise=True, exit_edges=False)
    assert isinstance(info.value, msched.MschedError)
    assert "exit-not-joined" in str(info.value)


def test_piece_failure_through_torch_compile_is_wrapped_by_dynamo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(gm: GraphModule, num_streams: int, cost_model: Any, **kw: Any) -> msched.Schedule:
        sched = msched.schedule(gm, num_streams, cost_model, **kw)
        drop_last_wait(gm)  # drop the exit's join
        return sched

    monkeypatch.setattr(compiler, "schedule", broken)
    torch._dynamo.reset()
    compiled = torch.compile(ScaleInto(), backend=msched.backend(num_streams=2))
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
        compiled(torch.randn(4, 8), torch.zeros(4, 8))
    inner = info.value.inner_exception
    assert isinstance(inner, msched.PieceVerificationError) and "piece graph0 failed" in str(inner)


class SliceCapture(torch.nn.Module):
    def forward(self, x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        h = x * 2
        torch.ops.msched.inplace_slice_copy(buf[:, 4:], h, 0, 4)
        return h + 1


def test_v2_slice_view_argument_is_regenerated_from_its_base() -> None:
    x, buf, ref_buf = torch.randn(3, 4), torch.zeros(3, 8), torch.zeros(3, 8)
    ref = SliceCapture()(x, ref_buf)
    (gm,) = msched.compile_pieces(SliceCapture(), x, buf, num_streams=2)
    assert "torch.ops.aten.slice.Tensor(" in gm.code and "auto_functionalized" not in gm.code
    assert "copy_" not in gm.code  # the write-back became copy_(buf, buf) and is gone
    assert torch.equal(buf, ref_buf) and torch.equal(SliceCapture()(x, buf.clone()), ref)


def test_op_that_cannot_be_reinplaced_raises_naming_it() -> None:
    # auto_functionalized (v1) scatters a mutated view back into its base with slice_scatter,
    # which reads the base after the call: in place, that read would see the new value.
    x, buf = torch.randn(3, 4), torch.zeros(3, 8)
    with torch._inductor.config.patch(enable_auto_functionalized_v2=False):
        with pytest.raises(
            msched.ReinplaceError, match=r"cannot re-inplace msched::inplace_slice_copy"
        ):
            msched.compile_pieces(SliceCapture(), x, buf, num_streams=2)


def test_v1_without_views_is_reinplaced() -> None:
    model = ScaleInto()
    x, buf, ref_buf = torch.randn(4, 8), torch.zeros(4, 8), torch.zeros(4, 8)
    model(x, ref_buf)
    with torch._inductor.config.patch(enable_auto_functionalized_v2=False):
        (gm,) = msched.compile_pieces(model, x, buf, num_streams=2)
    assert "scale_into.default(" in gm.code and "auto_functionalized" not in gm.code
    assert torch.equal(buf, ref_buf)


_lib = torch.library.Library("msched_test", "FRAGMENT")
_lib.define("scale_out(Tensor x, float f, *, Tensor(a!) out) -> Tensor(a!)", tags=(torch.Tag.out,))


def _scale_out(x: torch.Tensor, f: float, *, out: torch.Tensor) -> torch.Tensor:
    return out.copy_(x * f)


_lib.impl("scale_out", _scale_out, "CompositeExplicitAutograd")


class ScaleOut(torch.nn.Module):
    def forward(self, x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        return torch.ops.msched_test.scale_out(x, 2.0, out=buf) + 1


def test_out_operator_writes_a_fresh_buffer_copied_into_the_input() -> None:
    x, buf, ref_buf = torch.randn(5), torch.zeros(5), torch.zeros(5)
    ref = ScaleOut()(x, ref_buf)
    b, compiled = compile_and_run(ScaleOut(), (x, buf), msched.backend(num_streams=2))
    code = b.pieces[0].gm.code
    assert "empty_strided" in code and "scale_out.default(" in code
    assert code.index("copy_.default(") < code.index("return")
    assert torch.equal(buf, ref_buf)
    with torch.no_grad():
        assert torch.equal(compiled(x, buf), ref)


def _functional_graph(extra_kwargs: dict[str, Any], read_old_after: bool) -> GraphModule:
    """``b = clone(x); auto_functionalized_v2(scale_into, b) ; return new b (+ old b)``."""
    g = Graph()
    x = g.placeholder("x")
    b = g.call_function(torch.ops.aten.clone.default, (x,))
    kwargs = {"x": x, "factor": 2.0, "_out_base_index": 0, "_all_bases": [b], **extra_kwargs}
    af = g.call_function(
        torch.ops.higher_order.auto_functionalized_v2,
        (torch.ops.msched_test.scale_into.default,),
        kwargs,
    )
    new = g.call_function(operator.getitem, (af, 1))
    out = g.call_function(torch.ops.aten.add.Tensor, (new, b)) if read_old_after else new
    g.output(out)
    return GraphModule(torch.nn.Module(), g)


def test_reinplace_refuses_when_the_old_value_is_read_afterwards() -> None:
    gm = _functional_graph({}, read_old_after=True)
    before = gm.code
    match = r"msched_test::scale_into.*'add_tensor' reads 'clone_default'"
    with pytest.raises(msched.ReinplaceError, match=match):
        reinplace(gm)
    assert gm.code == before


def test_reinplace_refuses_unknown_view_metadata() -> None:
    gm = _functional_graph({"_out_strange_view": 3}, read_old_after=False)
    with pytest.raises(msched.ReinplaceError, match=r"msched_test::scale_into.*_out_strange_view"):
        reinplace(gm)


def test_reinplace_turns_the_hop_into_the_inplace_call() -> None:
    gm = _functional_graph({}, read_old_after=False)
    assert reinplace(gm) == 1
    (call,) = [n for n in gm.graph.nodes if n.target is torch.ops.msched_test.scale_into.default]
    assert call.args[0].target is torch.ops.aten.clone.default
    assert list(gm.graph.nodes)[-1].args[0] is call.args[0]  # the new value is the base itself
    x = torch.randn(2, 3)
    assert torch.equal(gm(x), x * 2.0)


# --- re-inplacing: one storage per mutated argument, a fresh one per returned value ---------


@torch.library.custom_op("msched_test::write_two", mutates_args=("a", "b"))
def write_two(a: torch.Tensor, b: torch.Tensor, h: torch.Tensor) -> None:
    a.add_(h)
    b.sub_(h)


@torch.library.custom_op("msched_test::bump", mutates_args=("buf",))
def bump(buf: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    buf.add_(h)
    return buf * h


@bump.register_fake
def _(buf: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(h)


class WriteTwoThenEach(torch.nn.Module):
    """One op writes ``a`` and ``b``; then ``a`` is written and read back through a value the
    write returns, and ``b`` is written again: every output of a functionalized node is used
    after a later write to one of its siblings."""

    def forward(self, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        h = x.sin()
        torch.ops.msched_test.write_two(a, b, h)
        y = torch.ops.msched_test.bump(a, h)
        torch.ops.msched_test.scale_into(a, y, 3.0)
        torch.ops.msched_test.scale_into(b, h + a, 0.5)
        return y + b


def _inputs(*shapes: tuple[int, ...], seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g) for shape in shapes]


def _check_like_eager(model: torch.nn.Module, compiled: Any, inputs: list[torch.Tensor]) -> None:
    """``compiled`` returns what ``model`` returns and leaves its inputs as ``model`` does."""
    expected = [t.clone() for t in inputs]
    with torch.no_grad():
        want = model(*expected)
        got = compiled(*inputs)
    leaves = torch.utils._pytree.tree_leaves
    for g, w in zip(leaves(got), leaves(want), strict=True):
        assert torch.equal(g, w)
    for g, w in zip(inputs, expected, strict=True):
        assert torch.equal(g, w)


@pytest.mark.parametrize("num_streams", [2, 3])
def test_op_writing_two_arguments_then_each_again_is_reinplaced(num_streams: int) -> None:
    model = WriteTwoThenEach()
    shapes = [(4, 8)] * 3
    b, compiled = compile_and_run(
        model, _inputs(*shapes, seed=0), msched.backend(num_streams=num_streams)
    )
    (piece,) = b.pieces
    assert "auto_functionalized" not in piece.gm.code and "copy_" not in piece.gm.code
    x, a, buf = piece.gm.graph.find_nodes(op="placeholder")
    calls = {
        str(n.target).split(".")[1]: n
        for n in piece.gm.graph.nodes
        if "msched_test" in str(n.target)
    }
    assert calls["write_two"].args[:2] == (a, buf)  # each in place, in its own argument
    assert calls["bump"].args[0] is a
    assert piece.report is not None and piece.report.ok
    _check_like_eager(model, compiled, _inputs(*shapes, seed=1))


class FusedAddRmsNormLayers(torch.nn.Module):
    """vLLM's layer pattern: ``fused_add_rms_norm(x, residual)`` writes both, then a linear."""

    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.weight = torch.nn.Parameter(torch.rand(HIDDEN, generator=g) + 0.5, False)
        self.proj = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(layers))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for proj in self.proj:
            torch.ops.msched_test.fused_add_rms_norm(x, residual, self.weight, 1e-6)
            x = proj(x)
        return x, residual


@torch.library.custom_op("msched_test::fused_add_rms_norm", mutates_args=("x", "residual"))
def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    residual.add_(x)
    x.copy_(residual * torch.rsqrt(residual.pow(2).mean(-1, keepdim=True) + eps) * weight)


@pytest.mark.parametrize("num_streams", [2, 3])
def test_vllm_fused_add_rms_norm_in_a_loop_is_reinplaced(num_streams: int) -> None:
    model = FusedAddRmsNormLayers().eval()
    shapes = [(TOKENS, HIDDEN)] * 2
    b, compiled = compile_and_run(
        model, _inputs(*shapes, seed=0), msched.backend(num_streams=num_streams)
    )
    (piece,) = b.pieces
    norms = [n for n in piece.gm.graph.nodes if "fused_add_rms_norm" in str(n.target)]
    assert len(norms) == 2 and "auto_functionalized" not in piece.gm.code
    residual = piece.gm.graph.find_nodes(op="placeholder")[2]  # after the norm weight and x
    assert all(n.args[1] is residual for n in norms)  # the residual stream is one buffer
    assert piece.report is not None and piece.report.ok
    _check_like_eager(model, compiled, _inputs(*shapes, seed=1))


def test_reinplace_gives_each_mutated_argument_its_storage_and_each_result_a_fresh_one() -> None:
    g = Graph()
    x, a, b = g.placeholder("x"), g.placeholder("a"), g.placeholder("b")
    v2 = torch.ops.higher_order.auto_functionalized_v2
    both = g.call_function(
        v2,
        (torch.ops.msched_test.write_two.default,),
        {"h": x, "_a_base_index": 0, "_b_base_index": 1, "_all_bases": [a, b]},
    )
    new_a, new_b = (g.call_function(operator.getitem, (both, k)) for k in (1, 2))
    one = g.call_function(
        v2,
        (torch.ops.msched_test.bump.default,),
        {"h": x, "_buf_base_index": 0, "_all_bases": [new_a]},
    )
    y, newer_a = (g.call_function(operator.getitem, (one, k)) for k in (0, 1))
    out = g.call_function(torch.ops.aten.add.Tensor, (y, new_b))  # new_b read after `one`
    g.call_function(torch.ops.aten.copy_.default, (a, newer_a))
    g.call_function(torch.ops.aten.copy_.default, (b, new_b))
    g.output(out)
    gm = GraphModule(torch.nn.Module(), g)

    calls = [_reinplace._decode(n) for n in (both, one)]
    storages = _reinplace._storages(g, calls)
    assert [storages.storage[n] for n in (new_a, new_b, newer_a, y)] == [a, b, a, y]
    assert [storages.version[n] for n in (new_a, new_b, newer_a, y)] == [new_a, new_b, newer_a, y]

    xs, as_, bs = _inputs((4,), (4,), (4,), seed=0)
    expected_a, expected_b = as_.clone(), bs.clone()
    write_two(expected_a, expected_b, xs)
    expected = bump(expected_a, xs) + expected_b
    assert reinplace(gm) == 2
    assert "copy_" not in gm.code
    assert torch.equal(gm(xs, as_, bs), expected)
    assert torch.equal(as_, expected_a) and torch.equal(bs, expected_b)


class Trainable(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w


def test_training_graphs_are_refused() -> None:
    torch._dynamo.reset()
    compiled = torch.compile(Trainable(), backend=msched.backend())
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="inference graphs only"):
        compiled(torch.randn(2, 4))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_streams": 0}, "num_streams"),
        ({"num_streams": True}, "num_streams"),
        ({"split_ops": ["attention"]}, "split_ops"),
        ({"split_ops": "aten.sin"}, r"split_ops must be a sequence of torch ops.*'aten\.sin'"),
        ({"split_ops": torch.ops.aten.sin}, "split_ops must be a sequence"),
        ({"split_ops": []}, "split_ops must name at least one op"),
        ({"num_streams": 65}, "num_streams must be <= 64"),
        ({"cost_model": 3}, r"cost_model must have a cost\(node\) method, got int"),
        ({"cost_model": lambda node: 1.0}, "cost_model"),
    ],
)
def test_backend_rejects_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(msched.InvalidArgumentError, match=match):
        msched.backend(**kwargs)


@pytest.mark.parametrize("flag", ["piecewise", "verify", "exit_edges"])
@pytest.mark.parametrize("value", ["no", 0, None, 1])
def test_backend_refuses_a_flag_that_is_not_a_bool(flag: str, value: object) -> None:
    """``verify="no"`` was taken as truthy (``bool(verify)``) and verified silently."""
    expected = f"{flag} must be True or False, got {value!r} ({type(value).__name__})"
    with pytest.raises(msched.InvalidArgumentError) as refused:
        msched.backend(**{flag: value})
    assert str(refused.value) == expected


@pytest.mark.parametrize("compiler", ["fx", "inductor"])
def test_backend_keeps_the_flags_it_is_given(compiler: str) -> None:
    config = msched.backend(
        piecewise=True, verify=False, exit_edges=False, compiler=compiler
    ).config
    assert (config.piecewise, config.verify, config.exit_edges) == (True, False, False)


def test_backend_accepts_a_cost_model() -> None:
    model = msched.DefaultCostModel()
    assert msched.backend(cost_model=model).config.cost_model is model


def test_compile_pieces_returns_the_scheduled_pieces_in_order() -> None:
    model = TinyDecoder(2, HIDDEN, (1,))
    pieces = msched.compile_pieces(
        model, *model.example_inputs(TOKENS), num_streams=2, piecewise=True
    )
    assert all(isinstance(p, GraphModule) for p in pieces)
    kinds = ["attention" if "msched.attention" in p.code else "other" for p in pieces]
    assert kinds == ["other", "attention", "other", "attention", "other"]
    assert "inplace_slice_copy" in pieces[-1].code


def test_split_ops_choose_where_to_cut() -> None:
    model = TinyDecoder(2, HIDDEN, (0, 1), moe=True)
    inputs = model.example_inputs(TOKENS)
    pieces = msched.compile_pieces(
        model,
        *inputs,
        num_streams=2,
        piecewise=True,
        split_ops=[torch.ops.msched.moe_experts.default],
    )
    assert ["ops.msched.moe_experts" in p.code for p in pieces] == [False, True, False, True, False]


def test_split_ops_by_qualified_name_match_their_overloads() -> None:
    g = Graph()
    x = g.placeholder("x")
    moe = g.call_function(torch.ops.msched.moe_experts.default, (x, x, x, x))
    add = g.call_function(torch.ops.aten.add.Tensor, (x, x))
    g.output((moe, add))
    matches = {
        "msched::moe_experts": (True, False),
        "msched::moe_experts.default": (True, False),
        "msched::moe_experts.other": (False, False),
        "aten::add": (False, True),
        "aten::add.Tensor": (False, True),
        "aten::add.Scalar": (False, False),
    }
    for name, expected in matches.items():
        found = tuple(pieces._is_split_op(node, (name,)) for node in (moe, add))
        assert found == expected, name


def test_the_backend_imports_no_test_model() -> None:
    code = (
        "import sys, msched; b = msched.backend(piecewise=True); "
        "print(sorted(m for m in sys.modules if m.startswith(('msched.testing', 'transformers'))), "
        "b.config.split_ops)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    split_ops = "('msched::attention', 'torch.nn.functional.scaled_dot_product_attention')"
    assert run.stdout.strip() == f"[] {split_ops}"


# --- piecewise: a view taken before a split and its base stay one storage ------------------


@torch.library.custom_op("msched_test::attend_into", mutates_args=("out",))
def attend_into(q: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(q.softmax(-1))


@torch.library.custom_op("msched_test::overwrite", mutates_args=("buf",))
def overwrite(buf: torch.Tensor, h: torch.Tensor) -> None:
    buf.copy_(h)


class ReadViewThenWriteBase(torch.nn.Module):
    """``kv = cache[0]`` before the split op, read after it, then ``cache`` is written: in the
    piece after the split, ``kv`` and ``cache`` are two placeholders of one storage."""

    def __init__(self, write: str) -> None:
        super().__init__()
        self.write = write

    def forward(self, x: torch.Tensor, cache: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        kv = cache[0]
        torch.ops.msched_test.attend_into(x.sin(), out)
        y = torch.mm(kv, kv) * 2
        if self.write == "mul_":  # AOT: a copy_ write-back into the cache
            cache.mul_(0.5)
        else:  # a custom op writing the cache in place
            torch.ops.msched_test.overwrite(cache, torch.cos(x).expand(2, 4, 4).contiguous())
        return y


_SPLIT_AT_ATTEND = {"piecewise": True, "split_ops": [torch.ops.msched_test.attend_into]}


def _view_then_base_inputs(seed: int) -> list[torch.Tensor]:
    return [*_inputs((4, 4), (2, 4, 4), seed=seed), torch.zeros(4, 4)]


def test_piece_inputs_are_labelled_with_their_storage_in_the_unsplit_graph() -> None:
    model = ReadViewThenWriteBase("mul_")
    b, _ = compile_and_run(
        model, _view_then_base_inputs(0), msched.backend(num_streams=2, **_SPLIT_AT_ATTEND)
    )
    first, _, last = b.pieces
    for gm in (last.gm, last.schedule.original):  # scheduling keeps the labels
        view, base = gm.graph.find_nodes(op="placeholder")
        assert view.meta["val"].dim() == 2 and base.meta["val"].dim() == 3
        assert view.meta["msched_storage"] == base.meta["msched_storage"] == base.name
    labels = [n.meta["msched_storage"] for n in first.gm.graph.find_nodes(op="placeholder")]
    assert len(set(labels)) == len(labels)  # distinct graph inputs stay distinct storages


@pytest.mark.parametrize("write", ["mul_", "custom-op"])
@pytest.mark.parametrize("num_streams", [2, 3])
def test_view_read_after_a_split_is_ordered_before_the_write_to_its_base(
    num_streams: int, write: str
) -> None:
    model = ReadViewThenWriteBase(write)
    b, compiled = compile_and_run(
        model,
        _view_then_base_inputs(0),
        msched.backend(num_streams=num_streams, **_SPLIT_AT_ATTEND),
    )
    assert len(b.pieces) == 3
    for piece in b.pieces:
        check_verifies(piece, num_streams)
    _check_like_eager(model, compiled, _view_then_base_inputs(1))

    # The last piece, fed what the runtime feeds it (``cache[0]`` and ``cache``), in every
    # order the stream ops allow: the read of the view lands before the write of the base.
    x, cache, out = _view_then_base_inputs(2)
    want_cache = cache.clone()
    with torch.no_grad():
        want = model(x, want_cache, out.clone())
    last = b.pieces[-1]
    placeholders = last.gm.graph.find_nodes(op="placeholder")
    (at,) = [i for i, n in enumerate(placeholders) if n.meta["val"].dim() == 3]
    of_cache = placeholders[at].meta["msched_storage"]  # the cache's label: its view's too
    for order in ("late-aux", "early-aux", "random"):
        base = cache.clone()
        inputs = [
            x if n.meta["msched_storage"] != of_cache else base if i == at else base[0]
            for i, n in enumerate(placeholders)
        ]
        run = execute(last.gm, *inputs, order=order)
        assert torch.equal(run.output, want), order
        assert torch.equal(run.inputs_at_output[at], want_cache), order


# --- split ops that never occur ------------------------------------------------------------


class Attention(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q.sin(), k, v).cos()


def test_a_split_op_decomposed_out_of_sight_raises_naming_the_ops_it_became() -> None:
    """A graph that does not say which call its nodes came from (traced by ``make_fx``, not
    by Dynamo and AOT autograd) cannot split at a decomposed op: it names the ops it became."""
    q = torch.randn(1, 2, 4, 8)
    gm = make_fx(Attention())(q, q, q)
    sdpa = torch.ops.aten.scaled_dot_product_attention
    config = compiler.BackendConfig(piecewise=True, split_ops=(sdpa,))
    match = (
        r"split op aten::scaled_dot_product_attention never occurs in graph0: it was "
        r"decomposed \(AOT autograd decomposes ops\); ops of the graph that look related: "
        r"aten::_scaled_dot_product_flash_attention_for_cpu\.default; split at those "
        r"\(split_ops=\['aten::_scaled_dot_product_flash_attention_for_cpu\.default'\]\)"
    )
    with pytest.raises(msched.SplitOpNotFoundError, match=match) as info:
        compiler.compile_graph(gm, config, "graph0")
    assert isinstance(info.value, msched.MschedError)
    # The op the error names, in the spelling it names it, is where the graph splits.
    named = str(info.value).rsplit("split_ops=['", 1)[1].split("'")[0]
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    for split_at in (named, flash, str(flash)):  # str(flash): aten._scaled_..._cpu.default
        torch._dynamo.reset()
        b = msched.backend(num_streams=2, piecewise=True, split_ops=[split_at])
        compile_and_run(Attention(), (q, q, q), b)
        assert len(b.pieces) == 3, split_at


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        ("aten.add.Tensor", "aten::add.Tensor"),
        ("aten.add", "aten::add"),
        ("torch.ops.msched.moe_experts.default", "msched::moe_experts.default"),
        ("msched::moe_experts", "msched::moe_experts"),
    ],
)
def test_split_ops_take_the_spelling_python_prints_ops_in(spelling: str, canonical: str) -> None:
    assert msched.backend(split_ops=[spelling]).config.split_ops == (canonical,)


def test_a_graph_without_anything_like_a_split_op_is_one_piece_with_a_warning() -> None:
    b = msched.backend(num_streams=2, piecewise=True)  # default: attention
    match = (
        r"calls no split op \(msched::attention, torch\.nn\.functional\.scaled_dot_product_"
        r"attention\), so it is one piece; it calls: .*aten::mm"
    )
    with pytest.warns(msched.SplitOpNotFoundWarning, match=match):
        compile_and_run(ScaleInto(), (torch.randn(4, 8), torch.zeros(4, 8)), b)
    assert len(b.pieces) == 1


_SEEN_RUNTIMES: list[Any] = []


@torch.library.custom_op("msched_test::probe_runtime", mutates_args=())
def probe_runtime(x: torch.Tensor) -> torch.Tensor:
    _SEEN_RUNTIMES.append(msched.runtime.current_runtime())
    return x.clone()


@probe_runtime.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class Probe(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.msched_test.probe_runtime(x) + 1


def test_compiled_call_runs_inside_its_own_runtime() -> None:
    b, compiled = compile_and_run(Probe(), (torch.randn(3),), msched.backend(num_streams=2))
    _SEEN_RUNTIMES.clear()
    with torch.no_grad():  # as compiled: grad mode is part of dynamo's guards
        compiled(torch.randn(3))
        compiled(torch.randn(3))
    (graph,) = b.graphs
    assert _SEEN_RUNTIMES == [graph.runtime] * 2
    assert msched.runtime.current_runtime() is not graph.runtime
    assert graph.runtime.num_streams_created == 0  # CPU: no-ops


def test_model_that_never_reaches_the_backend_raises() -> None:
    b = MschedBackend(compiler.BackendConfig())
    with pytest.raises(msched.MschedError, match="never handed a graph"):
        compile_and_run(torch.nn.Identity(), (3,), b)


def _gpu_benchmark() -> Any:
    path = Path(__file__).parents[3] / "benchmarks" / "gpu_streams.py"
    spec = importlib.util.spec_from_file_location("gpu_streams", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_benchmark_exits_cleanly_without_cuda(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _gpu_benchmark().main([]) == 0
    assert "CUDA is not available" in capsys.readouterr().out


def _opaque_view(t: torch.Tensor) -> torch.Tensor:  # msched cannot see that it returns a view
    return t[0]


def test_inputs_that_may_alias_in_the_unsplit_graph_share_one_label() -> None:
    from msched.compile.compiler import split_pieces

    g = Graph()
    x, cache = g.placeholder("x"), g.placeholder("cache")
    kv = g.call_function(_opaque_view, (cache,))
    out = g.call_function(torch.ops.msched_test.attend_into.default, (x, x))
    mm = g.call_function(torch.ops.aten.mm.default, (kv, kv))
    g.call_function(torch.ops.aten.mul_.Tensor, (cache, 0.5))
    g.output((mm, out))
    pieces = split_pieces(GraphModule(torch.nn.Module(), g), (torch.ops.msched_test.attend_into,))
    last = getattr(pieces, sorted(n for n, _ in pieces.named_children())[-1])
    labels = {p.target: p.meta["msched_storage"] for p in last.graph.find_nodes(op="placeholder")}
    assert labels["_opaque_view"] == labels["cache"] == "cache"
    mul_ = next(n for n in last.graph.nodes if n.target is torch.ops.aten.mul_.Tensor)
    mm_ = next(n for n in last.graph.nodes if n.target is torch.ops.aten.mm.default)
    assert "war" in msched.build_dag(last).dependencies(mul_)[mm_]


class OwnStreams(torch.nn.Module):
    """A model with stream code of its own (explicit streams: a CPU build has no current
    stream for Dynamo to read)."""

    def __init__(self) -> None:
        super().__init__()
        self.caller, self.side = torch.Stream(device="cpu"), torch.Stream(device="cpu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ready, done = torch.Event(device="cpu"), torch.Event(device="cpu")
        y = x * 2
        ready.record(self.caller)
        with self.side:
            ready.wait(self.side)
            z = y.relu()
            done.record(self.side)
        done.wait(self.caller)
        return z + y


@pytest.mark.parametrize("compiler_name", ["fx", "inductor"])
def test_a_graph_with_its_own_stream_code_is_refused_naming_it(compiler_name) -> None:
    """msched schedules graphs without streams: the model's own ``torch.ops.streams`` calls
    failed as "[missing-node] control_deps ... the schedule dropped it" (``fx``) or in
    Inductor's lowering ("Node referenced nonexistent target", ``inductor``)."""
    torch._dynamo.reset()
    b = msched.backend(num_streams=2, compiler=compiler_name)
    with torch.no_grad(), pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
        torch.compile(OwnStreams(), backend=b)(torch.randn(4))
    inner = info.value.inner_exception
    assert isinstance(inner, msched.InvalidGraphError)
    assert "stream code of its own" in str(inner) and "record_event" in str(inner)
    assert "trace_streams" in str(inner)
