"""What `test_sharded_compile` runs on each rank (module level, so that the ranks import it)."""

from __future__ import annotations

import os
from typing import Any

import torch

import msched
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
    }
