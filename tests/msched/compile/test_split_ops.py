"""`msched.compile.split_ops`: one spelling of a split op splits the graph each compiler
sees.  ``compiler="fx"`` splits AOT autograd's graph (aten ops), ``compiler="inductor"`` the
graph Dynamo hands over (torch-level functions, Tensor methods); an aten op, a torch-level
function (callable or dotted name) and the default split the same attention calls of both.
Also: a split op that never occurs names everything the graph calls, and ``backend.graphs``
records every graph Dynamo hands over, under both compilers.
"""

from __future__ import annotations

import operator
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.fx import GraphModule, symbolic_trace

import msched
from msched.compile import pieces, split_ops
from msched.compile.compiler import DEFAULT_SPLIT_OPS, compile_and_run


class Attn(nn.Module):
    """The model of ``repros/repro_inductor_piecewise_no_split.py``: two attention calls
    through ``F.scaled_dot_product_attention``, as real models make them."""

    def __init__(self, d: int = 16, layers: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for lin in self.qkv:
            q, k, v = lin(x).view(1, 8, 3, 2, 8).permute(2, 0, 3, 1, 4)
            x = x + F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(1, 8, 16)
        return x


def _input() -> torch.Tensor:
    return torch.randn(1, 8, 16, generator=torch.Generator().manual_seed(1))


SDPA_NAME = "torch.nn.functional.scaled_dot_product_attention"
#: Every spelling of the attention of `Attn` on CPU (None: the default split ops).
SPELLINGS = {
    "aten-kernel": "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten-kernel-overload": torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    "aten-sdpa": "aten::scaled_dot_product_attention",
    "aten-sdpa-packet": torch.ops.aten.scaled_dot_product_attention,
    "function": F.scaled_dot_product_attention,
    "function-name": SDPA_NAME,
    "default": None,
}


def _backend(spelling: Any, compiler: str, **kwargs: Any) -> msched.MschedBackend:
    ops = None if spelling is None else [spelling]
    return msched.backend(num_streams=2, piecewise=True, split_ops=ops, compiler=compiler, **kwargs)


def dynamo_graph(model: nn.Module, *inputs: Any) -> GraphModule:
    """The one graph Dynamo hands a backend for ``model(*inputs)`` (what
    ``compiler="inductor"`` splits)."""
    graphs: list[GraphModule] = []

    def capture(gm: GraphModule, example_inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=capture)(*inputs)
    (gm,) = graphs
    return gm


@pytest.fixture(scope="module")
def attn_graph() -> GraphModule:
    return dynamo_graph(Attn(), _input())


# --- spellings -------------------------------------------------------------------------------


def test_a_torch_function_given_as_callable_or_dotted_name_is_one_split_op() -> None:
    parse = split_ops.parse_split_ops
    assert parse([F.scaled_dot_product_attention]) == (SDPA_NAME,)
    assert parse([SDPA_NAME]) == (SDPA_NAME,)
    assert parse([torch.softmax, "torch.Tensor.softmax"]) == (
        "torch.softmax",
        "torch.Tensor.softmax",
    )
    assert split_ops.resolve_function(SDPA_NAME) is torch._C._nn.scaled_dot_product_attention

    def mine(x: torch.Tensor) -> torch.Tensor:
        return x

    assert parse([mine]) == (mine,)  # torch cannot name it: kept as the callable
    assert split_ops.describe(mine).endswith("mine")


@pytest.mark.parametrize(
    "bad", ["torch.nn.functional.no_such_function", "torch.nn.Linear", torch.nn.Linear, 3]
)
def test_a_split_op_that_names_no_op_or_torch_function_is_refused(bad: Any) -> None:
    with pytest.raises(msched.InvalidArgumentError, match="torch-level functions"):
        msched.backend(split_ops=[bad])


def test_the_default_splits_mscheds_attention_and_torchs() -> None:
    assert DEFAULT_SPLIT_OPS == ("msched::attention", SDPA_NAME)


# --- the graph Dynamo hands over (compiler="inductor") --------------------------------------


@pytest.mark.parametrize("spelling", list(SPELLINGS.values()), ids=list(SPELLINGS))
def test_every_spelling_finds_the_attention_calls_of_dynamos_graph(
    attn_graph: GraphModule, spelling: Any
) -> None:
    ops = DEFAULT_SPLIT_OPS if spelling is None else split_ops.parse_split_ops([spelling])
    calls = pieces.find_split_calls(attn_graph.graph, ops)
    targets = [n.target for n in calls]
    assert targets == [torch._C._nn.scaled_dot_product_attention] * 2
    assert len(set(calls.values())) == 2  # two calls, two pieces


def test_a_torch_level_call_answers_to_its_aten_op_and_the_kernel_it_dispatches_to(
    attn_graph: GraphModule,
) -> None:
    index = split_ops.CallIndex(attn_graph)
    sdpa = next(n for n in attn_graph.graph.nodes if "scaled_dot" in n.name)
    call = index.call(sdpa)
    assert call.label == SDPA_NAME
    assert call.ops == (torch.ops.aten.scaled_dot_product_attention.default,)
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default in index.dispatched(
        sdpa
    )
    view = next(n for n in attn_graph.graph.nodes if n.op == "call_method" and n.target == "view")
    assert index.call(view).functions == (torch.Tensor.view,)
    assert index.call(view).ops == (torch.ops.aten.view,)  # several overloads: the packet


def test_calls_are_run_on_fake_values_only_to_match_an_aten_op(
    attn_graph: GraphModule, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any) -> Any:
        raise AssertionError("ran a call to match a split op that needs no run")

    monkeypatch.setattr(split_ops, "ops_dispatched_by", refuse)
    assert len(pieces.find_split_calls(attn_graph.graph, DEFAULT_SPLIT_OPS)) == 2
    assert not pieces.find_split_calls(attn_graph.graph, ("msched::other",))
    with pytest.raises(AssertionError, match="ran a call"):
        pieces.find_split_calls(attn_graph.graph, ("aten::_softmax",))


# --- both compilers end to end -----------------------------------------------------------------


@pytest.mark.parametrize("spelling", list(SPELLINGS.values()), ids=list(SPELLINGS))
def test_fx_splits_the_reproducer_at_attention_for_every_spelling(spelling: Any) -> None:
    model, x = Attn().eval(), _input()
    b, compiled = compile_and_run(model, (x,), _backend(spelling, "fx"))
    names = [p.name.split(".")[-1] for p in b.pieces]
    assert names == [f"submod_{k}" for k in range(5)]  # kernel and its getitem: one piece
    kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    found = [[n.target for n in p.schedule.original.graph.nodes] for p in b.pieces]
    assert [kernel in targets for targets in found] == [False, True, False, True, False]
    calls = [t for t in found[1] if callable(t)]
    assert calls[0] is kernel and set(calls[1:]) == {operator.getitem}  # and its getitems
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


# One Inductor cache per run for these (shared by the workers): the spellings' pieces are the
# same code, so only the first compiles them cold (the others are verified cache hits).
@pytest.mark.slow
@pytest.mark.parametrize("spelling", list(SPELLINGS.values()), ids=list(SPELLINGS))
def test_inductor_splits_the_reproducer_at_attention_for_every_spelling(
    run_inductor_cache: Any, spelling: Any
) -> None:
    model, x = Attn().eval(), _input()
    b, compiled = compile_and_run(model, (x,), _backend(spelling, "inductor"))
    assert [p.name for p in b.pieces] == [f"graph0.submod_{k}" for k in (0, 2, 4)]
    (graph,) = b.graphs
    assert pieces.split_call_pieces(graph.module) == ("submod_1", "submod_3")
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled(x), model(x))


