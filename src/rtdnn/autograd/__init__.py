"""PyTorch integration: rtdnn's primitives as torch.library custom ops (rtdnn::*) with autograd
and fake (meta) kernels, one module per primitive family, mirroring rtdnn.ops.

_custom_op.py holds the machinery (CustomOp, custom_op, the eager fast path) and the helpers the
families share. A new family adds one module here beside its module in ops/.

Each family module also defines the public functions of rtdnn's top level: for each plain
forward function of rtdnn.ops, one of the same signature that carries autograd through the
family's custom op when an input requires grad (see _custom_op.public). They are named
<name>_api here, as the custom ops hold the plain names, and exported by rtdnn as <name>.
"""

from ._custom_op import CustomOp, custom_op
from .activation import activation_backward, activation_forward, activation_forward_api
from .attention import (
    attention_backward,
    attention_forward,
    scaled_dot_product_attention_api,
)
from .batch_norm import (
    batch_norm,
    batch_norm_bwd,
    batch_norm_forward_inference_api,
    batch_norm_forward_training_api,
    batch_norm_infer,
    batch_norm_train,
)
from .conv import (
    conv_backward_bias,
    conv_backward_data,
    conv_backward_filter,
    conv_forward,
    conv_forward_api,
)
from .conv_batch_norm import conv_batch_norm, conv_batch_norm_train
from .ctc import ctc_loss
from .dropout import dropout_backward, dropout_forward, dropout_forward_api
from .group_norm import (
    group_norm,
    group_norm_bwd,
    group_norm_forward_api,
    group_norm_fwd,
    instance_norm,
    instance_norm_forward_api,
)
from .layer_norm import (
    layer_norm,
    layer_norm_bwd,
    layer_norm_forward_api,
    layer_norm_fwd,
    rms_norm,
    rms_norm_bwd,
    rms_norm_forward_api,
    rms_norm_fwd,
)
from .linear import (
    linear,
    linear_api,
    linear_backward_bias,
    linear_backward_data,
    linear_backward_weight,
)
from .loss import cross_entropy, cross_entropy_api, cross_entropy_backward
from .lrn import lrn_backward, lrn_forward, lrn_forward_api
from .pooling import (
    adaptive_avg_pool,
    adaptive_avg_pool_api,
    adaptive_avg_pool_backward,
    pooling_backward,
    pooling_forward,
    pooling_forward_api,
)
from .rnn import rnn, rnn_api, rnn_backward
from .softmax import softmax_backward, softmax_forward, softmax_forward_api
from .spatial_transformer import affine_grid, grid_sample
from .squeeze_excitation import (
    squeeze_excitation_api,
    squeeze_excitation_backward,
    squeeze_excitation_forward,
)
from .tensor_ops import (
    add_tensor_api,
    op_tensor,
    op_tensor_api,
    reduce_tensor,
    reduce_tensor_api,
    scale_tensor_api,
    set_tensor_api,
    transform_tensor,
    transform_tensor_api,
)

__all__ = [
    "activation_forward_api",
    "batch_norm_forward_training_api",
    "batch_norm_forward_inference_api",
    "conv_forward_api",
    "dropout_forward_api",
    "group_norm_forward_api",
    "instance_norm_forward_api",
    "layer_norm_forward_api",
    "rms_norm_forward_api",
    "linear_api",
    "cross_entropy_api",
    "lrn_forward_api",
    "pooling_forward_api",
    "adaptive_avg_pool_api",
    "softmax_forward_api",
    "op_tensor_api",
    "reduce_tensor_api",
    "transform_tensor_api",
    "add_tensor_api",
    "scale_tensor_api",
    "set_tensor_api",
    "rnn_api",
    "scaled_dot_product_attention_api",
    "squeeze_excitation_api",
    "CustomOp",
    "activation_backward",
    "activation_forward",
    "adaptive_avg_pool",
    "adaptive_avg_pool_backward",
    "attention_backward",
    "attention_forward",
    "batch_norm",
    "batch_norm_bwd",
    "batch_norm_infer",
    "batch_norm_train",
    "conv_backward_bias",
    "conv_backward_data",
    "conv_batch_norm",
    "conv_batch_norm_train",
    "conv_backward_filter",
    "conv_forward",
    "cross_entropy",
    "cross_entropy_backward",
    "custom_op",
    "dropout_backward",
    "dropout_forward",
    "group_norm",
    "group_norm_bwd",
    "group_norm_fwd",
    "instance_norm",
    "layer_norm",
    "layer_norm_bwd",
    "layer_norm_fwd",
    "linear",
    "linear_backward_bias",
    "linear_backward_data",
    "linear_backward_weight",
    "lrn_backward",
    "lrn_forward",
    "op_tensor",
    "pooling_backward",
    "pooling_forward",
    "reduce_tensor",
    "rms_norm",
    "rms_norm_bwd",
    "rms_norm_fwd",
    "rnn",
    "rnn_backward",
    "affine_grid",
    "ctc_loss",
    "grid_sample",
    "softmax_backward",
    "softmax_forward",
    "squeeze_excitation_backward",
    "squeeze_excitation_forward",
    "transform_tensor",
]
