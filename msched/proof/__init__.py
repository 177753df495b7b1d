"""Reading any stream program and proving it: dialects, happens-before, verify, execute.

`BUILTIN_DIALECT_MODULES` is the one list of the modules that define a built-in dialect
(each calls `msched.proof.dialects.register` when it is imported); importing this package
imports them, in that order.  ``msched`` and ``trtllm`` are registered by
`msched.proof.dialects` itself, first; then ``torch``, then ``autodeploy``.  The order of
registration is the order messages list the dialects in.  A new built-in dialect is a module
that calls ``register`` and one line here; ``tests/msched/proof/test_builtin_dialects.py``
fails when a module registers a dialect without being listed.
"""

import importlib

BUILTIN_DIALECT_MODULES = (
    "msched.proof.torch_streams",
    "msched.proof.autodeploy_streams",
)

for _module in BUILTIN_DIALECT_MODULES:
    importlib.import_module(_module)
del _module
