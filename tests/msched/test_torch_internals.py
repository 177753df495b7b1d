"""Every private torch interface of `msched._torch_internals` is there and does what msched
relies on; each failure names the interface, the torch version and the msched module that
relies on it.  Also: the tested range, the warning outside it, the error for a missing one."""

from __future__ import annotations

import collections
import inspect
import math
import subprocess
import sys
import tomllib
import warnings
import weakref
from pathlib import Path

import pytest
import torch
from torch.fx import GraphModule, symbolic_trace
from torch.fx.graph import CodeGen
from torch.fx.node import has_side_effect
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import msched
from msched import _torch_internals as ti


def changed(interface: str, user: str) -> str:
    return f"torch {torch.__version__} changed {interface}; {user} relies on it"


def small_module() -> GraphModule:
    return symbolic_trace(lambda x, y: torch.relu(x) + y)


def test_fx_code_generation_hook_takes_nodes_root_module_namespace_and_returns_its_source() -> None:
    params = list(inspect.signature(CodeGen._gen_python_code).parameters)
    assert params[:4] == ["self", "nodes", "root_module", "namespace"], changed(
        "torch.fx.graph.CodeGen._gen_python_code", "msched.scheduling.codegen"
    )

    class Marked(ti.SourceRewriting, CodeGen):
        def rewrite_source(self, src: str) -> str:
            return src.replace("torch.relu(", "torch.sigmoid(")

    gm = small_module()
    gm.graph.set_codegen(Marked())
    gm.recompile()
    x = torch.tensor([-1.0, 2.0])
    assert "torch.sigmoid(" in gm.code and torch.equal(gm(x, x), torch.sigmoid(x) + x), changed(
        "how Graph.python_code calls CodeGen._gen_python_code", "msched.scheduling.codegen"
    )
    assert ti.codegen_of(gm.graph).__class__ is Marked, changed(
        "Graph._codegen (what Graph.set_codegen sets)", "msched.scheduling"
    )


def test_the_pytree_code_generator_is_a_code_generator() -> None:
    assert issubclass(ti.PyTreeCodeGen, CodeGen), changed(
        "torch.fx.graph._PyTreeCodeGen", "msched.scheduling.codegen"
    )


def test_a_custom_builtin_is_a_global_of_generated_code() -> None:
    ti.register_custom_builtin("msched_test_pi", "from math import pi as msched_test_pi", math.pi)
    gm = small_module()
    assert gm.forward.__globals__.get("msched_test_pi") is math.pi, changed(
        "torch.fx.graph._register_custom_builtin", "msched.scheduling.codegen"
    )


def test_node_inputs_is_the_dict_of_all_input_nodes() -> None:
    gm = small_module()
    for node in gm.graph.nodes:
        inputs = ti.node_inputs(node)
        assert isinstance(inputs, dict) and list(inputs) == node.all_input_nodes, changed(
            "torch.fx.Node._input_nodes", "msched.analysis (effects, dag, lifetimes)"
        )


def test_side_effectful_functions_is_the_set_has_side_effect_adds_to() -> None:
    def effect(x: torch.Tensor) -> None:
        pass

    has_side_effect(effect)
    assert effect in ti.SIDE_EFFECTFUL_FUNCTIONS and torch._assert in ti.SIDE_EFFECTFUL_FUNCTIONS, (
        changed("torch.fx.node._side_effectful_functions", "msched.analysis._targets")
    )


def test_the_lazy_graph_module_generates_code_when_first_needed() -> None:
    assert ti.LazyGraphModule is not None and issubclass(ti.LazyGraphModule, GraphModule)
    gm = ti.LazyGraphModule(torch.nn.Module(), small_module().graph, "Lazy")
    assert gm.recompile() is None and "relu" in gm.code, changed(
        "torch.fx._lazy_graph_module._LazyGraphModule", "msched._lazy"
    )


