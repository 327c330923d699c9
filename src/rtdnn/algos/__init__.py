"""Convolution algorithms as plug-ins. To add one, write a ConvAlgorithm and list it here."""

from __future__ import annotations

from ..core import ConvProblem, bad_param
from .base import ConvAlgorithm, ConvTensors
from .direct import Direct
from .fft import Fft, FftTiling
from .gemm import Gemm
from .implicit_gemm import ImplicitGemm, ImplicitGemmSplitK
from .implicit_precomp_gemm import ImplicitPrecompGemm
from .winograd import WinogradFused, WinogradNonfused

ALGORITHMS: dict[str, ConvAlgorithm] = {
    a.name: a for a in (ImplicitGemm(), ImplicitGemmSplitK(), Gemm(), Direct())
}
ALGORITHMS[Fft.name] = Fft()
ALGORITHMS[FftTiling.name] = FftTiling()
ALGORITHMS[WinogradNonfused.name] = WinogradNonfused()
ALGORITHMS[WinogradFused.name] = WinogradFused()
ALGORITHMS[ImplicitPrecompGemm.name] = ImplicitPrecompGemm()

#: The algorithm that needs no workspace and supports every problem.
NO_WORKSPACE = "IMPLICIT_GEMM"


def get_algorithm(name: str) -> ConvAlgorithm:
    try:
        return ALGORITHMS[name.upper()]
    except (KeyError, AttributeError):
        raise bad_param("algo", name, f"'auto' or one of {sorted(ALGORITHMS)}") from None


def supported_algorithms(p: ConvProblem) -> list[ConvAlgorithm]:
    return [a for a in ALGORITHMS.values() if a.supports(p) is None]


__all__ = [
    "ALGORITHMS",
    "NO_WORKSPACE",
    "ConvAlgorithm",
    "ConvTensors",
    "get_algorithm",
    "supported_algorithms",
]
