"""`decoder_stack(capture_op=...)`: any capture op of the right argument kinds and order."""

from __future__ import annotations

import pytest
import torch

import msched
from msched.models.decoders import decoder_stack

NAMESPACE = "msched_test_capture_names"

_lib = torch.library.Library(NAMESPACE, "DEF")
_lib.define("put(Tensor(a!) buffer, Tensor value, SymInt lo, SymInt hi) -> ()")
_lib.define("put_flagged(Tensor(a!) out, Tensor x, int a, int b, bool check=False) -> ()")
_lib.define("swapped(Tensor(a!) buffer, int lo, Tensor value, int hi) -> ()")
_lib.define("needs_more(Tensor(a!) buffer, Tensor value, int lo, int hi, int step) -> ()")
_lib.define("writes_value(Tensor buffer, Tensor(a!) value, int lo, int hi) -> ()")
_lib.define("keyword(Tensor(a!) buffer, Tensor value, *, int lo, int hi) -> ()")


def _put(buffer: torch.Tensor, value: torch.Tensor, lo: int, hi: int, *_: object) -> None:
    buffer.narrow(-1, lo, hi - lo).copy_(value)


def _put_flagged(out: torch.Tensor, x: torch.Tensor, a: int, b: int, check: bool = False) -> None:
    _put(out, x, a, b)


_lib.impl("put", _put, "CompositeExplicitAutograd")
_lib.impl("put_flagged", _put_flagged, "CompositeExplicitAutograd")
_ops = getattr(torch.ops, NAMESPACE)


@pytest.mark.parametrize("capture_kwargs", [True, False], ids=["kwargs", "positional"])
@pytest.mark.parametrize("op", [_ops.put.default, _ops.put_flagged.default], ids=["put", "flag"])
def test_a_capture_op_with_its_own_argument_names_captures(
    op: torch._ops.OpOverload, capture_kwargs: bool
) -> None:
    stack = decoder_stack(
        n_layers=2, capture_layers=(0, 1), capture_op=op, capture_kwargs=capture_kwargs
    )
    names = tuple(a.name for a in op._schema.arguments[:4])
    for capture in stack.captures:
        assert capture.target is op
        assert tuple(capture.kwargs) == (names if capture_kwargs else ())
    out, dest = stack.reference()
    want_out, want_dest = decoder_stack(n_layers=2, capture_layers=(0, 1)).reference()
    assert torch.equal(out, want_out) and torch.equal(dest, want_dest)
    sched = msched.schedule(stack.gm, num_streams=2)
    assert [n.name for n in sched.original.graph.nodes if n.target is op] == [
        "capture_0",
        "capture_1",
    ]
    msched.verify(stack.gm, original=sched.original).raise_if_failed()
    x, buffer = stack.example_inputs()
    assert torch.equal(stack.gm(x, buffer), want_out) and torch.equal(buffer, want_dest)


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("swapped", r"not \(Tensor, Tensor, int, int\) in this order: \(Tensor buffer, int lo, "),
        ("needs_more", r"after the fourth need defaults \(step has none\)"),
        ("writes_value", r"it must write buffer \(its first argument\) and nothing else"),
        ("keyword", r"first four arguments must be positional"),
    ],
)
def test_a_capture_op_of_other_argument_kinds_or_order_is_refused(name: str, problem: str) -> None:
    with pytest.raises(msched.InvalidArgumentError, match=problem) as raised:
        decoder_stack(capture_op=getattr(_ops, name).default)
    assert "any argument names" in str(raised.value)
