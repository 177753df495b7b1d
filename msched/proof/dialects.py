"""Reading the stream ops of a scheduled graph: dialects and the host-order interpreter.

The names of this path, from their homes:

- `Dialect`, the four-op shape (`FOUR_OPS`, `FOUR_OP_READERS`) and `target_key`:
  `msched.proof._dialect`;
- `Step`, `StreamProgram`: `msched.proof._program`;
- `interpret`: `msched.proof._interpreter`;
- `as_dialect`, `builtin_dialects`, `detect_dialect`, `describe_key`, and the mark of a graph
  msched made (`mark_made`, `made_in`, `MADE_META`, `uses_ops_of`): `msched.proof._registry`,
  where each dialect module registers its dialect (``torch``: `msched.proof.torch_streams`,
  ``autodeploy``: `msched.proof.engines`; `CALLER_META` is the torch dialect's).

A `Dialect` maps each node of a graph to actions on the host timeline
(`msched.proof.actions`); `interpret` walks a graph in host order and returns, for every
node, the stream it is issued on and its actions as `Step`s (a `StreamProgram`);
`msched.proof.clocks` turns that program into happens-before.
"""

from __future__ import annotations

from msched.proof._dialect import FOUR_OP_READERS, FOUR_OPS, Dialect, target_key
from msched.proof._interpreter import interpret
from msched.proof._program import Step, StreamProgram
from msched.proof._registry import (
    MADE_META,
    as_dialect,
    builtin_dialects,
    describe_key,
    detect_dialect,
    made_in,
    mark_made,
    uses_ops_of,
)
from msched.proof.torch_streams import CALLER_META

__all__ = [
    "CALLER_META",
    "FOUR_OPS",
    "FOUR_OP_READERS",
    "MADE_META",
    "Dialect",
    "Step",
    "StreamProgram",
    "as_dialect",
    "builtin_dialects",
    "describe_key",
    "detect_dialect",
    "interpret",
    "made_in",
    "mark_made",
    "target_key",
    "uses_ops_of",
]
