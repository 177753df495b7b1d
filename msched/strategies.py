"""Hypothesis strategies for FX graphs, under their first name: see `msched.testing.strategies`."""

from msched.testing.strategies import *  # noqa: F403
