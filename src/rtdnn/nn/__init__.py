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
from .conv import Conv1d, Conv2d, Conv3d
from .dropout import Dropout
from .linear import CrossEntropyLoss, Linear
from .lrn import LocalResponseNorm
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

__all__ = [
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "CrossEntropyLoss",
    "Dropout",
    "ELU",
    "GELU",
    "Hardtanh",
    "LeakyReLU",
    "Linear",
    "LocalResponseNorm",
    "LogSoftmax",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "ReLU",
    "Sigmoid",
    "SiLU",
    "Softmax",
    "Tanh",
]
