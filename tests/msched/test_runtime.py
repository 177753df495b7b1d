"""`msched.runtime.StreamRuntime`: no-ops on CPU; on CUDA (a fake ``torch.cuda`` here) real
streams and events per runtime, created lazily, with stream 0 the caller's stream."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import msched
from msched.models.decoders import decoder_stack
from msched.runtime import StreamRuntime, current_runtime


class FakeStream:
    def __init__(self, api: FakeCuda, name: str, device: Any = "cuda:0") -> None:
        self.api, self.name, self.device = api, name, device

    def wait_event(self, event: FakeEvent) -> None:
        self.api.log.append(("wait", self.name, event.name, event.last))

    def __repr__(self) -> str:
        return self.name


class FakeEvent:
    def __init__(self, api: FakeCuda, name: str) -> None:
        self.api, self.name = api, name
        self.last: str | None = None

    def record(self, stream: FakeStream) -> None:
        self.last = stream.name
        self.api.log.append(("record", stream.name, self.name))


class FakeCuda:
    """The part of ``torch.cuda`` a StreamRuntime uses, recording every call."""

    def __init__(self, available: bool = True) -> None:
        self.available = available
        self.current = FakeStream(self, "caller")
        self.log: list[tuple[Any, ...]] = []
        self.streams: list[FakeStream] = []
        self.events: list[FakeEvent] = []

    def is_available(self) -> bool:
        return self.available

    def current_stream(self) -> FakeStream:
        return self.current

    def set_stream(self, stream: FakeStream) -> None:
        self.current = stream
        self.log.append(("set", stream.name))

    def Stream(self, device: Any = None) -> FakeStream:  # noqa: N802 (torch.cuda's name)
        stream = FakeStream(self, f"aux{len(self.streams) + 1}", device)
        self.streams.append(stream)
        return stream

    def Event(self) -> FakeEvent:  # noqa: N802
        event = FakeEvent(self, f"e{len(self.events)}")
        self.events.append(event)
        return event


def test_cpu_runtime_does_nothing() -> None:
    api = FakeCuda(available=False)
    rt = StreamRuntime(api)
    with rt.active():
        rt.set_stream(2)
        rt.record_event(0)
        rt.wait_event(0)
        rt.record_stream(torch.zeros(1), 1)
    assert api.log == [] and rt.num_streams_created == 0 and rt.num_events_created == 0


def test_stream_ops_are_noops_on_this_machine_without_cuda() -> None:
    rt = StreamRuntime()
    assert rt.enabled() is torch.cuda.is_available()
    if rt.enabled():
        pytest.skip("this machine has CUDA")
    with rt.active():
        msched.ops.set_stream(1)
        msched.ops.record_event(3)
        msched.ops.wait_event(3)
        msched.ops.record_stream(torch.ones(2), 1)
        msched.ops.set_stream(0)
    assert rt.num_streams_created == 0 and rt.num_events_created == 0


def test_streams_and_events_are_created_lazily_and_stream_0_is_the_caller() -> None:
    api = FakeCuda()
    rt = StreamRuntime(api)
    with rt.active():
        assert rt.num_streams_created == 0 and rt.num_events_created == 0
        rt.record_event(0)  # entry event on stream 0
        rt.set_stream(2)
        rt.wait_event(0)
        rt.record_event(1)
        rt.set_stream(0)
        rt.wait_event(1)
    assert api.log == [
        ("record", "caller", "e0"),
        ("set", "aux1"),
        ("wait", "aux1", "e0", "caller"),
        ("record", "aux1", "e1"),
        ("set", "caller"),
        ("wait", "caller", "e1", "aux1"),
    ]
    assert rt.num_streams_created == 1 and rt.num_events_created == 2
    assert api.current.name == "caller"


def test_a_second_call_reuses_streams_and_events() -> None:
    api = FakeCuda()
    rt = StreamRuntime(api)
    for _ in range(2):
        with rt.active():
            rt.set_stream(1)
            rt.record_event(0)
            rt.set_stream(0)
            rt.wait_event(0)
    assert len(api.streams) == 1 and len(api.events) == 1


def test_stream_0_follows_the_callers_stream_at_each_call() -> None:
    api = FakeCuda()
    rt = StreamRuntime(api)
    other = FakeStream(api, "other")
    api.current = other
    with rt.active():
        rt.set_stream(1)
        rt.set_stream(0)
        assert api.current is other
    assert api.current is other


def test_leaving_the_block_restores_the_callers_stream_after_an_error() -> None:
    api = FakeCuda()
    rt = StreamRuntime(api)
    caller = api.current
    with pytest.raises(RuntimeError), rt.active():
        rt.set_stream(1)
        raise RuntimeError("kernel failed")
    assert api.current is caller and current_runtime() is not rt


def test_two_runtimes_one_after_another_own_their_streams() -> None:
    api = FakeCuda()
    first, second = StreamRuntime(api), StreamRuntime(api)
    for rt in (first, second, first):
        with rt.active():
            assert current_runtime() is rt
            rt.set_stream(1)
            rt.record_event(0)
            rt.set_stream(0)
            rt.wait_event(0)
        assert api.current.name == "caller"
    assert [s.name for s in api.streams] == ["aux1", "aux2"]  # one per runtime, reused
    assert first.num_streams_created == 1 and second.num_streams_created == 1


def test_nested_activation_restores_the_outer_runtime() -> None:
    api = FakeCuda()
    outer, inner = StreamRuntime(api), StreamRuntime(api)
    with outer.active():
        outer.set_stream(1)
        with inner.active():
            assert current_runtime() is inner
            inner.set_stream(1)
            inner.set_stream(0)
            assert api.current.name == "aux1"  # inner's stream 0 is outer's stream 1
        assert current_runtime() is outer
        outer.set_stream(0)
    assert api.current.name == "caller"


def test_without_activation_the_default_runtime_captures_the_caller_lazily() -> None:
    api = FakeCuda()
    rt = StreamRuntime(api)
    rt.set_stream(1)
    assert api.current.name == "aux1"
    rt.set_stream(0)
    assert api.current.name == "caller"
    api.current = FakeStream(api, "later")
    rt.set_stream(1)
    rt.set_stream(0)
    assert api.current.name == "later"


def test_record_stream_only_touches_cuda_tensors() -> None:
    api = FakeCuda()
    rt = StreamRuntime(api)
    marked: list[Any] = []

    class CudaLike:
        is_cuda = True

        def record_stream(self, stream: Any) -> None:
            marked.append(stream)

    with rt.active():
        rt.record_stream(torch.zeros(1), 1)
        rt.record_stream(CudaLike(), 1)  # type: ignore[arg-type]
    assert [s.name for s in marked] == ["aux1"]


def test_a_scheduled_graph_drives_the_runtime_consistently() -> None:
    stack = decoder_stack(n_layers=6, capture_layers=(1, 3, 5), moe=True)
    sched = msched.schedule(stack.gm, 3)
    api = FakeCuda()
    rt = StreamRuntime(api)
    for _ in range(2):
        with rt.active():
            stack.gm(*stack.example_inputs())
    event_ids = {n.args[0] for n in stack.gm.graph.nodes if n.target is msched.ops.record_event}
    for n in stack.gm.graph.nodes:  # the records of switches that record
        if n.target is msched.ops.set_stream and len(n.args) > 2:
            event_ids.update(n.args[2])  # type: ignore[arg-type]
    assert rt.num_events_created == len(event_ids) == sched.num_events
    used = {n.args[0] for n in stack.gm.graph.nodes if n.target is msched.ops.set_stream}
    assert rt.num_streams_created == len(used - {0})
    assert api.current.name == "caller"
    waits = [entry for entry in api.log if entry[0] == "wait"]
    assert waits and all(last is not None for *_, last in waits)  # recorded before waited


def test_a_switch_that_waits_waits_on_the_new_stream_for_each_event() -> None:
    api = FakeCuda()
    rt = StreamRuntime(api)
    with rt.active():
        rt.record_event(0)
        rt.set_stream(1, [0])
        rt.record_event(1)
        rt.set_stream(0, [1, 0])
        msched.ops.set_stream(1, [1])  # the op, through the active runtime
    assert api.log == [
        ("record", "caller", "e0"),
        ("wait", "aux1", "e0", "caller"),
        ("set", "aux1"),
        ("record", "aux1", "e1"),
        ("wait", "caller", "e1", "aux1"),
        ("wait", "caller", "e0", "caller"),
        ("set", "caller"),
        ("wait", "aux1", "e1", "aux1"),
        ("set", "aux1"),
        ("set", "caller"),  # leaving the block
    ]


def test_a_switch_that_records_records_on_the_old_stream_then_switches_then_waits() -> None:
    api = FakeCuda()
    rt = StreamRuntime(api)
    with rt.active():
        rt.set_stream(1, [], [0])  # record e0 on the caller's stream, then switch
        rt.set_stream(2, [0], [1, 2])  # e1, e2 on aux1; aux2 waits for e0
        msched.ops.set_stream(0, [1], [3])  # the op, through the active runtime
    assert api.log == [
        ("record", "caller", "e0"),
        ("set", "aux1"),
        ("record", "aux1", "e1"),
        ("record", "aux1", "e2"),
        ("wait", "aux2", "e0", "caller"),
        ("set", "aux2"),
        ("record", "aux2", "e3"),
        ("wait", "caller", "e1", "aux1"),
        ("set", "caller"),
    ]
