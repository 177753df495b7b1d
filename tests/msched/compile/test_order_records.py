"""`msched.compile.order_records`: Inductor's final orders kept beside its cache."""

from __future__ import annotations

import json

import pytest
import torch
import torch._dynamo.variables.streams  # noqa: F401  (registers torch.ops.streams)

from msched.compile import order_records
from msched.compile._inductor_internals import FinalOrder, ScheduledNode
from msched.compile.order_records import FORMAT, load_order, record_path, save_order

WAIT = torch.ops.streams.wait_event.default


def _order(code: str = "def call(args): ...\n") -> FinalOrder:
    nodes = (
        ScheduledNode("op0", "kernel", 1, ("buf0",), ("x",), (), ("sin",)),
        ScheduledNode("op1", "stream", None, (), (), (), (), WAIT, (2000000, 0)),
        ScheduledNode("op2", "extern", None, ("buf2",), ("buf0",), (("buf2", "x"),), ("mm",)),
    )
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
    save_order(_order("code a"), tmp_path)
    assert load_order("code b", tmp_path) is None
    assert load_order("code a", tmp_path) is not None


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


def test_an_order_without_code_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="output source"):
        save_order(_order(""), tmp_path)


def test_the_default_folder_is_inductors_cache_dir(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    assert record_path("x").parent == tmp_path / "msched_orders"
