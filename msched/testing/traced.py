"""`trace_decoder`: a `TinyDecoder` compiled with `msched.backend`, with eager references.

The plain logic behind the ``traced_decoder`` fixture of the pytest plugin: it works without
pytest.  Besides the scheduled pieces it records what each piece was called with, so a test
can run a piece again on its own, for example with `msched.proof.executor.execute` in an
adversarial stream order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from msched.compile.compiler import MschedBackend, Piece, backend, compile_and_run
from msched.errors import InvalidArgumentError
from msched.models.decoders import TinyDecoder


@dataclass(frozen=True)
class TracedDecoder:
    """A `TinyDecoder` compiled with `msched.backend`, run once more, next to an eager run.

    ``output`` / ``capture`` come from the compiled model, ``reference_output`` /
    ``reference_capture`` from the eager model on the same inputs; ``piece_inputs[name]``
    holds clones of what piece ``name`` was called with in that compiled run (in placeholder
    order).  ``pieces`` are the pieces of that run; ``backend`` is the
    `msched.compile.compiler.MschedBackend` that compiled them (a later recompile adds to it).
    """

    model: TinyDecoder
    backend: MschedBackend
    pieces: tuple[Piece, ...]
    compiled: Callable[..., Any]
    num_streams: int
    piecewise: bool
    inputs: tuple[Tensor, Tensor]
    output: Tensor
    capture: Tensor
    reference_output: Tensor
    reference_capture: Tensor
    piece_inputs: dict[str, tuple[Any, ...]]

    def piece_capturing(self, layer: int) -> Piece:
        """The piece that holds the capture of ``layer`` (found by its column range)."""
        start, end = self.model.capture_slice(layer)
        for piece in self.pieces:
            for node in piece.gm.graph.nodes:
                if node.target is torch.ops.msched.inplace_slice_copy.default and tuple(
                    node.args[2:4]
                ) == (start, end):
                    return piece
        raise InvalidArgumentError(f"no piece captures layer {layer}")


def trace_decoder(
    num_streams: int,
    *,
    piecewise: bool = True,
    moe: bool = False,
    n_layers: int = 12,
    capture_layers: Sequence[int] = (1, 5, 11),
    hidden: int = 16,
    tokens: int = 8,
    seed: int = 0,
    **backend_kwargs: Any,
) -> TracedDecoder:
    """Compile a `TinyDecoder` with ``msched.backend(num_streams, piecewise, ...)``.

    1. Build the model from ``seed``; run it eagerly on fresh inputs (the reference).
    2. Compile and run it once (`msched.compile.compiler.compile_and_run`, which resets dynamo).
    3. Run the compiled model again on fresh inputs, recording every piece's inputs.
    """
    model = TinyDecoder(n_layers, hidden, capture_layers, moe=moe, seed=seed)
    ref_out, ref_capture = _run_eagerly(model, tokens)
    b = backend(num_streams=num_streams, piecewise=piecewise, **backend_kwargs)
    _, compiled = compile_and_run(model, model.example_inputs(tokens), b)
    x, capture = model.example_inputs(tokens)
    with torch.no_grad(), record_piece_inputs(b.pieces) as seen:
        out = compiled(x, capture)
    return TracedDecoder(
        model=model,
        backend=b,
        pieces=b.pieces,
        compiled=compiled,
        num_streams=num_streams,
        piecewise=piecewise,
        inputs=model.example_inputs(tokens),
        output=out,
        capture=capture,
        reference_output=ref_out,
        reference_capture=ref_capture,
        piece_inputs=seen,
    )


def _run_eagerly(model: TinyDecoder, tokens: int) -> tuple[Tensor, Tensor]:
    """The output and the capture buffer of ``model`` run eagerly on fresh inputs."""
    x, capture = model.example_inputs(tokens)
    with torch.no_grad():
        return model(x, capture), capture


def _clone(value: Any) -> Any:
    return value.clone() if isinstance(value, Tensor) else value


@contextlib.contextmanager
def record_piece_inputs(pieces: Sequence[Piece]) -> Iterator[dict[str, tuple[Any, ...]]]:
    """Within the block, record (clones of) the arguments each piece is called with.

    Yields a dict that maps a piece's name to the arguments of its latest call.
    """
    seen: dict[str, tuple[Any, ...]] = {}
    handles = []
    for piece in pieces:

        def hook(module: Any, args: tuple[Any, ...], name: str = piece.name) -> None:
            seen[name] = tuple(_clone(a) for a in args)

        handles.append(piece.gm.register_forward_pre_hook(hook))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()
