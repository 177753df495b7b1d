"""``msched schedule|svg|explain|diff --dialect``: an engine's graph read in its own dialect.

The engines are `tests.plugin.myeng` (stream ops no built-in dialect reads: without
``--dialect`` every command refuses its graph) and `tests.plugin.foreign` (msched's four-op
shape in the namespace ``msched_plugin_eng``, a dialect known by that name).
"""

from __future__ import annotations

import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from msched.models.decoders import decoder_stack
from tests.plugin import foreign, myeng

from .test_cli import run

MODULE = textwrap.dedent(
    """
    from msched.models.decoders import decoder_stack
    from tests.plugin import foreign, myeng


    def engine():
        gm = myeng.model()
        myeng.schedule(gm, 3)
        return gm


    def four_op_engine():
        return foreign.schedule_copy(decoder_stack(2, (1,)).gm, 3)


    DIALECT = myeng.DIALECT
    FOREIGN = foreign.DIALECT
    NOT_A_DIALECT = 3


    class Engine:
        DIALECT = myeng.DIALECT
    """
)


@pytest.fixture
def mod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The name of an importable module of engine graphs and dialects (fresh for every test)."""
    name = f"msched_cli_dialects_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _lanes(svg: str) -> int:
    rects = ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}rect")
    return len([r for r in rects if r.get("class") == "lane"])


COMMANDS = {
    "svg": ["svg"],
    "schedule": ["schedule", "--format", "text"],
    "explain": ["explain", "stash_default_1"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_engine_graph_without_a_dialect_is_told_to_give_dialect(
    command: str, mod: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run([*COMMANDS[command], "--graph", f"{mod}:engine", "--as-is"], capsys)
    assert code == 2 and out == ""
    assert err.startswith(f"msched {command}: error: UnreadStreamOpsError: the graph has ops")
    assert "myeng::join" in err
    # The advice names the option this command has, not those of the library or the plugin.
    assert "Give the dialect of these ops: pass --dialect NAME|module:attr (" in err
    assert "pass dialect=" not in err and "msched_dialect" not in err


@pytest.mark.parametrize("attribute", ["DIALECT", "Engine.DIALECT"])
def test_each_command_reads_an_engine_graph_in_a_dialect_of_the_users_module(
    attribute: str, mod: str, capsys: pytest.CaptureFixture[str]
) -> None:
    given = ["--graph", f"{mod}:engine", "--as-is", "--dialect", f"{mod}:{attribute}"]
    code, out, err = run(["svg", *given], capsys)
    assert code == 0, err
    assert _lanes(out) == 3
    code, out, err = run(["schedule", *given, "--format", "text"], capsys)
    assert code == 0, err
    assert out.startswith("# msched text format 2\n# streams 3, ")
    assert "\ns2 |     stash_default_1 = myeng.stash.default(" in out
    code, out, err = run(["explain", *given, "stash_default_1"], capsys)
    assert code == 0, err
    assert out.startswith("stash_default_1 = myeng.stash.default(dest, mm_1, 4, 8)\n  stream 2")
    assert "placed on stream 2 by the pass that scheduled the graph." in out


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_command_takes_a_dialect_by_name(
    command: str, mod: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*COMMANDS[command], "--graph", f"{mod}:four_op_engine", "--as-is", "--dialect"]
    if command == "explain":
        argv[1] = "capture_1"
    code, by_name, err = run([*argv, foreign.NAMESPACE], capsys)
    assert code == 0, err
    code, by_object, err = run([*argv, f"{mod}:FOREIGN"], capsys)
    assert code == 0 and by_name == by_object
    # The name is what the graph is read in: msched's own dialect does not read these ops.
    code, out, err = run([*argv, "msched"], capsys)
    assert code == 2 and out == ""
    assert f"of the {foreign.NAMESPACE} dialect but the graph is read in the msched dialect" in err


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ("no_such_engine", "unknown dialect 'no_such_engine'; give a dialect name (msched, "),
        ("trtlm", "unknown dialect 'trtlm' (did you mean 'trtllm'?); give a dialect name "),
        ("no_such_module_xyz:DIALECT", "cannot import no_such_module_xyz (ModuleNotFoundError: "),
        ("{mod}:MISSING", "{mod} has no attribute 'MISSING'"),
        ("{mod}:Engine.MISSING", "{mod}.Engine has no attribute 'MISSING'"),
        ("{mod}:NOT_A_DIALECT", "{mod}:NOT_A_DIALECT is an int, not a msched.Dialect"),
        ("{mod}:engine", "{mod}:engine is a function, not a msched.Dialect"),
        ("{mod}:", "expected package.module:attribute"),
    ],
)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_bad_dialect_is_a_usage_error_saying_what_is_accepted(
    command: str, given: str, problem: str, mod: str, capsys: pytest.CaptureFixture[str]
) -> None:
    given, problem = given.format(mod=mod), problem.format(mod=mod)
    argv = [*COMMANDS[command], "--graph", f"{mod}:engine", "--as-is", "--dialect", given]
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert err.startswith(f"msched {command}: error: --dialect {given}: {problem}"), err
    assert err.rstrip().endswith(
        "; give a dialect name (msched, trtllm, torch, autodeploy, or an op namespace with "
        "msched's four-op shape) or package.module:attribute naming a msched.Dialect"
    )


def test_dialect_reads_a_graph_not_a_stack(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["svg", "--layers", "2", "--dialect", "trtllm"], capsys)
    assert code == 2
    assert "--dialect reads the stream ops of your graph: give it with --graph" in err
    code, _, err = run(["explain", "--as-is", "output"], capsys)
    assert code == 2 and "--as-is explains your graph as it is: give it with --graph" in err


def _exported(gm: torch.fx.GraphModule, inputs: tuple[torch.Tensor, ...], path: Path) -> str:
    torch.export.save(torch.export.export(gm, inputs), path)
    return str(path)


@pytest.fixture
def engine_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """Two scheduled graphs of `myeng` saved as .pt2: on three streams, and lazily on two."""
    busy = myeng.model()
    myeng.schedule(busy, 3)
    monkeypatch.setattr(myeng, "LAZY", True)
    lazy = myeng.model()
    myeng.schedule(lazy, 3)
    inputs = myeng.inputs()
    return _exported(busy, inputs, tmp_path / "busy.pt2"), _exported(
        lazy, inputs, tmp_path / "lazy.pt2"
    )


def test_diff_reads_two_engine_graphs_in_the_dialect_given(
    engine_files: tuple[str, str], mod: str, capsys: pytest.CaptureFixture[str]
) -> None:
    busy, lazy = engine_files
    code, out, err = run(["diff", busy, lazy], capsys)
    assert code == 2 and out == ""
    assert err.startswith("msched diff: error: UnreadStreamOpsError: ")
    assert "pass --dialect NAME|module:attr (" in err
    code, out, err = run(["diff", busy, lazy, "--dialect", f"{mod}:DIALECT"], capsys)
    assert code == 1, err
    assert out.startswith("~ stash_1 s2 → s1 (waits for mm_1 on s0; joined by output)\n")
    assert "streams 3 → 2, " in out
    code, same, err = run(["diff", busy, busy, "--dialect", f"{mod}:DIALECT"], capsys)
    assert code == 0 and same == "", err
    # After "vs" a side takes the left's --dialect unless it gives its own.
    code, inherited, err = run(["diff", busy, "--dialect", f"{mod}:DIALECT", "vs", lazy], capsys)
    assert code == 1 and inherited == out, err
    code, _, err = run(
        ["diff", busy, "--dialect", f"{mod}:DIALECT", "vs", lazy, "--dialect", "msched"], capsys
    )
    assert code == 2 and "myeng::join" in err  # the right side read in msched's own


def test_diff_takes_a_dialect_by_name_and_only_with_a_graph(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stack = decoder_stack(2, (1,))
    gm = foreign.schedule_copy(stack.gm, 3)
    path = _exported(gm, stack.example_inputs(), tmp_path / "four_op.pt2")
    code, out, err = run(["diff", path, path, "--dialect", foreign.NAMESPACE], capsys)
    assert code == 0 and out == "", err
    code, out, err = run(["diff", path, path, "--dialect", "no_such_engine"], capsys)
    assert code == 2 and "--dialect no_such_engine: unknown dialect 'no_such_engine'" in err
    (tmp_path / "a.txt").write_text("# msched text format 2\n")
    code, _, err = run(
        ["diff", str(tmp_path / "a.txt"), "--streams", "2", "--dialect", "trtllm"], capsys
    )
    assert code == 2
    assert "--dialect reads the stream ops of a scheduled graph: give one saved with" in err


def test_diff_prices_engine_graphs_with_the_cost_given(
    engine_files: tuple[str, str], mod: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A .pt2 side is priced by --cost (a measured file here), as a stack is; after "vs" a
    side takes the left's --cost unless it gives its own."""
    import msched

    busy, lazy = engine_files
    settings = dict(device="cpu", device_name="cpu", torch_version="2.13.0", warmup=0, repeats=1)
    slow_mm = msched.MeasuredCostModel({}, {"aten.mm.default": 1000.0}, **settings)  # type: ignore[arg-type]
    slow_mm.save(tmp_path / "costs.json")
    cost = ["--cost", str(tmp_path / "costs.json")]
    dialect = ["--dialect", f"{mod}:DIALECT"]
    code, by_table, err = run(["diff", busy, lazy, *dialect], capsys)
    assert code == 1, err
    code, by_file, err = run(["diff", busy, lazy, *dialect, *cost], capsys)
    assert code == 1, err
    summary = by_file.splitlines()[-1]
    assert "makespan" in summary and summary != by_table.splitlines()[-1]
    code, inherited, err = run(["diff", busy, *dialect, *cost, "vs", lazy], capsys)
    assert code == 1 and inherited == by_file, err
    (tmp_path / "a.txt").write_text("# msched text format 2\n")
    code, _, err = run(["diff", str(tmp_path / "a.txt"), busy, *dialect, *cost], capsys)
    assert code == 2 and "--cost prices a scheduled graph (.pt2) or a stack; " in err
