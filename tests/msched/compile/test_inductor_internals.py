"""The private TorchInductor interfaces msched uses exist in this torch (2.13 and 2.14 in CI).

When one changes, this test names it and the torch version: update
`msched.compile._inductor_internals` (and only it) for the new release.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from msched.compile import _inductor_internals as internals
from msched.errors import InductorInterfaceError


def test_every_private_interface_exists() -> None:
    missing = internals.missing_interfaces()
    assert not missing, (
        f"torch {torch.__version__} lacks Inductor interfaces msched uses: {', '.join(missing)}"
    )


def test_a_missing_interface_is_named_with_the_torch_version(monkeypatch) -> None:
    gone = ("torch._inductor.scheduler", "Scheduler.no_such_thing")
    monkeypatch.setattr(internals, "INTERFACES", (*internals.INTERFACES, gone))
    internals.missing_interfaces.cache_clear()
    try:
        with pytest.raises(InductorInterfaceError) as raised:
            internals.require_interfaces()
    finally:
        internals.missing_interfaces.cache_clear()
    message = str(raised.value)
    assert "torch._inductor.scheduler.Scheduler.no_such_thing" in message
    assert torch.__version__ in message


def test_instance_attributes_are_checked_on_their_class_source() -> None:
    assert internals.attribute_exists("torch._inductor.scheduler", "Scheduler.node_to_stream")
    assert not internals.attribute_exists(
        "torch._inductor.scheduler", "Scheduler.codegen_nonexistent"
    )


class _Node:
    """A scheduler node as `_cross_stream_buffers` reads it: what it makes and reads."""

    def __init__(self, makes: str, reads: tuple[str, ...]) -> None:
        self.makes = makes
        self.read_writes = SimpleNamespace(reads=[SimpleNamespace(name=r) for r in reads])

    def get_nodes(self) -> list[_Node]:
        return [self]

    def get_buffer_names(self) -> list[str]:
        return [self.makes]


def test_a_buffer_read_on_another_stream_under_a_mutation_name_is_never_reused() -> None:
    # The KV cache pattern: buf57 = clone(cache) and buf58 = index_put into it on stream 1,
    # then the write-back copy_ on stream 0 reads buf58.  The wrapper frees buf57 (the
    # allocation): the guard must keep it, or stream 0 may read memory stream 1 reuses.
    made, written = _Node("buf57", ("arg6_1",)), _Node("buf58", ("buf57",))
    copy_back = _Node("buf85", ("buf58", "arg6_1"))
    scheduler = SimpleNamespace(
        nodes=[made, written, copy_back],
        node_to_stream={made: 1, written: 1, copy_back: 0},
        mutation_real_name={"buf58": "buf57"},
    )
    assert internals._cross_stream_buffers(scheduler) == {"buf57", "buf58"}


def test_a_stream_context_the_cpu_backend_leaves_empty_still_compiles() -> None:
    # On CPU a kernel's call is written when its C++ kernel group is flushed, so a stream
    # context can be entered and left with nothing in it: the module failed to import.
    from torch._inductor.codegen.wrapper import (
        EnterCudaStreamContextLine,
        ExitCudaStreamContextLine,
    )
    from torch._inductor.utils import IndentedBuffer
    from torch._inductor.virtualized import V

    code = IndentedBuffer(initial_indent=1)
    with (
        internals.recording_final_orders(),
        V.set_graph_handler(SimpleNamespace(cpp_wrapper=False)),
    ):
        for stream in (1, 0):
            EnterCudaStreamContextLine(stream_idx=stream).codegen(code)
            ExitCudaStreamContextLine().codegen(code)
    compile("def call():\n" + code.getvalue() + "    return None\n", "<wrapper>", "exec")