def test_the_dispatcher_flags_are_off_by_default_and_on_when_something_intercepts() -> None:
    user = "msched.ops (direct stream calls)"
    plain = (
        ti.dispatch_mode_depth(),
        ti.function_mode_enabled(),
        ti.profiler_enabled(),
        ti.functorch_active(),
    )
    assert plain == (0, False, False, False), changed("torch._C's dispatcher flags", user)
    with TorchDispatchMode():
        assert ti.dispatch_mode_depth() == 1, changed("torch._C._len_torch_dispatch_stack", user)
    with TorchFunctionMode():
        assert ti.function_mode_enabled(), changed("torch._C._is_torch_function_mode_enabled", user)
    with torch.profiler.profile():
        assert ti.profiler_enabled(), changed("torch._C._autograd._profiler_enabled", user)
    seen: list[bool] = []
    torch.func.vmap(lambda x: seen.append(ti.functorch_active()) or x)(torch.ones(2))
    assert seen == [True], changed("torch._C._are_functorch_transforms_active", user)


def test_op_schemas_and_names() -> None:
    add, add_ = torch.ops.aten.add, torch.ops.aten.add_
    schema = ti.schema_of(add.Tensor)
    assert isinstance(schema, ti.FunctionSchema) and schema.name == "aten::add", changed(
        "OpOverload._schema", "msched.analysis"
    )
    assert [a.name for a in schema.arguments] == ["self", "other", "alpha"]
    assert ti.schema_of(add_.Tensor).arguments[0].alias_info.is_write
    assert ti.qualified_name(add) == "aten::add", changed(
        "OpOverloadPacket._qualified_op_name", "msched.analysis"
    )
    assert isinstance(add.Tensor, ti.OpOverload) and isinstance(add, ti.OpOverloadPacket)
    af = torch.ops.higher_order.auto_functionalized
    assert isinstance(af, ti.HigherOrderOperator), changed("torch._ops", "msched")


def test_torch_purity_and_list_types() -> None:
    assert ti.torch_says_impure(torch.ops.aten.add_.Tensor), changed(
        "torch._library.utils.is_impure", "msched.analysis._targets"
    )
    assert not ti.torch_says_impure(torch.ops.aten.add.Tensor)
    cat, add = ti.schema_of(torch.ops.aten.cat.default), ti.schema_of(torch.ops.aten.add.Tensor)
    assert ti.is_tensorlist_like(cat.arguments[0].type), changed(
        "torch._library.utils.is_tensorlist_like_type", "msched.compile._reinplace"
    )
    assert not ti.is_tensorlist_like(add.arguments[0].type)


def test_forward_hooks_own_and_global_are_seen() -> None:
    user = "msched.analysis._targets (modules with hooks are of unknown effect)"
    module = torch.nn.ReLU()
    assert not ti.has_forward_hooks(module)
    handle = module.register_forward_pre_hook(lambda m, args: None)
    assert ti.has_forward_hooks(module), changed("nn.Module._forward_pre_hooks", user)
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, a, r: None)
    try:
        assert ti.has_forward_hooks(module), changed(
            "nn.modules.module._global_forward_hooks", user
        )
    finally:
        handle.remove()


def test_tree_map_maps_the_leaves() -> None:
    assert ti.tree_map(lambda v: v * 2, (1, [2, {"a": 3}])) == (2, [4, {"a": 6}]), changed(
        "torch.utils._pytree.tree_map", "msched.proof.executor"
    )


def test_aot_autograd_and_the_compile_helpers_are_there() -> None:
    aot = ti.require("torch._functorch.aot_autograd", "aot_module_simplified", "msched.backend")
    assert "fw_compiler" in inspect.signature(aot).parameters, changed(
        "torch._functorch.aot_autograd.aot_module_simplified", "msched.backend"
    )
    assert callable(ti.aot_autograd(fw_compiler=lambda gm, inputs: gm)), changed(
        "torch._dynamo.backends.common.aot_autograd", "msched.trace_streams"
    )
    assert issubclass(ti.backend_compiler_failed(), Exception), changed(
        "torch._dynamo.exc.BackendCompilerFailed", "msched.compile.compiler"
    )
    with ti.fake_tensor_mode(allow_non_fake_inputs=True):
        assert (torch.ones(2, 3) @ torch.empty(3, 4)).shape == (2, 4)


