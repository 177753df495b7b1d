"""The reference decoder stacks under their former path: see `msched.models.decoders`."""

from msched.models.decoders import *  # noqa: F403
from msched.models.decoders import CAPTURE_SCHEMA, DecoderStack, TinyDecoder, decoder_stack

__all__ = ["CAPTURE_SCHEMA", "DecoderStack", "TinyDecoder", "decoder_stack"]
