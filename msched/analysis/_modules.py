"""What a ``call_module`` node runs, from the module's type (never from its path name).

A module called ``q_proj`` or ``fc1`` is an ``nn.Linear`` like any other; a path name says
what the model's author called it, the type says what runs.  `module_kind` gives the kind the
cost table prices (`msched.analysis.cost.OP_CATEGORIES`, or ``None`` for modules that run no
kernel) and `module_work` the FLOPs and bytes the roofline model needs, from the weight's
shape and the node's input and output shapes.
"""

from __future__ import annotations

import math
from typing import Any

from torch import nn
from torch.fx import Node

# Modules that launch no kernel: they return their input or a view of it.
_FREE = (nn.Identity, nn.Flatten, nn.Unflatten)
_MATMUL = (
    nn.Linear,
    nn.Bilinear,
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
)
_ATTENTION = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)
# Kinds named by a class name, for module types torch does not define (``FusedLinear``).
_CLASS_WORDS = (
    ("moe", ("moe", "expert")),
    ("attention", ("attention", "attn")),
    ("matmul", ("linear", "conv", "gemm", "matmul")),
)


def called_module(node: Node) -> nn.Module | None:
    """The module a ``call_module`` node calls, or None (not found, or not a call_module)."""
    if node.op != "call_module":
        return None
    owner = node.graph.owning_module
    if owner is None:
        return None
    try:
        return owner.get_submodule(str(node.target))
    except AttributeError:
        return None


def module_kind(module: nn.Module) -> str | None:
    """The cost kind of ``module``'s type: ``"matmul"``, ``"attention"``, ``"moe"``,
    ``"other"``, or None for the modules that run no kernel (`_FREE`)."""
    if isinstance(module, _FREE):
        return None
    if isinstance(module, _MATMUL):
        return "matmul"
    if isinstance(module, _ATTENTION):
        return "attention"
    if type(module).__module__.startswith("torch.nn"):
        return "other"  # embeddings, norms, activations, pooling, dropout, ...
    name = type(module).__name__.lower()
    for kind, words in _CLASS_WORDS:
        if any(w in name for w in words):
            return kind
    return "other"


def module_work(module: nn.Module, node: Node, out: Any, inputs: list[Any]) -> float:
    """FLOPs of one call of ``module`` on ``node``: ``2 * outputs * contracted`` for linear
    and convolution layers (contracted: input features, or input channels per group times
    the kernel's size), 0 for the rest (memory-bound: the bytes decide)."""
    if out is None:
        return 0.0
    outputs = float(math.prod(out[0]))
    if isinstance(module, (nn.Linear, nn.Bilinear)):
        contracted = module.in_features if isinstance(module, nn.Linear) else module.in1_features
        return 2.0 * outputs * contracted
    if isinstance(module, nn.modules.conv._ConvNd):
        kernel = float(math.prod(module.kernel_size))
        return 2.0 * outputs * (module.in_channels / module.groups) * kernel
    return 0.0


def weight_bytes(module: nn.Module) -> float:
    """Bytes of the module's own parameters and buffers (read once per call)."""
    tensors = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
    return float(sum(t.numel() * t.element_size() for t in tensors))
