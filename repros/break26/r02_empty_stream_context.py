"""break26 r02 (severity: crash; fixed in 7e7417b).

The same decoder as r01 with 2 layers, ``msched.backend(num_streams=2, compiler="inductor")``,
on CPU.

Observed (before the fix): ``InductorError: RuntimeError: Failed to import .../<hash>.py
IndentationError: expected an indented block after 'with' statement``.  On CPU Inductor
writes a kernel's call when its C++ kernel group is flushed (at an extern call or a device
change), not where the kernel's stream context was entered, so consecutive kernels on two
streams left ``with stream1:`` with nothing under it::

        with stream1:
        with default_stream:
            buf253 = empty_strided_cpu(...)
            cpp_fused_clone_copy__expand_..._14(...)

Expected: the module imports and runs (CPU streams are no-ops), outputs equal eager.  After
the fix every stream context opens with ``pass``.
Run: PYTHONPATH=<worktree>:repros/break26 python repros/break26/r02_empty_stream_context.py
"""

from r01_kv_cache_guard import main

if __name__ == "__main__":
    main(layers=2)
