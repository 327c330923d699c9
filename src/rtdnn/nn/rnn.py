"""Recurrent layers: drop-ins for torch.nn.RNN, LSTM and GRU, computed by rtdnn.

Same constructor arguments, parameters, state_dict keys and return values as torch's: input
(T, B, input_size), (B, T, input_size) with batch_first, unbatched (T, input_size), or a
PackedSequence (and then a PackedSequence out); hx None or the initial state(s). Inter-layer
dropout in training draws its seed from torch's default CPU generator, so torch.manual_seed
makes runs repeatable (the mask is rtdnn's own, not the one torch would draw). Under
torch.autocast the layer runs in the autocast dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence

from .. import autograd
from ..core import bad_param
from ._inputs import check_dtype

_NONLINEARITY = {"tanh": "rnn_tanh", "relu": "rnn_relu"}


def _mode(module: torch.nn.RNNBase) -> str:
    if isinstance(module, torch.nn.LSTM):
        return "lstm"
    if isinstance(module, torch.nn.GRU):
        return "gru"
    if module.nonlinearity not in _NONLINEARITY:
        raise bad_param("nonlinearity", module.nonlinearity, "'tanh' or 'relu'")
    return _NONLINEARITY[module.nonlinearity]


def _forward(module: torch.nn.RNNBase, input, hx):
    """(output, h_n) or, for lstm, (output, (h_n, c_n)), as torch's module returns them."""
    mode = _mode(module)
    packed = isinstance(input, PackedSequence)
    check_dtype(module, input.data if packed else input)
    unbatched = not packed and input.dim() == 2
    if unbatched:
        # torch's unbatched form: (T, input_size) and states without the batch dim.
        input = input.unsqueeze(0 if module.batch_first else 1)
        if hx is not None:
            hx = tuple(h.unsqueeze(1) for h in hx) if mode == "lstm" else hx.unsqueeze(1)
    input, hx, weights = _autocast(input, hx, module._flat_weights)
    result = autograd.rnn_api(
        input, hx, weights, mode=mode, num_layers=module.num_layers,
        bidirectional=module.bidirectional, bias=module.bias, batch_first=module.batch_first,
        proj_size=module.proj_size, dropout=float(module.dropout), training=module.training,
    )  # fmt: skip
    output, *states = result
    if unbatched:
        output = output.squeeze(0 if module.batch_first else 1)
        states = [s.squeeze(1) for s in states]
    return (output, tuple(states)) if mode == "lstm" else (output, states[0])


def _autocast(input, hx, weights):
    """Under torch.autocast, input, states and weights in the autocast dtype (the op takes one
    dtype), as torch's recurrent layers run."""
    data = input.data if isinstance(input, PackedSequence) else input
    kind = data.device.type
    if not torch.is_autocast_enabled(kind):
        return input, hx, weights
    dtype = torch.get_autocast_dtype(kind)

    def cast(t):
        return t if t is None or t.dtype == dtype else t.to(dtype)

    if isinstance(input, PackedSequence):
        input = input._replace(data=cast(input.data))
    else:
        input = cast(input)
    hx = tuple(map(cast, hx)) if isinstance(hx, tuple) else cast(hx)
    return input, hx, [cast(w) for w in weights]


class RNN(torch.nn.RNN):
    """torch.nn.RNN (tanh or relu) computed by rtdnn (same arguments, parameters and keys)."""

    def forward(self, input, hx: Tensor | None = None):
        return _forward(self, input, hx)


class LSTM(torch.nn.LSTM):
    """torch.nn.LSTM (proj_size included) computed by rtdnn."""

    def forward(self, input, hx: tuple[Tensor, Tensor] | None = None):
        return _forward(self, input, hx)


class GRU(torch.nn.GRU):
    """torch.nn.GRU computed by rtdnn."""

    def forward(self, input, hx: Tensor | None = None):
        return _forward(self, input, hx)
