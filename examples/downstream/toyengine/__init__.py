"""toyengine: a tiny inference engine with its own stream ops and multi-stream pass.

Importing the package registers the ``toyeng`` op namespace (`toyengine.ops`).
"""

from toyengine import ops
from toyengine.multistream import schedule

__all__ = ["ops", "schedule"]
