"""Several streams waiting on one event (pytorch#193409: Inductor orders only the first
consumer after its wait) through `msched.trace_streams(stage="inductor")`.

User code records one event on the caller's stream after ``h = x @ w`` and two side streams
wait on it, each then computing from ``h``.  `msched.verify` of Inductor's final kernel order
must be ok exactly when that order puts every consumer after its stream's wait.  On CPU,
torch 2.13.0 and 2.14.1 both order the two consumers right (checked here independently of
`verify`, from the program's steps); the hand-edited orders below are the misorders the issue
describes (a consumer hoisted in front of its wait), and `verify` reports each as a race
naming the kernel.
"""

from __future__ import annotations

import pytest
import torch
from torch.fx import GraphModule, Node

import msched
from msched.proof.interpreter import interpret

s1 = torch.Stream(device="cpu")
s2 = torch.Stream(device="cpu")
ready = torch.Event(device="cpu")
done1 = torch.Event(device="cpu")
done2 = torch.Event(device="cpu")


def two_waiters(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    caller = torch.accelerator.current_stream()
    h = x @ w
    ready.record(caller)
    ready.wait(s1)
    ready.wait(s2)
    with s1:
        a = (h.sin() @ w).relu()
    with s2:
        b = (h.cos() @ w).neg()
    done1.record(s1)
    done2.record(s2)
    done1.wait(caller)
    done2.wait(caller)
    return a + b


@pytest.fixture(scope="module")
def kernel_order() -> GraphModule:
    return msched.trace_streams(two_waiters, torch.randn(8, 8), torch.randn(8, 8), stage="inductor")


def _first_kernel_after_wait(gm: GraphModule) -> dict[int, tuple[Node, Node]]:
    """Side stream -> (its wait on the shared event, its first kernel), in host order."""
    program = interpret(gm)
    waits: dict[int, Node] = {}
    found: dict[int, tuple[Node, Node]] = {}
    for step in program.steps:
        s = step.stream
        if step.kind == "wait_event" and s != 0 and s not in waits:
            waits[s] = step.node
        elif step.kind == "compute" and s != 0 and s not in found and step.node.args:
            found[s] = (waits.get(s, step.node), step.node)
    return found


def _every_consumer_after_its_wait(gm: GraphModule) -> bool:
    """Read off the steps, not through `verify`: each side stream's first kernel comes after
    a wait of that stream on an event recorded on stream 0."""
    program = interpret(gm)
    recorded_on_0: set[int | None] = set()
    joined: set[int] = set()
    for step in program.steps:
        if step.kind == "record_event" and step.stream == 0:
            recorded_on_0.add(step.event)
        elif step.kind == "wait_event" and step.event in recorded_on_0:
            joined.add(step.stream)
        elif step.kind == "compute" and step.stream != 0 and step.node.args:
            if step.stream not in joined:
                return False
    return True


def test_both_consumers_of_one_event_are_ordered_after_their_waits(kernel_order) -> None:
    program = interpret(kernel_order)
    assert program.num_streams == 3
    waits = [s for s in program.steps if s.kind == "wait_event" and s.stream != 0]
    assert {w.stream for w in waits} == {1, 2} and len({w.event for w in waits}) == 1
    assert _every_consumer_after_its_wait(kernel_order)  # what torch 2.13 and 2.14 emit
    report = msched.verify(kernel_order, cuda_graph=True)
    assert report.ok, str(report)


def _hoisted(gm: GraphModule, stream: int) -> tuple[GraphModule, str]:
    """A copy of ``gm`` with ``stream``'s first kernel (and the getitems of its results)
    moved in front of that stream's wait: the misorder of pytorch#193409."""
    import copy

    edited = copy.deepcopy(gm)
    wait, kernel = _first_kernel_after_wait(edited)[stream]
    items = [u for u in kernel.users if u.op == "call_function"]
    wait.prepend(kernel)
    for item in items:
        wait.prepend(item)
    edited.recompile()
    return edited, kernel.name


@pytest.mark.parametrize("stream", [1, 2], ids=["first-waiter", "second-waiter"])
def test_a_consumer_hoisted_in_front_of_its_wait_is_a_race(kernel_order, stream: int) -> None:
    edited, name = _hoisted(kernel_order, stream)
    assert not _every_consumer_after_its_wait(edited)
    report = msched.verify(edited)
    races = [v for v in report.of_kind("race") if name in v.nodes]
    assert races, str(report)
    assert all(v.streams[-1] == stream for v in races)
    assert f"stream {stream} starts with `{name}` without joining stream 0" in races[0].message
