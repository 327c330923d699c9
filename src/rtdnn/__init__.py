"""rtdnn: deep-learning primitives with cuDNN's semantics, generated at run time with Triton.

The forward functions exported here are rtdnn.ops' primitives made differentiable: called on
inputs that require grad they run the custom ops of rtdnn.autograd, as the rtdnn.nn modules do,
and otherwise they are the plain primitives. The backward functions are the plain ones.
"""

from .autograd import activation_forward_api as activation_forward
from .autograd import adaptive_avg_pool_api as adaptive_avg_pool
from .autograd import add_tensor_api as add_tensor
from .autograd import (
    affine_grid,
    batch_norm,
    ctc_loss,
    grid_sample,
    group_norm,
    instance_norm,
    layer_norm,
    rms_norm,
)
from .autograd import batch_norm_forward_inference_api as batch_norm_forward_inference
from .autograd import batch_norm_forward_training_api as batch_norm_forward_training
from .autograd import conv_forward_api as conv_forward
from .autograd import cross_entropy_api as cross_entropy
from .autograd import dropout_forward_api as dropout_forward
from .autograd import group_norm_forward_api as group_norm_forward
from .autograd import instance_norm_forward_api as instance_norm_forward
from .autograd import layer_norm_forward_api as layer_norm_forward
from .autograd import linear_api as linear
from .autograd import lrn_forward_api as lrn_forward
from .autograd import op_tensor_api as op_tensor
from .autograd import pooling_forward_api as pooling_forward
from .autograd import reduce_tensor_api as reduce_tensor
from .autograd import rms_norm_forward_api as rms_norm_forward
from .autograd import rnn_api as rnn
from .autograd import scale_tensor_api as scale_tensor
from .autograd import scaled_dot_product_attention_api as scaled_dot_product_attention
from .autograd import set_tensor_api as set_tensor
from .autograd import softmax_forward_api as softmax_forward
from .autograd import squeeze_excitation_api as squeeze_excitation
from .autograd import transform_tensor_api as transform_tensor
from .convert import ConversionReport, convert
from .core import (
    AllocFailedError,
    BadParamError,
    Error,
    ExecutionFailedError,
    NotSupportedError,
)
from .network_plan import NetworkPlan, plan_network
from .ops import (
    activation_backward,
    activation_needs,
    adaptive_avg_pool_backward,
    attention_dropout_mask,
    batch_norm_backward,
    conv_backward_bias,
    conv_backward_data,
    conv_backward_filter,
    dropout_backward,
    find_conv_algorithms,
    get_conv_algorithm,
    group_norm_backward,
    instance_norm_backward,
    layer_norm_backward,
    linear_backward_bias,
    linear_backward_data,
    linear_backward_weight,
    lrn_backward,
    plan_conv,
    pooling_backward,
    rms_norm_backward,
    softmax_backward,
    squeeze_excitation_backward,
)
from .select import AlgoPerf

__version__ = "0.1.5"

__all__ = [
    "activation_backward",
    "activation_forward",
    "activation_needs",
    "adaptive_avg_pool",
    "adaptive_avg_pool_backward",
    "add_tensor",
    "affine_grid",
    "AlgoPerf",
    "AllocFailedError",
    "BadParamError",
    "batch_norm",
    "batch_norm_backward",
    "batch_norm_forward_inference",
    "batch_norm_forward_training",
    "conv_backward_bias",
    "conv_backward_data",
    "conv_backward_filter",
    "conv_forward",
    "ConversionReport",
    "convert",
    "cross_entropy",
    "ctc_loss",
    "dropout_backward",
    "dropout_forward",
    "Error",
    "ExecutionFailedError",
    "find_conv_algorithms",
    "get_conv_algorithm",
    "grid_sample",
    "group_norm",
    "group_norm_backward",
    "group_norm_forward",
    "instance_norm",
    "instance_norm_backward",
    "instance_norm_forward",
    "layer_norm",
    "layer_norm_backward",
    "layer_norm_forward",
    "linear",
    "linear_backward_bias",
    "linear_backward_data",
    "linear_backward_weight",
    "lrn_backward",
    "lrn_forward",
    "NetworkPlan",
    "NotSupportedError",
    "op_tensor",
    "plan_conv",
    "plan_network",
    "pooling_backward",
    "pooling_forward",
    "reduce_tensor",
    "rms_norm",
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
    "transform_tensor",
]
