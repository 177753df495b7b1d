"""The private TorchInductor interfaces msched uses exist in this torch (2.13 and 2.14 in CI).

When one changes, this test names it and the torch version: update
`msched.compile._inductor_internals` (and only it) for the new release.
"""

from __future__ import annotations

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
    assert internals._has("torch._inductor.scheduler", "Scheduler.node_to_stream")
    assert not internals._has("torch._inductor.scheduler", "Scheduler.codegen_nonexistent")
