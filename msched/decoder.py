"""The reference decoder stacks, under their first name: see `msched.models.decoders`."""

from msched.models.decoders import *  # noqa: F403
from msched.models.decoders import DecoderStack, TinyDecoder, decoder_stack

__all__ = ["DecoderStack", "TinyDecoder", "decoder_stack"]