def test_a_symbolic_size_has_an_expression_and_its_shape_env_hints() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x: x + 1, tracing_mode="symbolic")(torch.zeros(5, 7))
    rows, cols = next(iter(gm.graph.nodes)).meta["val"].shape
    hints = ti.symbol_hints(rows)
    assert {hints[ti.symbolic_expr(rows)], hints[ti.symbolic_expr(cols)]} == {5, 7}
    assert ti.symbolic_expr(3) is None and ti.symbol_hints(3) == {}


def _attention(q: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, q, q).softmax(-1)


def test_dynamo_and_aot_nodes_say_what_they_came_from() -> None:
    """Dynamo's nodes carry fake example values; AOT autograd's the Dynamo call they came
    from and the op they were traced under (`msched.compile.split_ops` reads them)."""
    seen: dict[str, GraphModule] = {}

    def inference(gm: GraphModule, example_inputs: object) -> object:
        seen["aot"] = gm
        return gm

    def capture(gm: GraphModule, example_inputs: list[torch.Tensor]) -> object:
        seen["dynamo"] = gm
        return ti.aot_module_simplified(
            gm, example_inputs, fw_compiler=inference, inference_compiler=inference
        )

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(_attention, backend=capture)(torch.randn(1, 2, 4, 8))
    sdpa = torch._C._nn.scaled_dot_product_attention
    (call,) = seen["dynamo"].graph.find_nodes(op="call_function", target=sdpa)
    fake = ti.require("torch._subclasses.fake_tensor", "FakeTensor", "msched.compile.split_ops")
    assert isinstance(ti.example_value(call), fake), changed(
        'a Dynamo node\'s meta["example_value"]', "msched.compile.split_ops"
    )
    kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    (node,) = seen["aot"].graph.find_nodes(op="call_function", target=kernel)
    (getitem,) = node.users
    for made in (node, getitem):
        source = ti.source_function(made)
        assert source is not None and source[1] is sdpa, changed(
            'an AOT node\'s meta["source_fn_stack"]', "msched.compile.split_ops"
        )
        assert str(ti.original_aten(made)) == str(kernel), changed(
            'an AOT node\'s meta["original_aten"]', "msched.compile.split_ops"
        )
    assert ti.ops_dispatched_by(sdpa, (ti.example_value(call),) * 3, {}).count(kernel) == 1
    assert ti.source_function(next(iter(seen["aot"].graph.nodes))) is None  # a placeholder


def test_a_call_is_run_on_fake_values_to_see_what_it_dispatches_to() -> None:
    with ti.fake_tensor_mode() as mode:
        q = torch.empty(1, 2, 4, 8)
    ops = ti.ops_dispatched_by(torch.Tensor.softmax, (q, -1), {})
    assert torch.ops.aten._softmax.default in ops, changed(
        "torch.utils._python_dispatch.TorchDispatchMode under a FakeTensorMode",
        "msched.compile.split_ops",
    )
    shape = q.shape
    assert ti.ops_dispatched_by(torch.Tensor.unsqueeze_, (q, 0), {}) == (
        torch.ops.aten.unsqueeze_.default,
    )
    assert q.shape == shape and q.fake_mode is mode  # it ran on a clone
    assert ti.ops_dispatched_by(torch.Tensor.softmax, (torch.ones(2), -1), {}) == ()  # real
    assert ti.ops_dispatched_by(torch.Tensor.view, (q, 5), {}) == ()  # raises: unknown


