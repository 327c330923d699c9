"""The primitives, one module per primitive family: cuDNN's functional API (alpha, beta, out=,
algorithm and math-mode choices) with no autograd. rtdnn.autograd builds its custom ops on
these, and rtdnn's top level exports the forward functions again, differentiable (the same
signatures, through those custom ops when an input requires grad)."""

from .activation import activation_backward, activation_forward, activation_needs
from .attention import attention_dropout_mask, scaled_dot_product_attention
from .batch_norm import (
    batch_norm_backward,
    batch_norm_forward_inference,
    batch_norm_forward_training,
)
from .conv import (
    conv_backward_bias,
    conv_backward_data,
    conv_backward_filter,
    conv_forward,
    find_conv_algorithms,
    get_conv_algorithm,
    plan_conv,
)
from .dropout import dropout_backward, dropout_forward
from .group_norm import (
    group_norm_backward,
    group_norm_forward,
    instance_norm_backward,
    instance_norm_forward,
)
from .layer_norm import layer_norm_backward, layer_norm_forward, rms_norm_backward, rms_norm_forward
from .linear import linear, linear_backward_bias, linear_backward_data, linear_backward_weight
from .loss import cross_entropy, cross_entropy_backward, cross_entropy_forward
from .lrn import lrn_backward, lrn_forward
from .pooling import (
    adaptive_avg_pool,
    adaptive_avg_pool_backward,
    pooling_backward,
    pooling_forward,
)
from .rnn import rnn
from .softmax import softmax_backward, softmax_forward
from .spatial_transformer import (
    affine_grid,
    affine_grid_backward,
    grid_sample,
    grid_sample_backward,
)
from .squeeze_excitation import (
    squeeze_excitation,
    squeeze_excitation_backward,
    squeeze_excitation_training,
)
from .tensor_ops import (
    add_tensor,
    op_tensor,
    reduce_tensor,
    scale_tensor,
    set_tensor,
    transform_tensor,
)

__all__ = [
    "activation_backward",
    "activation_forward",
    "activation_needs",
    "adaptive_avg_pool",
    "adaptive_avg_pool_backward",
    "add_tensor",
    "affine_grid",
    "affine_grid_backward",
    "batch_norm_backward",
    "batch_norm_forward_inference",
    "batch_norm_forward_training",
    "conv_backward_bias",
    "conv_backward_data",
    "conv_backward_filter",
    "conv_forward",
    "cross_entropy",
    "cross_entropy_backward",
    "cross_entropy_forward",
    "dropout_backward",
    "dropout_forward",
    "find_conv_algorithms",
    "get_conv_algorithm",
    "grid_sample",
    "grid_sample_backward",
    "group_norm_backward",
    "group_norm_forward",
    "instance_norm_backward",
    "instance_norm_forward",
    "layer_norm_backward",
    "layer_norm_forward",
    "linear",
    "linear_backward_bias",
    "linear_backward_data",
    "linear_backward_weight",
    "lrn_backward",
    "lrn_forward",
    "op_tensor",
    "plan_conv",
    "pooling_backward",
    "pooling_forward",
    "reduce_tensor",
    "rms_norm_backward",
    "rms_norm_forward",
    "rnn",
    "scale_tensor",
    "attention_dropout_mask",
    "scaled_dot_product_attention",
    "set_tensor",
    "softmax_backward",
    "softmax_forward",
    "squeeze_excitation",
    "squeeze_excitation_backward",
    "squeeze_excitation_training",
    "transform_tensor",
]
