"""What `test_sharded_compile` runs on each rank (module level, so that the ranks import it)."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import torch

import msched
from msched.analysis.collectives import collectives_in
from msched.models.decoders import TinyDecoder
from msched.models.parallel import TensorParallelDecoder


def compiled_tensor_parallel(
    rank: int, world_size: int, compiler: str, cache_dir: str
) -> dict[str, Any]:
    """`TensorParallelDecoder` of a 2-layer `TinyDecoder`, compiled with ``msched.backend(2,
    compiler=compiler)`` on this rank (its own cold Inductor cache), against eager: outputs,
    capture buffers, the collectives of the graph the backend compiled, the pieces' verdicts."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, f"rank{rank}")
    model = TinyDecoder(n_layers=2, hidden=8, capture_layers=(0, 1))
    sharded = TensorParallelDecoder(model, rank, world_size)
    x, capture = model.example_inputs(tokens=4)
    want_capture, full_capture, got_capture = capture.clone(), capture.clone(), capture.clone()
    with torch.no_grad():
        want = sharded(x, want_capture)
        full = model(x, full_capture)
        backend = msched.backend(num_streams=2, compiler=compiler)
        got = torch.compile(sharded, backend=backend)(x, got_capture)
    compiled_graph = backend.graphs[0].module
    return {
        "got": got,
        "want": want,
        "full": full,
        "got_capture": got_capture,
        "want_capture": want_capture,
        "full_capture": full_capture,
        "collectives": [  # packets under Dynamo ("inductor"), .default after AOT ("fx")
            str(n.target).removesuffix(".default")
            for n in compiled_graph.graph.nodes
            if "_c10d_functional" in str(n.target)
        ],
        "verified": [p.report is None or p.report.ok for p in backend.pieces],
        "kernel_collectives": [
            _issued(p.kernel_order) for p in backend.pieces if p.kernel_order is not None
        ],
    }


def _issued(program: Any) -> list[tuple[str, str | None, int | None]]:
    """The collectives of a kernel-order program in its order: op, group, issue position."""
    return [(c.op, c.group, c.node.meta.get("msched_issue")) for c in collectives_in(program.graph)]


def two_all_reduces(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    from torch.distributed import _functional_collectives as funcol

    a = funcol.all_reduce(x @ w1, "sum", "0")
    b = funcol.all_reduce(x @ w2, "sum", "0")
    return a + b


def traced_kernel_order_swapped(rank: int, world_size: int, cache_dir: str) -> dict[str, Any]:
    """``trace_streams(two_all_reduces, stage="inductor")`` on this rank, verified as it is,
    with its two all-reduces swapped in its `FinalOrder` (by hand, as a reordering pass
    would) and in the program itself."""
    from msched.compile import _inductor_internals as internals
    from msched.compile.kernel_order import kernel_order_program

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, f"rank{rank}")
    x, w1, w2 = torch.randn(4, 8), torch.randn(8, 8), torch.randn(8, 8)
    gm = msched.trace_streams(two_all_reduces, x, w1, w2, stage="inductor")
    nodes = [n.meta["msched_kernel"] for n in gm.graph.nodes if "msched_kernel" in n.meta]
    with internals.recording_final_orders() as orders:
        internals.compile_fx_uncached(_dynamo_graph(two_all_reduces, x, w1, w2), [x, w1, w2])
    order = orders[-1]
    issued = [i for i, n in enumerate(order.nodes) if n.comm_op.endswith("all_reduce_.default")]
    first, second = issued
    moved = list(order.nodes)
    moved.insert(second, moved.pop(first))  # the first all-reduce now after the second
    swapped = kernel_order_program(replace(order, nodes=tuple(moved)))
    found = {
        "ops": [n.comm_op for n in nodes if n.comm_op],
        "issued": _issued(gm),
        "ok": str(msched.verify(gm)),
        "swapped": [v.kind for v in msched.verify(swapped).violations],
    }
    ar = [c.node for c in collectives_in(gm.graph)]
    ar[1].append(ar[0])
    gm.recompile()
    return {**found, "edited": [v.kind for v in msched.verify(gm).violations]}


def traced_bucketed_all_reduces(rank: int, world_size: int, cache_dir: str) -> dict[str, Any]:
    """``trace_streams(two_all_reduces, stage="inductor")`` on this rank with Inductor's FX
    bucketing of all-reduces on (``bucket_all_reduces_fx="all"``): the collectives of the
    kernel order (op, group, issue position), the FX nodes their kernels came from, and the
    verdict."""
    from torch._inductor import config

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, f"rank{rank}")
    x, w1, w2 = torch.randn(4, 8), torch.randn(8, 8), torch.randn(8, 8)
    torch.compiler.reset()
    with config.patch(bucket_all_reduces_fx="all"):
        gm = msched.trace_streams(two_all_reduces, x, w1, w2, stage="inductor")
    kernels = [n.meta["msched_kernel"] for n in gm.graph.nodes if "msched_kernel" in n.meta]
    return {
        "issued": _issued(gm),
        "origins": [k.origins for k in kernels if k.comm_op.endswith("all_reduce_.default")],
        "ok": str(msched.verify(gm)),
    }


