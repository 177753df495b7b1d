"""The reference models: decoder stacks, `TinyDecoder` and the custom ops they call.

The lowest subpackage above the top layer: it imports only ``msched.errors``,
``msched.limits``, ``msched._torch_internals`` and ``msched._lazy`` (`tests/msched/test_layout.py`),
so the CLI, the pytest plugin and the test helpers (`msched.testing`) can all build on it.
"""

from __future__ import annotations

from msched.models.decoders import CAPTURE_SCHEMA, DecoderStack, TinyDecoder, decoder_stack

__all__ = ["CAPTURE_SCHEMA", "DecoderStack", "TinyDecoder", "decoder_stack"]
