"""Drop-in replacements for torch.nn modules, computed by rtdnn."""

from .activation import (
    ELU,
    GELU,
    Hardtanh,
    LeakyReLU,
    LogSoftmax,
    ReLU,
    Sigmoid,
    SiLU,
    Softmax,
    Tanh,
)
from .attention import MultiheadAttention
from .conv import Conv1d, Conv2d, Conv3d
from .ctc import CTCLoss
from .dropout import Dropout
from .linear import CrossEntropyLoss, Linear
from .lrn import LocalResponseNorm
from .normalization import (
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
    GroupNorm,
    InstanceNorm1d,
    InstanceNorm2d,
    InstanceNorm3d,
    LayerNorm,
    RMSNorm,
)
from .pooling import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveAvgPool3d,
    AvgPool1d,
    AvgPool2d,
    AvgPool3d,
    MaxPool1d,
    MaxPool2d,
    MaxPool3d,
)
from .rnn import GRU, LSTM, RNN
from .squeeze_excitation import SqueezeExcitation

__all__ = [
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "CTCLoss",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "CrossEntropyLoss",
    "Dropout",
    "ELU",
    "GELU",
    "GroupNorm",
    "GRU",
    "Hardtanh",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "InstanceNorm3d",
    "LayerNorm",
    "LeakyReLU",
    "Linear",
    "LSTM",
    "LocalResponseNorm",
    "LogSoftmax",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "MultiheadAttention",
    "ReLU",
    "RNN",
    "RMSNorm",
    "Sigmoid",
    "SiLU",
    "Softmax",
    "SqueezeExcitation",
    "Tanh",
]
