"""`msched._text`: counted nouns and lists that agree in number, and the messages using them."""

from __future__ import annotations

import pytest
import torch
from torch.fx import symbolic_trace

import msched
from msched._text import agreeing, articled, counted, listed


def test_counted() -> None:
    assert [counted(n, "stream") for n in (0, 1, 2)] == ["0 streams", "1 stream", "2 streams"]
    assert counted(2, "process", "processes") == "2 processes"


def test_listed() -> None:
    assert listed(["a"]) == "a"
    assert listed(["a", "b"]) == "a and b"
    assert listed(("a", "b", 3)) == "a, b and 3"


def test_agreeing() -> None:
    assert [agreeing(n, "is", "are") for n in (1, 2, 0)] == ["is", "are", "are"]


class _Two(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class _One(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.relu()


def _traced(module: torch.nn.Module, sized: tuple[str, ...]) -> torch.fx.GraphModule:
    """``module`` traced, with a size (``meta["val"]``) on the nodes named in ``sized``."""
    gm = symbolic_trace(module)
    for node in gm.graph.nodes:
        if node.name in sized:
            node.meta["val"] = torch.empty(4)
    return gm


@pytest.mark.parametrize(
    ("module", "sized", "says"),
    [
        (_One(), ("x",), r"but 1 node \(relu\) has no meta"),
        (_One(), (), r"but 2 nodes \(x, relu\) have no meta"),
        (_Two(), ("x",), r"but 2 nodes \(y, add\) have no meta"),
    ],
)
def test_a_message_with_a_count_agrees(
    module: torch.nn.Module, sized: tuple[str, ...], says: str
) -> None:
    with pytest.raises(msched.InvalidArgumentError, match=says):
        msched.peak_memory(_traced(module, sized))


@pytest.mark.parametrize(
    ("noun", "written"),
    [("int", "an int"), ("OpOverload", "an OpOverload"), ("function", "a function")],
)
def test_a_type_name_gets_its_article(noun: str, written: str) -> None:
    assert articled(noun) == written
