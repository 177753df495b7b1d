"""Fault injection: break correct schedules in known ways; `msched.verify` must catch each one.

The per-fault detection counts are printed in the run's summary (see the top-level
conftest.py).  Dropped waits are also cross-checked against an independent happens-before
reader (`tests.msched.hb`): the orderings verify reports broken are exactly those it finds.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from torch.fx import GraphModule

import msched
import msched.testing.strategies as mst
from msched.analysis.dag import Dag, build_dag
from msched.analysis.nodes import node_named
from msched.models.decoders import decoder_stack

from ..faults import (
    FAULTS,
    Fault,
    copy_module,
    inject,
    real_orderings_broken,
    redundant_record_streams,
)

# Faults whose effect shows in the scheduled graph alone; the rest need ``original``.
WITHOUT_ORIGINAL = ("drop-wait", "move-wait", "unrecorded-switch-wait", "drop-switch-record",
                    "move-switch-record", "capture-after-output", "move-stream",
                    "drop-record-stream", "unrecorded-wait",
                    "unorder-collectives")  # fmt: skip
CROSS_CHECKED = ("drop-wait", "move-wait", "move-switch-record", "move-stream")


def reported_orderings(report: msched.Report) -> set[tuple[str, str]]:
    """The orderings a report says are broken, as ``(before, after)`` names."""
    pairs = set()
    for v in report.violations:
        pair = v.kind in ("exit-not-joined", "collective-order") or v.kind == "race"
        if pair and len(v.nodes) == 2:
            pairs.add((v.nodes[0], v.nodes[1]))
        elif v.kind == "race":
            pairs.add(("<entry>", v.nodes[0]))
    return pairs


def oracle_orderings(fault: Fault, original: GraphModule, dag: Dag) -> set[tuple[str, str]]:
    """What `tests.msched.hb` finds broken; an input edge into an unjoined start is one fact.
    ``dag``: the `Dag` of ``original`` (built once for all the faults of a graph)."""
    broken = set(real_orderings_broken(fault.gm, original, dag))
    unjoined = {after for before, after in broken if before == "<entry>"}
    inputs = {n.name for n in original.graph.nodes if n.op in ("placeholder", "get_attr")}
    return {(b, a) for b, a in broken if not (b in inputs and a in unjoined)}


def check_fault(fault: Fault, original: GraphModule, dag: Dag) -> bool | None:
    """Whether verify detects ``fault`` (with and, where meaningful, without ``original``).

    None: the fault broke nothing, by the independent reader: a dropped wait that another
    wait made redundant.  Verify must then report nothing either (the cross-check).
    """
    report = msched.verify(fault.gm, original=original)
    detected = bool({v.kind for v in report.violations} & fault.expect)
    if fault.kind in WITHOUT_ORIGINAL:
        alone = msched.verify(fault.gm)
        detected = detected and bool({v.kind for v in alone.violations} & fault.expect)
    if fault.kind in CROSS_CHECKED:
        expected = oracle_orderings(fault, original, dag)
        assert reported_orderings(report) == expected, fault.site
        if not expected and fault.kind == "drop-wait":
            assert report.ok, str(report)
            return None
    return detected


def run_faults(
    gm: GraphModule,
    original: GraphModule,
    limit: int | None,
    table: dict[str, list[int]],
    redundant: list[str],
) -> list[str]:
    """Inject every fault kind at up to ``limit`` sites; return the undetected ones.

    Dropped waits that break nothing are appended to ``redundant`` (and not counted).
    """
    missed = []
    dag = build_dag(original)
    for kind in FAULTS:
        row = table.setdefault(kind, [0, 0])
        for fault in inject(kind, gm, original, limit):
            detected = check_fault(fault, original, dag)
            if detected is None:
                redundant.append(fault.site)
                continue
            row[0] += 1
            row[1] += detected
            if not detected:
                missed.append(f"{kind} at {fault.site}")
    return missed


def format_table(table: dict[str, list[int]]) -> str:
    return "\n".join(f"{k:<22} {d:>5} / {i:<5} detected" for k, (i, d) in table.items())


#: The stacks of the table (six layers, captures of layers 1, 3 and 5, unless said); ``tp`` is
#: tensor parallel (rank 0 of 2) with two micro-batches, whose all-reduces the collective
#: faults swap and unorder; ``tp-small`` is the same with three layers (captures of 0 and 2),
#: the default tier's: the six-layer one doubles every layer's nodes and costs half a minute.
STACKS: dict[str, dict[str, object]] = {
    "dense": {"moe": False},
    "moe": {"moe": True},
    "tp": {"tp": 2, "microbatches": 2, "rank": 0},
    "tp-small": {"tp": 2, "microbatches": 2, "rank": 0, "n_layers": 3, "capture_layers": (0, 2)},
}
#: Faults that need collectives in the graph.
COLLECTIVE_FAULTS = {"swap-collectives", "unorder-collectives"}


# Two streams in the default tier (the MoE stack has record_streams to drop, the dense one
# none), three in the slow tier: each stack costs tens of seconds.
@pytest.mark.parametrize(
    ("stack_kind", "streams"),
    [
        pytest.param("dense", 2, id="dense-2"),
        pytest.param("dense", 3, id="dense-3", marks=pytest.mark.slow),
        pytest.param("moe", 2, id="moe-2"),
        pytest.param("moe", 3, id="moe-3", marks=pytest.mark.slow),
        pytest.param("tp-small", 2, id="tp-small-2"),
        pytest.param("tp", 2, id="tp-2", marks=pytest.mark.slow),
        pytest.param("tp", 3, id="tp-3", marks=pytest.mark.slow),
    ],
)
def test_every_fault_is_detected_on_decoder_stacks(
    stack_kind: str, streams: int, record_property: Callable[[str, object], None]
) -> None:
    shape: dict[str, object] = {"n_layers": 6, "capture_layers": (1, 3, 5)}
    stack = decoder_stack(**{**shape, **STACKS[stack_kind]})
    sched = msched.schedule(stack.gm, streams)
    assert msched.verify(stack.gm, original=sched.original).ok
    table: dict[str, list[int]] = {}
    redundant_waits: list[str] = []
    missed = run_faults(stack.gm, sched.original, 25, table, redundant_waits)
    record_property("fault_detection", table)
    print(format_table(table))
    assert not redundant_waits, f"the emitter emitted waits another wait covers: {redundant_waits}"
    assert not missed, missed
    assert_every_fault_injected(table, collectives=stack_kind == "tp")


def assert_every_fault_injected(table: dict[str, list[int]], collectives: bool = False) -> None:
    # A graph may need no record_stream at all (see msched.analysis.lifetimes); only a
    # sharded one has collectives.
    optional = {"drop-record-stream"} | (set() if collectives else COLLECTIVE_FAULTS)
    assert all(table[k][0] for k in FAULTS if k not in optional), table


def test_verify_without_original_cannot_see_a_swap_but_with_it_can() -> None:
    stack = decoder_stack(6, (1, 3, 5))
    sched = msched.schedule(stack.gm, 2)
    fault = next(iter(inject("swap-writes", stack.gm, sched.original, 1)))
    with_original = msched.verify(fault.gm, original=sched.original)
    races = [v for v in with_original.of_kind("race") if v.hazard == "waw"]
    first, second = fault.site.split("|")
    assert any(v.nodes == (first, second) for v in races), with_original
    alone = msched.verify(fault.gm)  # the host order now says `second` comes first
    assert not any(set(v.nodes) == {first, second} for v in alone.violations), alone


def test_every_fault_is_detected_on_generated_graphs(
    record_property: Callable[[str, object], None],
) -> None:
    table: dict[str, list[int]] = {}
    missed: list[str] = []
    redundant: list[str] = []
    redundant_waits: list[str] = []

    @settings(max_examples=max(20, settings().max_examples // 5))
    @given(mst.graphs(min_nodes=2), mst.stream_counts())
    def run(gm: GraphModule, streams: int) -> None:
        sched = msched.schedule(gm, streams)
        missed.extend(run_faults(gm, sched.original, 3, table, redundant_waits))
        for site in redundant_record_streams(gm, sched.original):
            # Another alias of the same storage is recorded for the same stream: still safe.
            faulty = copy_module(gm)
            faulty.graph.erase_node(node_named(faulty, site))
            assert not msched.verify(faulty, original=sched.original).violations
            redundant.append(site)

    run()
    record_property("fault_detection", {f"{k} (generated)": v for k, v in table.items()})
    print(format_table(table))
    assert not redundant, f"record_stream emitted twice for one storage and stream: {redundant}"
    assert not redundant_waits, f"the emitter emitted waits another wait covers: {redundant_waits}"
    assert not missed, missed[:10]
    assert_every_fault_injected(table)
