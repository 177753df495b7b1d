"""``msched schedule|svg|explain --graph``: the user's own graph instead of a decoder stack."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

import msched
import msched.models.reference_ops  # noqa: F401  (msched::inplace_slice_copy)

from .test_cli import run

MODULE = textwrap.dedent(
    """
    import torch
    import msched.models.reference_ops


    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, dest):
            h = torch.tanh(self.lin(x))
            torch.ops.msched.inplace_slice_copy(dest, h, 0, 4)
            return h.sin() + x.cos()


    def traced():
        torch.manual_seed(0)
        return torch.fx.symbolic_trace(Model())


    def with_inputs():
        torch.manual_seed(0)
        return Model(), (torch.randn(4, 4), torch.zeros(4, 8))


    def not_a_graph():
        return 3


    def raises():
        raise RuntimeError("no graph today")
    """
)


@pytest.fixture
def graphs_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The name of an importable module of graph functions (fresh for every test)."""
    name = f"msched_cli_graphs_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


def _body(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("#")]


def test_schedule_takes_a_function_returning_a_graph_module(
    graphs_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(
        ["schedule", "--graph", f"{graphs_module}:traced", "--streams", "2"], capsys
    )
    assert code == 0, err
    assert out.startswith("# msched text format 2\n# streams 2,")
    lines = _body(out)
    assert any("self.lin(x)" in line for line in lines)
    capture = next(i for i, line in enumerate(lines) if "inplace_slice_copy" in line)
    assert capture < next(i for i, line in enumerate(lines) if "output(" in line)


def test_a_graph_saved_with_torch_save_schedules_as_the_graph_itself(
    graphs_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = __import__(graphs_module)
    torch.save(module.traced(), tmp_path / "graph.pt")
    _, from_function, _ = run(["schedule", "--graph", f"{graphs_module}:traced"], capsys)
    code, from_file, err = run(["schedule", "--graph", str(tmp_path / "graph.pt")], capsys)
    assert code == 0, err
    assert from_file == from_function


def test_a_module_with_example_inputs_is_captured_with_dynamo(
    graphs_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["schedule", "--graph", f"{graphs_module}:with_inputs"], capsys)
    assert code == 0, err
    assert "l_x_ = input" in out and "l_dest_ = input" in out  # Dynamo's placeholders
    assert "msched.inplace_slice_copy(l_dest_" in out


def test_an_exported_program_file_schedules_its_module(
    graphs_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, inputs = __import__(graphs_module).with_inputs()
    torch.export.save(torch.export.export(model, inputs), tmp_path / "graph.pt2")
    code, out, err = run(["schedule", "--graph", str(tmp_path / "graph.pt2")], capsys)
    assert code == 0, err
    assert "aten.linear.default(x, lin_weight, lin_bias)" in out
    assert "_guards_fn" not in out  # torch's guard call is left out, not read as unknown code


def test_explain_and_svg_take_a_graph(
    graphs_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = f"{graphs_module}:traced"
    code, out, err = run(
        ["explain", "--graph", spec, "--streams", "2", "inplace_slice_copy"], capsys
    )
    assert code == 0, err
    assert out.startswith("inplace_slice_copy = msched.inplace_slice_copy(dest, tanh, 0, 4)")
    assert "Dependencies of inplace_slice_copy" in out
    code, out, err = run(["explain", "--graph", spec, "nothing_here"], capsys)
    assert code == 2 and "no node named 'nothing_here' in the scheduled graph" in err
    code, out, err = run(
        ["svg", "--graph", spec, "--streams", "2", "-o", str(tmp_path / "a.svg")], capsys
    )
    assert code == 0, err
    assert _lanes(tmp_path / "a.svg") == 2


def test_svg_as_is_draws_a_scheduled_graph_without_scheduling_it(
    graphs_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, inputs = __import__(graphs_module).with_inputs()
    gm = torch.export.export(model, inputs).module(check_guards=False)
    msched.schedule(gm, 3)
    torch.export.save(torch.export.export(gm, inputs), tmp_path / "scheduled.pt2")
    drawn = tmp_path / "drawn.svg"
    argv = ["svg", "--graph", str(tmp_path / "scheduled.pt2"), "--as-is", "-o", str(drawn)]
    code, _, err = run(argv, capsys)
    assert code == 0, err
    assert _lanes(drawn) == len(set(msched.read_schedule(gm).streams.values())) > 1
    traced = __import__(graphs_module).traced()
    msched.schedule(traced, 3)
    torch.save(traced, tmp_path / "scheduled.pt")  # a pickle: loading it drops the stream ops
    code, _, err = run(["svg", "--graph", str(tmp_path / "scheduled.pt"), "--as-is"], capsys)
    assert code == 2 and "save a scheduled graph with torch.export.save (.pt2)" in err


def _lanes(path: Path) -> int:
    svg = ET.fromstring(path.read_text())
    return len(
        [r for r in svg.iter("{http://www.w3.org/2000/svg}rect") if r.get("class") == "lane"]
    )


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("no_such_thing", "--graph no_such_thing: no such file, and not module:function; give"),
        ("no_such_module_xyz:f", "cannot import no_such_module_xyz: ModuleNotFoundError: No"),
        ("{mod}:missing", "{mod} has no function missing"),
        ("{mod}:not_a_graph", "returned int; return a torch.fx.GraphModule or a tuple"),
        ("{mod}:raises", "calling it raised RuntimeError: no graph today"),
        ("{tmp}/state.pt", "holds a dict, not a torch.fx.GraphModule"),
        ("{tmp}/garbage.pt", "cannot load it: "),
    ],
)
def test_a_bad_graph_spec_is_a_usage_error_saying_what_is_accepted(
    spec: str,
    problem: str,
    graphs_module: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    torch.save({"weight": torch.zeros(2)}, tmp_path / "state.pt")
    (tmp_path / "garbage.pt").write_bytes(b"not a pickle")
    spec = spec.format(mod=graphs_module, tmp=tmp_path)
    code, out, err = run(["schedule", "--graph", spec], capsys)
    assert code == 2 and out == ""
    assert err.startswith("msched schedule: error: --graph ")
    assert problem.format(mod=graphs_module) in err


def test_graph_and_stack_options_do_not_mix(
    graphs_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = f"{graphs_module}:traced"
    code, _, err = run(["schedule", "--graph", spec, "--layers", "4", "--moe"], capsys)
    assert code == 2 and "--graph schedules your graph: --layers, --moe describe a stack" in err
    code, _, err = run(["svg", "--as-is"], capsys)
    assert code == 2 and "--as-is draws your graph as it is: give it with --graph" in err


def test_an_unreadable_pt2_file_is_one_line_without_torchs_traceback(tmp_path: Path) -> None:
    """In a process of its own, as a user runs ``msched`` (pytest's log capture would hide
    the warning torch logs)."""
    (tmp_path / "garbage.pt2").write_bytes(b"not a zip file")
    command = "import sys; from msched.cli import main; sys.exit(main(sys.argv[1:]))"
    args = ["schedule", "--graph", str(tmp_path / "garbage.pt2")]
    done = subprocess.run(
        [sys.executable, "-c", command, *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("msched schedule: error: --graph ")
    assert "cannot load it" in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


def test_a_pt2_file_with_an_unregistered_op_says_which_and_how_to_register_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An engine's .pt2 uses its own ops; loaded without importing their module, torch says
    only "check the warnings above", and msched holds that warning back."""
    lib = torch.library.Library("msched_test_unloaded", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")

    class Twice(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.msched_test_unloaded.twice(x) + 1

    torch.export.save(torch.export.export(Twice(), (torch.ones(2),)), tmp_path / "g.pt2")
    lib._destroy()  # as in a process that did not import the engine
    code, out, err = run(["svg", "--graph", str(tmp_path / "g.pt2"), "--as-is"], capsys)
    assert code == 2 and out == ""
    assert (
        "cannot load it: it uses torch.ops.msched_test_unloaded.twice.default, which is not "
        "registered in this process; import the module that registers it before the graph "
        "loads: --dialect package.module:attribute imports its module first" in err
    )


def test_cost_takes_a_measured_cost_file_and_schedules_as_the_library_does(
    graphs_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The workflow of docs/costs.md: costs measured once, saved, and scheduled with in CI."""
    import importlib

    from msched.pictures import render_text

    graphs = importlib.import_module(graphs_module)
    model, inputs = graphs.with_inputs()
    with torch.no_grad():
        measured = msched.measure_costs(torch.fx.symbolic_trace(model), inputs, repeats=2)
    measured.save(tmp_path / "costs.json")
    loaded = msched.MeasuredCostModel.load(tmp_path / "costs.json")
    expected = render_text(msched.schedule(graphs.traced(), 2, loaded), loaded)
    args = ["schedule", "--graph", f"{graphs_module}:traced", "--streams", "2", "--cost"]
    code, out, err = run([*args, str(tmp_path / "costs.json")], capsys)
    assert code == 0, err
    assert out == expected
    code, out, err = run([*args, str(tmp_path / "missing.json")], capsys)
    assert code == 2 and out == ""
    assert f"--cost {tmp_path / 'missing.json'}: cannot read the cost file" in err
    code, out, err = run([*args, "measured"], capsys)
    assert code == 2 and "expected table, roofline or a cost file saved by" in err
