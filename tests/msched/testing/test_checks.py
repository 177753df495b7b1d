"""`msched.testing.checks`: the copy of a graph verify compares against."""

from __future__ import annotations

import torch

from msched.analysis.effects import compute_effects
from msched.analysis.nodes import node_named
from msched.testing.checks import copy_graph


class _Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + x.tanh()


def test_the_copy_reads_call_module_nodes_as_the_module_they_call() -> None:
    gm = torch.fx.symbolic_trace(_Linear())
    copied = copy_graph(gm.graph)
    lin, x = node_named(copied, "lin"), node_named(copied, "x")
    effects = compute_effects(copied)
    assert effects.writes[lin] == ()  # nn.Linear writes nothing (unknown code would write x)
    assert x in effects.reads[lin]
    assert _writes_by_name(copied) == _writes_by_name(gm.graph)


def _writes_by_name(graph: torch.fx.Graph) -> dict[str, list[str]]:
    return {n.name: [w.name for w in ws] for n, ws in compute_effects(graph).writes.items()}