def test_dynamo_reads_the_caller_stream_while_patched_and_its_own_after() -> None:
    import torch._dynamo.utils as utils

    caller = torch.Stream(device="cpu")
    original = utils.get_current_stream
    with ti.dynamo_current_stream(caller):
        assert utils.get_current_stream(torch.device("cpu")) is caller, changed(
            "torch._dynamo.utils.get_current_stream", "msched.trace_streams"
        )
        state = torch._dynamo.variables.streams.SymbolicStreamState()
        assert len(state.cur_stream_stack) == 1, changed(
            "torch._dynamo.variables.streams.SymbolicStreamState", "msched.trace_streams"
        )
        assert ti.dynamo_external_objects()[0] is caller, changed(
            "torch._dynamo.graph_bytecode_inputs", "msched.trace_streams"
        )
    assert utils.get_current_stream is original


def test_a_missing_interface_raises_naming_it_the_version_and_the_range() -> None:
    with pytest.raises(msched.TorchInternalsError) as raised:
        ti.require("torch.fx.graph", "_no_such_interface", "msched.scheduling.codegen")
    text = str(raised.value)
    assert f"torch {torch.__version__} has no torch.fx.graph._no_such_interface" in text
    assert "msched.scheduling.codegen relies on" in text and "torch>=2.13,<2.16" in text
    with pytest.raises(msched.TorchInternalsError, match="torch._no_such_module.f"):
        ti.require("torch._no_such_module", "f", "msched")


