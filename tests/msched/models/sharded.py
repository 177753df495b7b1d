"""What the sharded-stack tests run on each rank (module level, so that the ranks import it).

`CASES` are the sharded stacks; `run_cases` builds each on its rank and returns plain data
(tensors, names, verdicts) for the tests to compare, so that one start of the ranks serves
every case.
"""

from __future__ import annotations

from typing import Any

from torch.fx import GraphModule

import msched
from msched.models.decoders import decoder_stack

SMALL = {"n_layers": 2, "capture_layers": (0, 1)}
CASES: dict[str, dict[str, Any]] = {
    "tp": {"tp": 2},
    "ep": {"moe": True, "ep": 2},
    "microbatches": {"microbatches": 2},
    "tp-microbatches": {"tp": 2, "microbatches": 2},
    "ep-microbatches": {"moe": True, "ep": 2, "microbatches": 2},
}
STREAMS = (1, 2, 3)


def collective_host_order(gm: GraphModule) -> list[str]:
    """The names of ``gm``'s collectives (``_c10d_functional`` ops but ``wait_tensor``), in
    graph order: the order the host issues them."""
    return [
        n.name
        for n in gm.graph.nodes
        if n.op == "call_function"
        and str(n.target).split(".")[0] == "_c10d_functional"
        and str(n.target).split(".")[1] != "wait_tensor"
    ]


def run_unscheduled(rank: int, world_size: int) -> dict[str, dict[str, Any]]:
    """Each case's output and capture buffer on this rank, and the unsharded reference."""
    found = {}
    for name, kwargs in CASES.items():
        stack = decoder_stack(**SMALL, **kwargs)
        x, dest = stack.example_inputs()
        out = stack.gm(x, dest)
        want_out, want_dest = stack.unsharded_reference()
        found[name] = {"out": out, "dest": dest, "want_out": want_out, "want_dest": want_dest}
    return found


def run_scheduled(rank: int, world_size: int, name: str) -> dict[int, dict[str, Any]]:
    """Case ``name`` scheduled on each of `STREAMS` and run on this rank, against the
    unscheduled run: outputs, the collectives' order before and after, ``verify``'s verdict
    (an exception while scheduling or running is returned as its text)."""
    found: dict[int, dict[str, Any]] = {}
    for k in STREAMS:
        stack = decoder_stack(**SMALL, **CASES[name])
        x, dest = stack.example_inputs()
        before = collective_host_order(stack.gm)
        want_out = stack.gm(x, dest)
        try:
            sched = msched.schedule(stack.gm, num_streams=k)
            report = msched.verify(stack.gm, original=sched.original)
            x2, dest2 = stack.example_inputs()
            out = stack.gm(x2, dest2)
        except Exception as error:  # reported by the test, per stream count
            found[k] = {"error": f"{type(error).__name__}: {error}"}
            continue
        found[k] = {
            "error": "",
            "out": (out - want_out).abs().max().item(),
            "dest": (dest2 - dest).abs().max().item(),
            "before": before,
            "after": collective_host_order(stack.gm),
            "verify": report.ok,
            "violations": str(report) if not report.ok else "",
        }
    return found


def run_all_scheduled(rank: int, world_size: int) -> dict[str, dict[int, dict[str, Any]]]:
    """`run_scheduled` of every case."""
    return {name: run_scheduled(rank, world_size, name) for name in CASES}
