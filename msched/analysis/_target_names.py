"""The name tables behind `msched.analysis._targets`: which Python operators, ``torch.Tensor``
methods, ``torch.nn.functional`` functions, ``torch.nn`` modules and aten ops are pure, views,
possible aliases, in-place, random or not tensor data at all.

Plain data, kept apart from the rules that read it (`msched.analysis._targets`) so that each
list can be read and extended on its own.
"""

from __future__ import annotations

import builtins
import math
import operator

import torch.nn as nn

INPLACE_OPERATORS = frozenset(
    {
        operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv,
        operator.ifloordiv, operator.imod, operator.ipow, operator.iand, operator.ior,
        operator.ixor, operator.ilshift, operator.irshift, operator.imatmul,
    }
)  # fmt: skip

# Python functions that read their arguments and return a new value (tensor operators call
# the non-in-place dunder methods of torch.Tensor).
PURE_PYTHON = frozenset(
    {
        operator.getitem, operator.add, operator.sub, operator.mul, operator.truediv,
        operator.floordiv, operator.mod, operator.pow, operator.neg, operator.pos,
        operator.abs, operator.invert,
        operator.matmul, operator.eq, operator.ne, operator.lt, operator.le, operator.gt,
        operator.ge, operator.and_, operator.or_, operator.xor, operator.not_,
        operator.lshift, operator.rshift, operator.truth, operator.contains, operator.index,
        builtins.len, builtins.int, builtins.float, builtins.bool, builtins.abs, builtins.min,
        builtins.max, builtins.isinstance, math.sqrt, math.ceil, math.floor, math.prod,
        math.log, math.exp,
    }
)  # fmt: skip

# True views: the result always shares its first input's storage.
VIEW_NAMES = frozenset(
    {
        "view", "view_as", "t", "transpose", "permute", "expand", "expand_as", "narrow",
        "select", "unsqueeze", "squeeze", "as_strided", "unfold", "diagonal", "split",
        "split_with_sizes", "chunk", "unbind", "detach", "movedim", "moveaxis", "swapaxes",
        "swapdims", "alias", "real", "imag", "view_as_real", "view_as_complex", "__getitem__",
        "tensor_split", "hsplit", "vsplit", "dsplit", "broadcast_to", "T", "mT", "H", "mH",
        "data", "adjoint", "positive", "slice", "_unsafe_view", "_reshape_alias",
    }
)  # fmt: skip

# May return their input itself (or a view of it) or a new tensor, depending on dtype, device,
# layout or strides: their result is its own storage that may also be the input's.
MAYBE_ALIAS_NAMES = frozenset(
    {
        "reshape", "reshape_as", "contiguous", "flatten", "unflatten", "ravel", "to", "type",
        "type_as", "float", "double", "half", "bfloat16", "int", "long", "short", "char",
        "byte", "bool", "cfloat", "cdouble", "cpu", "cuda", "clone_if_needed",
    }
)  # fmt: skip

# Methods and attributes whose value is not tensor data (they read at most metadata).
NON_TENSOR_NAMES = frozenset(
    {
        "size", "dim", "numel", "item", "tolist", "stride", "data_ptr", "element_size",
        "__len__", "is_contiguous", "is_floating_point", "is_complex", "get_device",
        "nelement", "ndimension", "storage_offset", "shape", "dtype", "device", "ndim",
        "is_cuda", "layout", "requires_grad", "is_leaf", "names", "itemsize", "nbytes",
        "__bool__", "__index__", "__int__", "__float__",
    }
)  # fmt: skip

# Tensor operator methods that return a new tensor.
PURE_DUNDERS = frozenset(
    {
        "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
        "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__",
        "__rpow__", "__matmul__", "__rmatmul__", "__neg__", "__pos__", "__abs__",
        "__invert__", "__and__", "__rand__", "__or__", "__ror__", "__xor__", "__rxor__",
        "__lshift__", "__rshift__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
    }
)  # fmt: skip

# In-place operator methods: write ``self`` and return it.
INPLACE_DUNDERS = frozenset(
    {
        "__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
        "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__",
        "__irshift__", "__imatmul__",
    }
)  # fmt: skip