# --- a split op that never occurs ------------------------------------------------------------


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return operator.add(torch.relu(self.lin(x).view(2, 8)), 1)


def test_the_warning_names_modules_methods_and_torch_functions_the_graph_calls() -> None:
    gm = symbolic_trace(Plain())  # a call_module, a call_method, two functions
    match = (
        r"^graph calls no split op \(msched::attention, torch\.nn\.functional\."
        r"scaled_dot_product_attention\), so it is one piece; it calls: operator\.add, "
        r"torch\.Tensor\.view, torch\.nn\.modules\.linear\.Linear, torch\.relu$"
    )
    with pytest.warns(msched.SplitOpNotFoundWarning, match=match):
        pieces.check_split_ops_occur(gm.graph, DEFAULT_SPLIT_OPS)


def test_the_warning_for_dynamos_graph_names_its_torch_level_calls(
    attn_graph: GraphModule,
) -> None:
    called = (
        "operator.add, operator.getitem, torch.Tensor.permute, torch.Tensor.reshape, "
        "torch.Tensor.transpose, torch.Tensor.view, torch.nn.functional.linear, "
        f"{SDPA_NAME}"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pieces.check_split_ops_occur(attn_graph.graph, ("msched::attention",), "graph0")
    (warning,) = caught
    assert str(warning.message) == (
        f"graph0 calls no split op (msched::attention), so it is one piece; it calls: {called}"
    )


# --- backend.graphs --------------------------------------------------------------------------


class Sine(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sin() + 1


def _graphs_after_calls(compiler: str) -> list[int]:
    """How many graphs the backend holds after a first call, a second one with the same
    shapes, and a third with a new shape (``dynamic=False``: Dynamo recompiles)."""
    b = msched.backend(num_streams=2, compiler=compiler)
    torch._dynamo.reset()
    compiled = torch.compile(Sine(), backend=b, dynamic=False)
    counts = []
    with torch.no_grad():
        for shape in ((4, 8), (4, 8), (2, 8)):
            x = torch.randn(shape)
            torch.testing.assert_close(compiled(x), x.sin() + 1)
            counts.append(len(b.graphs))
    assert [g.name for g in b.graphs] == ["graph0", "graph1"]
    assert [p.name for p in b.pieces] == ["graph0", "graph1"]
    assert [g.pieces for g in b.graphs] == [(p,) for p in b.pieces]
    return counts


def test_backend_graphs_records_every_graph_under_fx() -> None:
    assert _graphs_after_calls("fx") == [1, 1, 2]


@pytest.mark.slow
def test_backend_graphs_records_every_graph_under_inductor(run_inductor_cache: Any) -> None:
    assert _graphs_after_calls("inductor") == [1, 1, 2]


def test_a_graph_dynamo_restarts_from_inside_its_compile_is_recorded_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Dynamo restarts the analysis of some graphs from inside the backend's compile
    (``TensorifyScalarRestartAnalysis``): the abandoned attempt is no graph of the backend's."""
    from msched.compile import inductor_backend

    class Restart(Exception):
        pass

    attempts: list[str] = []

    def compile_graph_with_inductor(name: str, gm: GraphModule, *args: Any, **kwargs: Any) -> Any:
        attempts.append(name)
        if len(attempts) == 1:
            raise Restart
        return gm.forward, gm, ()

    monkeypatch.setattr(
        inductor_backend, "compile_graph_with_inductor", compile_graph_with_inductor
    )
    b = msched.backend(compiler="inductor")
    gm, x = symbolic_trace(Sine()), torch.randn(3)
    with pytest.raises(Restart):
        b(gm, [x])
    assert b.graphs == ()
    b(gm, [x])
    assert attempts == ["graph0", "graph0"]
    assert [(g.name, g.module, g.runtime) for g in b.graphs] == [("graph0", gm, None)]


# --- real models: transformers ----------------------------------------------------------------


def _llama() -> tuple[nn.Module, torch.Tensor]:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    return model, torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(0))


@pytest.mark.slow
@pytest.mark.parametrize("compiler", ["fx", "inductor"])
def test_a_transformers_llama_splits_at_its_attention_by_default(
    run_inductor_cache: Any, compiler: str
) -> None:
    model, ids = _llama()
    b, compiled = compile_and_run(model, (ids,), _backend(None, compiler))
    (graph,) = b.graphs
    layers = 3
    if compiler == "fx":
        assert len(b.pieces) == 2 * layers + 1
    else:  # the attention calls run as they are; the pieces around them are compiled
        assert len(b.pieces) == layers + 1
        assert len(pieces.split_call_pieces(graph.module)) == layers
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled(ids).logits, model(ids).logits)
