"""Drop-in replacements for torch.nn modules, computed by rtdnn."""

from .conv import Conv1d, Conv2d, Conv3d
from .linear import CrossEntropyLoss, Linear

__all__ = ["Conv1d", "Conv2d", "Conv3d", "CrossEntropyLoss", "Linear"]
