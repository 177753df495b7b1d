"""The reference models' custom ops under their former path: see `msched.models.reference_ops`
(importing either registers them)."""

from msched.models.reference_ops import *  # noqa: F403
from msched.models.reference_ops import attention, inplace_slice_copy, moe_experts

__all__ = ["attention", "inplace_slice_copy", "moe_experts"]
