"""Reading any stream program and proving it: dialects, happens-before, verify, execute.

Importing the package registers the built-in dialects that live in their own modules
(`msched.proof.dialects.register`): ``torch``, then ``autodeploy`` (after the registry's own
``msched`` and ``trtllm``).  The order of registration is the order messages list them in.
"""

from msched.proof import torch_streams  # noqa: F401  (registers the torch dialect)

# isort: split
from msched.proof import autodeploy_streams  # noqa: F401  (registers the autodeploy dialect)