@pytest.mark.parametrize(
    "version", ["2.13.0", "2.13.0+cpu", "2.14.1+cu130", "2.15.0", "2.15.0a0+git1234", "2.15.9"]
)
def test_a_tested_torch_does_not_warn(version: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ti.warn_if_untested(version)


@pytest.mark.parametrize("version", ["2.12.1", "2.16.0", "2.16.0a0+git1234", "3.0.0"])
def test_an_untested_torch_warns_naming_it_and_the_tested_range(version: str) -> None:
    with pytest.warns(msched.UntestedVersionWarning) as record:
        ti.warn_if_untested(version)
    assert f"torch {version} is installed" in str(record[0].message)
    assert "tested with torch>=2.13,<2.16" in str(record[0].message)


def test_importing_msched_with_an_untested_torch_warns() -> None:
    code = (
        "import warnings, torch\n"
        "torch.__version__ = torch.torch_version.TorchVersion('2.16.0')\n"
        "warnings.simplefilter('error', UserWarning)\n"
        "import msched\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode != 0
    assert "UntestedVersionWarning: msched is tested with torch>=2.13,<2.16" in run.stderr
    assert "torch 2.16.0 is installed" in run.stderr


def test_pyproject_requires_exactly_the_tested_torch() -> None:
    pyproject = Path(__file__).parents[2] / "pyproject.toml"
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    assert [d for d in dependencies if d.startswith("torch")] == [ti.tested_range()]


# Dynamo's table of external objects: a dict in torch 2.13 and 2.14, a list in 2.15 ------------


def _side_stream(x: torch.Tensor) -> torch.Tensor:
    side = torch.Stream(device="cpu")
    with side:
        return x.relu()


@pytest.mark.parametrize("shape", [dict, list])
def test_msched_writes_and_reads_the_stream_table_in_either_shape(monkeypatch, shape) -> None:
    """torch 2.15 made the table a list: msched wrote index 1000000 of it (IndexError) and
    read it with ``.items()`` (AttributeError).  Both shapes, whatever torch runs here."""
    from torch._dynamo import graph_bytecode_inputs as table_module

    mine, dynamos = torch.Stream(device="cpu"), torch.Stream(device="cpu")
    table = shape({0: weakref.ref(dynamos)}) if shape is dict else [weakref.ref(dynamos)]
    monkeypatch.setattr(table_module, "index_to_external_object_weakref", table)
    ti.set_dynamo_external_objects({1001: mine})
    read = ti.dynamo_external_objects()
    assert read[0] is dynamos and read[1001] is mine
    if shape is list:
        assert len(table) == 1002  # padded with a placeholder no op reads


@pytest.mark.parametrize("shape", [dict, list])
def test_writing_the_stream_table_can_be_undone_in_either_shape(monkeypatch, shape) -> None:
    """What msched writes over (an object Dynamo registered at one of msched's indices) and
    what it pads a list with come back as they were when the returned undo runs."""
    from torch._dynamo import graph_bytecode_inputs as table_module

    dynamos = [torch.Stream(device="cpu") for _ in range(1002)]
    refs = [weakref.ref(s) for s in dynamos]
    table = dict(enumerate(refs)) if shape is dict else list(refs)
    monkeypatch.setattr(table_module, "index_to_external_object_weakref", table)
    mine = {1001: torch.Stream(device="cpu"), 2000: torch.Event(device="cpu")}
    undo = ti.set_dynamo_external_objects(mine)
    assert ti.dynamo_external_objects()[1001] is mine[1001]
    undo()
    read = ti.dynamo_external_objects()
    assert len(read) == len(dynamos) and all(read[i] is s for i, s in enumerate(dynamos))


def test_a_stream_table_of_another_shape_is_a_torch_internals_error(monkeypatch) -> None:
    from torch._dynamo import graph_bytecode_inputs as table_module

    monkeypatch.setattr(table_module, "index_to_external_object_weakref", ())
    with pytest.raises(msched.TorchInternalsError) as raised:
        ti.set_dynamo_external_objects({1000: torch.Stream(device="cpu")})
    text = str(raised.value)
    assert "index_to_external_object_weakref is a tuple" in text
    assert f"torch {torch.__version__}" in text and "torch>=2.13,<2.16" in text


def test_trace_streams_lets_a_changed_interface_through_not_blaming_the_user(monkeypatch) -> None:
    """On torch 2.15 the table's new type surfaced as "cannot trace <your function> in one
    graph: AttributeError": the user's code was blamed for a torch change.  Here the table is
    a ``UserDict`` (torch 2.13, 2.14) or ``UserList`` (2.15): Dynamo still registers streams
    in it, msched cannot read it."""
    from torch._dynamo import graph_bytecode_inputs as table_module

    shape = type(table_module.index_to_external_object_weakref)
    changed = collections.UserDict() if shape is dict else collections.UserList()
    monkeypatch.setattr(table_module, "index_to_external_object_weakref", changed)
    with pytest.raises(msched.TorchInternalsError) as raised:
        msched.trace_streams(_side_stream, torch.randn(4))
    text = str(raised.value)
    assert f"index_to_external_object_weakref is a {type(changed).__name__}" in text
    assert "msched.trace_streams" in text and "_side_stream" not in text


def test_trace_streams_names_a_table_dynamo_itself_cannot_use(monkeypatch) -> None:
    """A table of a type torch's own functions fail on (a tuple) failed in msched's hook,
    inside Dynamo, and came out as "cannot trace <your function> in one graph:
    AttributeError: 'tuple' object has no attribute 'clear'"."""
    from torch._dynamo import graph_bytecode_inputs as table_module

    monkeypatch.setattr(table_module, "index_to_external_object_weakref", ())
    with pytest.raises(msched.TorchInternalsError) as raised:
        msched.trace_streams(_side_stream, torch.randn(4))
    text = str(raised.value)
    assert "index_to_external_object_weakref is a tuple" in text
    assert "msched.trace_streams" in text and "_side_stream" not in text


def test_every_listed_torch_interface_is_present() -> None:
    from msched.compile._inductor_internals import INTERFACES
    from msched.compile.interfaces import check_interfaces

    rows = check_interfaces(probes=False)
    assert len(rows) == len({*ti.TORCH_INTERFACES, *INTERFACES})  # one row each
    missing = ", ".join(r.name for r in rows if not r.ok)
    assert not missing, changed(missing, "msched (`msched versions` says which file)")
