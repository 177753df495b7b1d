"""`msched versions`: which private torch interfaces answer as msched expects."""

from __future__ import annotations

import collections

import pytest

from msched import _torch_internals as ti
from msched import cli
from msched.compile import interfaces
from msched.compile._inductor_internals import INTERFACES


def test_the_presence_report_of_this_torch_is_all_ok(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["versions", "--no-probes"]) == 0
    out = capsys.readouterr().out
    total = len({*ti.TORCH_INTERFACES, *INTERFACES})  # one row per interface
    assert f"{total} of {total} interfaces answer as expected" in out
    assert "ok       torch._dynamo.graph_bytecode_inputs.index_to_external_object_weakref" in out
    assert "CHANGED" not in out


def test_a_missing_interface_is_reported_with_the_file_to_change(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = ("torch._dynamo.graph_bytecode_inputs", "renamed_in_a_future_torch")
    monkeypatch.setattr(ti, "TORCH_INTERFACES", (*ti.TORCH_INTERFACES, gone))
    assert cli.main(["versions", "--no-probes"]) == 1
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("CHANGED  torch._dynamo.graph_bytecode_inputs.renamed_in_a_future_torch")
    assert "lacks it" in lines[at + 1]
    assert (
        "change msched/_torch_internals.py; tests: tests/msched/test_torch_internals.py"
        in (lines[at + 2])
    )
    assert at == 2  # failures come first, under the count


def test_a_probe_reports_a_changed_table_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._dynamo import graph_bytecode_inputs as table_module

    changed = collections.UserList()  # neither the dict of 2.13 and 2.14 nor the list of 2.15
    monkeypatch.setattr(table_module, "index_to_external_object_weakref", changed)
    name, _, _, probe = interfaces._PROBES[0]
    problem = interfaces._probe(probe)
    assert "table" in name
    assert problem is not None and problem.startswith("TorchInternalsError: torch ")
    assert "index_to_external_object_weakref is a UserList" in problem
    monkeypatch.undo()
    assert interfaces._probe(probe) is None


@pytest.mark.slow
def test_every_probe_passes_on_this_torch() -> None:
    """The probes trace a stream program at the Dynamo and AOT stages and build a 2-stream
    piece with Inductor (on torch 2.15 before its fix: IndexError in the build)."""
    rows = interfaces.check_interfaces()
    assert [(r.name, r.problem) for r in rows if not r.ok] == []


def test_an_interface_both_modules_read_is_one_row_naming_both_files() -> None:
    """Six interfaces are listed by both internals modules: each was counted and reported
    twice, naming one file per row."""
    shared = set(ti.TORCH_INTERFACES) & set(INTERFACES)
    assert shared  # the stream table, SymbolicStreamState, fake tensors, ...
    rows = {r.name: r for r in interfaces.check_interfaces(probes=False)}
    assert len(rows) == len(interfaces.check_interfaces(probes=False))
    for module, path in shared:
        row = rows[f"{module}.{path}"]
        assert row.file == "msched/_torch_internals.py and msched/compile/_inductor_internals.py"
