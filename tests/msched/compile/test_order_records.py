"""`msched.compile.order_records`: Inductor's final orders kept beside its cache."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat

import pytest
import torch
import torch._dynamo.variables.streams  # noqa: F401  (registers torch.ops.streams)

from msched.compile import order_records
from msched.compile._inductor_internals import Buffer, FinalOrder, ScheduledNode
from msched.compile.order_records import (
    FORMAT,
    load_order,
    matches_code,
    record_path,
    renew,
    save_order,
)

WAIT = torch.ops.streams.wait_event.default


CODE = """
def call(args):
    with stream1:
        cpp_fused_sin_0(buf0, x)
    with default_stream:
        torch.ops.streams.wait_event.default(2000, 0)
        torch.ops.streams.record_stream.default(buf0, 1000001)
    extern_kernels.mm(buf0, x, out=buf2)
"""
RECORD_STREAM = torch.ops.streams.record_stream.default


def _order(code: str = CODE) -> FinalOrder:
    nodes = (
        ScheduledNode("op0", "kernel", 1, ("buf0",), ("x",), (), ("sin",)),
        ScheduledNode("op1", "stream", None, (), (), (), (), WAIT, (2000, 0)),
        ScheduledNode("op3", "stream", None, (), ("buf0",), (), (), RECORD_STREAM, (1000001,)),
        ScheduledNode("op2", "extern", None, ("buf2",), ("buf0",), (("buf2", "x"),), ("mm",)),
        ScheduledNode(
            "op4", "extern", None, ("buf4",), ("buf2",), (), ("all_reduce_coalesced",),
            comm_op="_c10d_functional.all_reduce_coalesced_.default",
            comm_args=((Buffer("buf2"), Buffer("buf0")), "sum", "0"), issue=3,
        ),
    )  # fmt: skip
    return FinalOrder(
        nodes, ("x",), ("buf2",), reuses=(("buf0", "buf3"),), code=code,
        stream_names=(("stream1", 1),), module=object(),
    )  # fmt: skip


def test_an_order_comes_back_as_it_was_kept_without_its_module(tmp_path) -> None:
    order = _order()
    path = save_order(order, tmp_path)
    assert path == record_path(order.code, tmp_path) and path.parent.name == "msched_orders"
    loaded = load_order(order.code, tmp_path)
    assert loaded is not None and loaded.module is None
    assert loaded == FinalOrder(*(getattr(order, f) for f in ("nodes", "inputs", "outputs")),
                                reuses=order.reuses, code=order.code,
                                stream_names=order.stream_names)  # fmt: skip
    assert loaded.nodes[1].stream_op is WAIT


def test_the_record_is_keyed_by_the_code(tmp_path) -> None:
    save_order(_order(CODE), tmp_path)
    assert load_order(CODE + "# another build\n", tmp_path) is None
    assert load_order(CODE, tmp_path) is not None


def _with_nodes(order: FinalOrder, nodes) -> FinalOrder:
    return dataclasses.replace(order, nodes=tuple(nodes))


@pytest.mark.parametrize(
    "edit",
    [
        lambda nodes: [n for n in nodes if n.stream_op is not WAIT],
        lambda nodes: [dataclasses.replace(n, stream=None) for n in nodes],
        lambda nodes: [
            dataclasses.replace(n, stream_args=(2000001, 0)) if n.stream_op is WAIT else n
            for n in nodes
        ],  # fmt: skip
    ],
    ids=["a-wait-dropped", "all-on-the-caller", "another-event"],
)
def test_a_record_that_does_not_fit_its_code_is_not_used(tmp_path, edit) -> None:
    """The code's stream-op calls and stream contexts must be the record's."""
    order = _order()
    assert matches_code(order, CODE)
    forged = _with_nodes(order, edit(order.nodes))
    assert not matches_code(forged, CODE)
    save_order(forged, tmp_path)
    assert load_order(CODE, tmp_path) is None


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: {**data, "format": FORMAT + 1},
        lambda data: {k: v for k, v in data.items() if k != "nodes"},
        lambda data: {**data, "nodes": [{**data["nodes"][1], "stream_op": "streams.nope.x"}]},
    ],
    ids=["other-format", "no-nodes", "unknown-op"],
)
def test_a_record_of_another_format_or_damaged_counts_as_missing(tmp_path, damage) -> None:
    path = save_order(_order(), tmp_path)
    path.write_text(json.dumps(damage(json.loads(path.read_text()))))
    assert load_order(_order().code, tmp_path) is None


def test_a_truncated_record_counts_as_missing(tmp_path) -> None:
    path = save_order(_order(), tmp_path)
    path.write_text(path.read_text()[:40])
    assert load_order(_order().code, tmp_path) is None


def test_a_failed_write_leaves_no_record_and_no_temporary(tmp_path, monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(order_records.os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        save_order(_order(), tmp_path)
    assert list((tmp_path / "msched_orders").iterdir()) == []


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_a_record_gets_the_mode_of_a_plain_file_under_the_umask(tmp_path, umask) -> None:
    """Written through ``mkstemp``, every record (and generation) was ``0o600``: on a cache
    folder another user shares, their hits found no readable order and compiled again."""
    previous = os.umask(umask)
    try:
        record = save_order(_order(), tmp_path)
        renew("a", tmp_path)
        assert os.umask(umask) == umask  # reading the umask left it as it was
    finally:
        os.umask(previous)
    generation_file = next((tmp_path / "msched_orders").glob("generation-*"))
    expected = 0o666 & ~umask
    assert stat.S_IMODE(record.stat().st_mode) == expected
    assert stat.S_IMODE(generation_file.stat().st_mode) == expected


def test_an_order_without_code_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="output source"):
        save_order(_order(""), tmp_path)


def test_the_default_folder_is_inductors_cache_dir(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    assert record_path("x").parent == tmp_path / "msched_orders"


def test_renewing_gives_a_build_a_new_generation(tmp_path) -> None:
    """msched's pass key covers the generation, so a renewed build misses Inductor's caches
    once; a new one never repeats an old one, also after the folder was deleted."""
    assert order_records.generation("a", tmp_path) == ""
    first = order_records.renew("a", tmp_path)
    assert order_records.generation("a", tmp_path) == first != ""
    second = order_records.renew("a", tmp_path)
    assert order_records.generation("a", tmp_path) == second != first
    assert order_records.generation("b", tmp_path) == ""  # another build is not renewed
    shutil.rmtree(tmp_path / "msched_orders")
    assert order_records.generation("a", tmp_path) == ""
    assert order_records.renew("a", tmp_path) not in ("", first, second)