# torch.nn.functional functions that read their inputs and return new tensors (with
# ``inplace=True`` where they have it, they write their first input instead).
PURE_FUNCTIONAL = frozenset(
    {
        "relu", "relu6", "elu", "selu", "celu", "leaky_relu", "hardtanh", "hardswish",
        "hardsigmoid", "silu", "mish", "gelu", "softmax", "log_softmax", "softmin",
        "softplus", "softsign", "tanh", "sigmoid", "logsigmoid", "tanhshrink", "hardshrink",
        "softshrink", "glu", "threshold", "layer_norm", "group_norm", "rms_norm",
        "local_response_norm", "normalize", "linear", "bilinear", "pad", "interpolate",
        "scaled_dot_product_attention", "one_hot", "cosine_similarity", "pairwise_distance",
        "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
        "conv_transpose3d", "avg_pool1d", "avg_pool2d", "avg_pool3d", "max_pool1d",
        "max_pool2d", "max_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
        "adaptive_max_pool1d", "adaptive_max_pool2d", "cross_entropy", "nll_loss",
        "mse_loss", "l1_loss", "smooth_l1_loss", "binary_cross_entropy",
        "binary_cross_entropy_with_logits", "kl_div", "prelu", "pixel_shuffle",
        "pixel_unshuffle", "grid_sample", "affine_grid", "unfold", "fold",
    }
)  # fmt: skip
# torch.nn.functional functions that draw random numbers (they advance the RNG state).
RANDOM_FUNCTIONAL = frozenset(
    {
        "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
        "feature_alpha_dropout", "rrelu", "gumbel_softmax", "fractional_max_pool2d",
        "fractional_max_pool3d",
    }
)  # fmt: skip

# Module types whose forward reads its inputs and parameters and returns new tensors (exact
# types: a subclass may override forward).  ``inplace`` attributes are honoured.
PURE_MODULES: frozenset[type] = frozenset(
    {
        nn.Linear, nn.Bilinear, nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, nn.LocalResponseNorm,
        nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
        nn.ConvTranspose3d, nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Mish, nn.Tanh,
        nn.Sigmoid, nn.Softmax, nn.LogSoftmax, nn.Softmin, nn.Softplus, nn.Softsign,
        nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.Hardtanh, nn.Hardswish, nn.Hardsigmoid,
        nn.PReLU, nn.GLU, nn.Threshold, nn.Tanhshrink, nn.LogSigmoid, nn.Hardshrink,
        nn.Softshrink, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.MaxPool1d, nn.MaxPool2d,
        nn.MaxPool3d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool1d,
        nn.AdaptiveMaxPool2d, nn.Upsample, nn.PixelShuffle, nn.PixelUnshuffle,
        nn.ZeroPad2d, nn.ConstantPad1d, nn.ConstantPad2d, nn.ConstantPad3d,
        nn.CosineSimilarity, nn.PairwiseDistance, nn.CrossEntropyLoss, nn.MSELoss,
        nn.L1Loss,
    }
)  # fmt: skip
RANDOM_MODULES: frozenset[type] = frozenset(
    {
        nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
        nn.FeatureAlphaDropout, nn.RReLU,
    }
)  # fmt: skip
VIEW_MODULES: frozenset[type] = frozenset({nn.Identity})
MAYBE_ALIAS_MODULES: frozenset[type] = frozenset({nn.Flatten, nn.Unflatten})
BATCH_NORMS: frozenset[type] = frozenset({nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d})

# aten ops whose schema hides that the result is a view of the input.
UNANNOTATED_VIEWS = frozenset({"aten::_unsafe_view"})
# aten ops whose schema does not mark arguments they write (running statistics of the
# normalisations, updated in place when training).
UNANNOTATED_WRITES: dict[str, tuple[str, ...]] = {
    "aten::batch_norm": ("running_mean", "running_var"),
    "aten::native_batch_norm": ("running_mean", "running_var"),
    "aten::_batch_norm_impl_index": ("running_mean", "running_var"),
    "aten::cudnn_batch_norm": ("running_mean", "running_var"),
    "aten::miopen_batch_norm": ("running_mean", "running_var"),
    "aten::instance_norm": ("running_mean", "running_var"),
    "aten::_batch_norm_with_update": ("running_mean", "running_var"),
}
# aten ops after which the first argument shares the storage of the second.
STORAGE_SWAPS = frozenset({"aten::set_"})