def _dynamo_graph(fn: Any, *inputs: Any) -> Any:
    """The graph Dynamo hands a backend for ``fn(*inputs)``."""
    found: list[Any] = []

    def keep(gm: Any, example_inputs: Any) -> Any:
        found.append(gm)
        return gm.forward

    torch.compiler.reset()
    torch.compile(fn, backend=keep, fullgraph=True)(*inputs)
    return found[0]


class CollectiveBlock(torch.nn.Module):
    """A tensor-parallel block of every out-of-place functional collective: ``all_reduce``,
    ``all_gather_tensor``, ``reduce_scatter_tensor``, ``all_to_all_single`` and
    ``all_reduce_coalesced`` (weights differ per rank)."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer("w1", torch.randn(8, 8, generator=g) + rank)
        self.register_buffer("w2", torch.randn(8, 8, generator=g) - rank)
        self.register_buffer("w3", torch.randn(8, 8, generator=g) * (rank + 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed import _functional_collectives as funcol

        a = x @ self.w1
        r = funcol.all_reduce(a, "sum", "0")
        b = x @ self.w2
        gathered = funcol.all_gather_tensor(b, 0, "0")
        scattered = funcol.reduce_scatter_tensor(gathered, "sum", 0, "0")
        a2a = funcol.all_to_all_single(r @ self.w3, None, None, "0")
        c1, c2 = funcol.all_reduce_coalesced([a + 1, b + 2], "sum", "0")
        return r + scattered + a2a + c1 + c2


def inductor_collective_block(
    rank: int, world_size: int, num_streams: int, cache_dir: str
) -> dict[str, Any]:
    """`CollectiveBlock` compiled with ``msched.backend(num_streams, compiler="inductor")``
    (verified: a violation in Inductor's final order raises) on this rank, against eager."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, f"rank{rank}")
    torch.manual_seed(rank)
    x = torch.randn(4, 8)
    block = CollectiveBlock(rank)
    with torch.no_grad():
        want = block(x)
        torch._dynamo.reset()
        backend = msched.backend(num_streams=num_streams, compiler="inductor")
        got = torch.compile(block, backend=backend, fullgraph=True)(x)
    return {
        "got": got,
        "want": want,
        "reports": [str(p.report) for p in backend.pieces],
        "verified": [p.report is not None and p.report.ok for p in backend.pieces],
        "streams": [_streams_used(p.kernel_order) for p in backend.pieces],
    }


def _streams_used(program: Any) -> int:
    """How many streams the kernels of a kernel-order program run on (the caller's too)."""
    return len(
        {
            (n.meta.get("custom") or {}).get("stream")
            for n in program.graph.nodes
            if n.op == "call_function"
        }
    )


class AsyncAllReduce(torch.nn.Module):
    """A block that all-reduces with ``async_op=True`` and ``Work.wait()``: Dynamo breaks
    its graph at both, so the all-reduce runs eagerly between two attention-free graphs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        y = x.sin() * 2
        work = dist.all_reduce(y, async_op=True)
        work.wait()
        return y.cos() + 1


def warnings_of_a_broken_graph(rank: int, world_size: int, compiler: str) -> dict[str, Any]:
    """`AsyncAllReduce` compiled piecewise with ``msched.backend(compiler=compiler)`` and run
    on three sizes (Dynamo compiles each of its two graphs again for dynamic sizes): the
    warnings it gives, the graphs it compiled, and whether it equals eager."""
    import warnings

    torch.manual_seed(rank)
    block = AsyncAllReduce()
    inputs = [torch.randn(n) for n in (4, 6, 7)]
    with torch.no_grad():
        want = [block(x.clone()) for x in inputs]
        torch._dynamo.reset()
        backend = msched.backend(num_streams=2, piecewise=True, compiler=compiler)
        compiled = torch.compile(block, backend=backend)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = [compiled(x.clone()) for x in inputs]
    return {
        "outside": [str(w.message) for w in caught if _is(w, "CollectiveOutsideGraphWarning")],
        "split": [str(w.message) for w in caught if _is(w, "SplitOpNotFoundWarning")],
        "graphs": len(backend.graphs),
        "equal": all(torch.allclose(g, w, atol=1e-6) for g, w in zip(got, want, strict=True)),
    }


def _is(caught: Any, name: str) -> bool:
    return type(caught.message).__name__ == name
