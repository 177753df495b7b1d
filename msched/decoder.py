"""The reference decoder stacks, under their first name: see `msched.testing.decoders`."""

from msched.testing.decoders import *  # noqa: F403
from msched.testing.decoders import DecoderStack, TinyDecoder, decoder_stack

__all__ = ["DecoderStack", "TinyDecoder", "decoder_stack"]
