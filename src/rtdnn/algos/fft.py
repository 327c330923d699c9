"""FFT and FFT_TILING: convolution as products of Fourier transforms, for stride 1 and
dilation 1, 1-D to 3-D, any padding, groups, every direction.

The channel sums become, per frequency f, a small complex GEMM (kernels/fft.py, cmac):

    forward          Y[n, k, f]  = sum_c X[n, c, f] * op(W[k, c, f])
    backward-data    DX[n, c, f] = sum_k DY[n, k, f] * op(W[k, c, f])
    backward-filter  DW[k, c, f] = sum_n op(DY[n, k, f]) * op(X[n, c, f])

where op conjugates or not, and the data sit at shifted places in the transform buffers,
depending on the direction and the mode (cross-correlation or true convolution; a flipped
filter is a conjugated spectrum and a shift, so no filter is ever flipped in memory). The
zero padding is the zeros around each tile in the transform buffer, and every tile is long
enough (length >= tile + taps - 1) that the circular convolution never wraps onto a value it
keeps.

FFT transforms the whole image at once: one tile per dim, the transform length the smallest
2^a 3^b 5^c 7^d at least (extent + taps - 1). FFT_TILING cuts the extent (the output in
forward, the input gradient in backward-data, dy in backward-filter) into tiles of
`length - taps + 1` for a fixed power-of-two transform length (overlap-save), and transforms a
wave of tiles at a time: its workspace depends on the tile and the wave, not on the image
size. Backward-filter adds the waves' products in the frequency domain, in wave order.

Workspace (exact, `workspace_bytes`): one float32 buffer for the real side of the transforms,
reused in turn by every tensor, and three complex64 spectra: x's side [T * N, C, F], dy's side
[T * N, K, F] and the filter [K, C/groups, F], for T tiles in a wave of F frequencies each. The
runner's buffers are views into the workspace; torch.fft's own scratch (cuFFT's plan work
area, and the copy of its input that cuFFT's complex-to-real transform makes) is allocated by
torch, outside that bound.

Precision: transforms, products and sums in float32 for every dtype (16-bit inputs are
converted when packed), whatever the math mode (float32 in "tf32" mode gets strict float32,
at least as accurate as asked for). Deterministic: rtdnn's kernels sum in a fixed order, and
a transform repeats bit for bit on the same device (pocketfft: tests/test_conv_fft.py; cuFFT:
tests/test_conv_fft_gpu.py checks repeated runs).

Measured relative error against the float64 reference (||out - ref|| / ||ref||, random normal
data, every direction, 1-D to 3-D with filters of 3 to 31 taps, CPU with pocketfft, both
algorithms alike): float32 up to 1.8e-7 (rounding the exact result to float32 alone: 2.6e-8);
float16 up to 2.6e-4 (its rounding alone: 1.7e-4 to 2.3e-4); bfloat16 up to 3.6e-3 in the
interpreter, whose float32-to-bfloat16 conversion truncates (rounding to nearest, as the GPU
does: 1.5e-3 to 1.8e-3).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton

from ..core import ConvProblem, Direction, cdiv
from ..kernels.fft import (
    CmacGeometry,
    PackGeometry,
    UnpackGeometry,
    cmac_programs,
    fft_cmac_kernel,
    fft_pack_kernel,
    fft_unpack_kernel,
)
from ..kernels.launch import KernelLaunch, TileConfig
from .base import ConvAlgorithm, ConvTensors, Runner
from .gemm import PREFER_UP_TO_MEMORY_SHARE
from .geometry import device_memory_bytes, strict_float32

#: Workspace a wave of FFT_TILING tiles may take on a GPU (the filter spectrum comes on top);
#: a wave always holds at least one tile.
WAVE_BYTES = 256 << 20
#: Tiles per wave in the interpreter: small, so that tests run several waves.
CPU_TILES_PER_WAVE = 4


def copy_blocks(chans: int, items: int, chan_stride: int, device: str) -> tuple[int, int]:
    """(channels, positions) of a pack or unpack program, 1024 elements on a GPU: wide in the
    channels when they are the tensor's innermost dim (channels-last), so that its loads or
    stores are contiguous; the buffer side is contiguous in the positions."""
    if device != "cuda":  # the interpreter's cost is per program
        return min(16, triton.next_power_of_2(chans)), min(256, triton.next_power_of_2(items))
    bc = 32 if chan_stride == 1 else 4
    bc = min(bc, triton.next_power_of_2(chans))
    return bc, min(1024 // bc, triton.next_power_of_2(items))


def fast_length(n: int) -> int:
    """The smallest 2^a 3^b 5^c 7^d >= n: the sizes FFT libraries transform fastest."""
    best = 1 << max(0, (n - 1).bit_length())
    p7 = 1
    while p7 < best:
        p5 = p7
        while p5 < best:
            p3 = p5
            while p3 < best:
                m = p3
                while m < n:
                    m *= 2
                best = min(best, m)
                p3 *= 3
            p5 *= 5
        p7 *= 7
    return best


def tile_length(taps: int, device: str) -> int:
    """FFT_TILING's transform length per dim: a power of two, about four times the filter on
    a GPU (three quarters of each tile is output); smaller in the interpreter, so that the
    tests' tiny images span several tiles."""
    if device == "cuda":
        return max(16, triton.next_power_of_2(4 * (taps - 1)))
    return max(4, triton.next_power_of_2(2 * (taps - 1)))


def _pad3(values, fill: int) -> tuple[int, ...]:
    return (fill,) * (3 - len(values)) + tuple(values)


def _strides5(desc) -> tuple[int, ...]:
    return (*desc.strides[:2], *_pad3(desc.strides[2:], 0))


def _extent(p: ConvProblem) -> tuple[int, ...]:
    """What the tiles cut: dx in backward-data, the output (dy) otherwise."""
    return p.in_spatial if p.direction == Direction.BACKWARD_DATA else p.out_spatial


@dataclass(frozen=True)
class FftPlan:
    """The tiles and the workspace layout of one problem (spatial tuples per problem dim).

    length: transform length; step: extent per tile (T = step + taps - 1 <= length);
    tiles: tiles per dim; per_wave tiles are transformed at once, in `waves` waves (the
    last one padded with empty tiles)."""

    length: tuple[int, ...]
    step: tuple[int, ...]
    tiles: tuple[int, ...]
    per_wave: int
    waves: int
    real_bytes: int
    spectrum_offsets: tuple[int, int, int]  # x side, dy side, filter
    workspace_bytes: int

    @property
    def freqs(self) -> int:
        """Frequencies of one real transform (the last dim keeps length // 2 + 1)."""
        return math.prod(self.length[:-1]) * (self.length[-1] // 2 + 1)


def _align(nbytes: int, to: int = 256) -> int:
    return -(-nbytes // to) * to


@functools.lru_cache(maxsize=1024)
def make_plan(p: ConvProblem, tiled: bool) -> FftPlan:
    """FFT's plan (`tiled` False: one tile per dim) or FFT_TILING's for `p`."""
    length, step, tiles = [], [], []
    for extent, taps in zip(_extent(p), p.kernel, strict=True):
        whole = extent + taps - 1
        tile = tile_length(taps, p.device)
        if not tiled or whole <= tile:
            length.append(fast_length(whole))
            step.append(extent)
            tiles.append(1)
        else:
            length.append(tile)
            step.append(tile - taps + 1)
            tiles.append(cdiv(extent, tile - taps + 1))
    total = math.prod(tiles)
    volume = math.prod(length)
    freqs = math.prod(length[:-1]) * (length[-1] // 2 + 1)
    n, c, k = p.batch, p.in_channels, p.out_channels
    filt = k * (c // p.groups)
    if not tiled:
        most = total
    elif p.device == "cuda":
        per_tile = n * (c + k) * freqs * 8 + n * max(c, k) * volume * 4
        most = max(1, WAVE_BYTES // per_tile)
    else:
        most = CPU_TILES_PER_WAVE
    waves = cdiv(total, min(most, total))
    per_wave = cdiv(total, waves)
    rows = per_wave * n
    sizes = (rows * c, rows * k, filt)  # x side, dy side, filter
    real_bytes = max(sizes) * volume * 4
    offsets, at = [], _align(real_bytes)
    for s in sizes:
        offsets.append(at)
        end = at + s * freqs * 8
        at = _align(end)
    return FftPlan(
        tuple(length), tuple(step), tuple(tiles), per_wave, waves, real_bytes, tuple(offsets),
        end,
    )  # fmt: skip


class _Buffers:
    """Views of the workspace: the real buffer as any [planes, *length], the three spectra."""

    def __init__(self, p: ConvProblem, plan: FftPlan, workspace: torch.Tensor):
        self.length = plan.length
        self.half = (*plan.length[:-1], plan.length[-1] // 2 + 1)
        self.dims = tuple(range(-len(plan.length), 0))
        rows = plan.per_wave * p.batch
        planes = (rows * p.in_channels, rows * p.out_channels,
                  p.out_channels * (p.in_channels // p.groups))  # fmt: skip
        self.real = workspace[: plan.real_bytes].view(torch.float32)
        self.spectra = []
        for at, count in zip(plan.spectrum_offsets, planes, strict=True):
            nbytes = count * plan.freqs * 8
            spectrum = workspace[at : at + nbytes].view(torch.complex64)
            self.spectra.append(spectrum.view(count, *self.half))

    def forward_transform(self, which: int) -> None:
        """spectra[which] = rfft(real), the real buffer holding that many planes."""
        out = self.spectra[which]
        real = self.real[: out.shape[0] * math.prod(self.length)].view(out.shape[0], *self.length)
        torch.fft.rfftn(real, s=self.length, dim=self.dims, out=out)

    def inverse_transform(self, which: int) -> None:
        """real = irfft(spectra[which])."""
        spectrum = self.spectra[which]
        count = spectrum.shape[0]
        real = self.real[: count * math.prod(self.length)].view(count, *self.length)
        torch.fft.irfftn(spectrum, s=self.length, dim=self.dims, out=real)

    def spectrum_floats(self, which: int) -> torch.Tensor:
        return self.spectra[which].view(torch.float32)


X_SIDE, DY_SIDE, FILTER = 0, 1, 2  # the three spectra


class SpectrumGemm(NamedTuple):
    """C = sum op(A) * op(B) over spectra a, b, c (X_SIDE, DY_SIDE or FILTER)."""

    geo: CmacGeometry
    a: int
    b: int
    c: int
    conj_a: bool
    conj_b: bool


class Fft(ConvAlgorithm):
    name = "FFT"
    tiled = False

    def supports(self, p: ConvProblem) -> str | None:
        if any(s != 1 for s in p.conv.stride):
            return f"stride {p.conv.stride}: {self.name} computes stride-1 convolutions only"
        if any(d != 1 for d in p.conv.dilation):
            return f"dilation {p.conv.dilation}: {self.name} handles dilation 1 only"
        return None

    def plan(self, p: ConvProblem) -> FftPlan:
        return make_plan(p, self.tiled)

    def workspace_bytes(self, p: ConvProblem) -> int:
        return self.plan(p).workspace_bytes

    def deterministic(self, p: ConvProblem) -> bool:
        return True

    def _cmac(self, p: ConvProblem, plan: FftPlan) -> SpectrumGemm:
        """The complex GEMM of p's direction over the spectra of a wave (a conjugate is a
        time reversal):

                             cross-correlation    true convolution
            forward          X * conj(W)          X * W
            backward-data    DY * W               DY * conj(W)
            backward-filter  conj(DY) * X         DY * conj(X)

        with the shifts that go with them: forward crops y at taps - 1 in true convolution;
        backward-data packs dy from padding - taps + 1 and crops dx at taps - 1 in
        cross-correlation; backward-filter packs dy taps - 1 further on in true convolution
        (see _pack and _unpack_geometry)."""
        g, f = p.groups, plan.freqs
        c, k = p.in_channels, p.out_channels
        cg, kg = c // g, k // g
        rows = plan.per_wave * p.batch
        corr = p.conv.mode == "cross_correlation"
        if p.direction == Direction.FORWARD:  # Y[n, k] = sum_c X[n, c] * W[k, c]
            geo = CmacGeometry(g, rows, kg, cg, f, (cg * f, c * f, f), (kg * cg * f, f, cg * f),
                               (kg * f, k * f, f))  # fmt: skip
            return SpectrumGemm(geo, X_SIDE, FILTER, DY_SIDE, conj_a=False, conj_b=corr)
        if p.direction == Direction.BACKWARD_DATA:  # DX[n, c] = sum_k DY[n, k] * W[k, c]
            geo = CmacGeometry(g, rows, cg, kg, f, (kg * f, k * f, f), (kg * cg * f, cg * f, f),
                               (cg * f, c * f, f))  # fmt: skip
            return SpectrumGemm(geo, DY_SIDE, FILTER, X_SIDE, conj_a=False, conj_b=not corr)
        # DW[k, c] = sum_n DY[n, k] * X[n, c]
        geo = CmacGeometry(g, kg, cg, rows, f, (kg * f, f, k * f), (cg * f, c * f, f),
                           (kg * cg * f, cg * f, f))  # fmt: skip
        return SpectrumGemm(geo, DY_SIDE, X_SIDE, FILTER, conj_a=corr, conj_b=not corr)

    def tile_candidates(self, p: ConvProblem) -> list[TileConfig]:
        """TileConfig(block_m, block_n, block_k = frequencies per program, group_m unused,
        warps, stages unused) of the complex GEMM."""
        geo = self._cmac(p, self.plan(p)).geo
        bm_most = triton.next_power_of_2(geo.m)
        bn_most = triton.next_power_of_2(geo.n)
        bf_most = triton.next_power_of_2(geo.freqs)
        if p.device != "cuda":
            return [TileConfig(min(16, bm_most), min(16, bn_most), min(256, bf_most), 1, 1, 1)]
        out = []
        for bm, bn, bf, warps in ((8, 8, 32, 4), (4, 8, 64, 4), (16, 16, 16, 4), (8, 8, 64, 8)):
            cfg = TileConfig(min(bm, bm_most), min(bn, bn_most), min(bf, bf_most), 1, warps, 1)
            if cfg not in out:
                out.append(cfg)
        return out

    # -- launches ------------------------------------------------------------------------

    def _pack(self, p: ConvProblem, plan: FftPlan, which: str, rows: int) -> KernelLaunch:
        """The launch that packs x, dy or w into the real buffer: `rows` rows (a wave of
        tiles of N rows each; K rows of the filter)."""
        taps = _pad3(p.kernel, 1)
        length = _pad3(plan.length, 1)
        step = _pad3(plan.step, 1)
        tiles = _pad3(plan.tiles, 1)
        pad = _pad3(p.conv.padding, 0)
        zeros = (0, 0, 0)
        # By default a tile is the whole window its outputs read: step + taps - 1.
        lo, hi = zeros, tuple(s + r - 1 for s, r in zip(step, taps, strict=True))
        if which == "w":  # the filter, once, at the start of the buffer
            src, chans, size = p.w, p.in_channels // p.groups, taps
            start, step, tiles, hi = zeros, zeros, (1, 1, 1), taps
        elif which == "x":  # the padded input: tile t from t * step - padding
            src, chans, size = p.x, p.in_channels, _pad3(p.in_spatial, 1)
            start = tuple(-q for q in pad)
        elif p.direction == Direction.BACKWARD_DATA:
            # dx[i] reads dy[i + padding - taps + 1 ... i + padding]
            src, chans, size = p.y, p.out_channels, _pad3(p.out_spatial, 1)
            start = tuple(q - r + 1 for q, r in zip(pad, taps, strict=True))
        else:  # backward-filter: the tile's dy alone, shifted by taps - 1 in true convolution
            src, chans, size = p.y, p.out_channels, _pad3(p.out_spatial, 1)
            lo = zeros if p.conv.mode == "cross_correlation" else tuple(r - 1 for r in taps)
            start = tuple(-q for q in lo)
            hi = tuple(q + s for q, s in zip(lo, step, strict=True))
        geo = PackGeometry(
            rows=p.out_channels if which == "w" else p.batch, chans=chans, size=size,
            strides=_strides5(src), length=length, start=start, step=step, lo=lo, hi=hi,
            tiles=tiles,
        )  # fmt: skip
        volume = math.prod(length)
        bc, bq = copy_blocks(chans, volume, src.strides[1], p.device)
        grid = (rows * cdiv(chans, bc) * cdiv(volume, bq),)
        return KernelLaunch(
            fft_pack_kernel, grid, dict(num_warps=4), geo=geo, BLOCK_C=bc, BLOCK_Q=bq
        )

    def _unpack_geometry(self, p: ConvProblem, plan: FftPlan) -> UnpackGeometry:
        taps = _pad3(p.kernel, 1)
        length = _pad3(plan.length, 1)
        corr = p.conv.mode == "cross_correlation"
        zeros = (0, 0, 0)
        shift = tuple(r - 1 for r in taps)
        if p.direction == Direction.FORWARD:
            return UnpackGeometry(p.batch, p.out_channels, _pad3(p.out_spatial, 1),
                                  _strides5(p.y), length, zeros if corr else shift,
                                  _pad3(plan.step, 1), _pad3(plan.tiles, 1))  # fmt: skip
        if p.direction == Direction.BACKWARD_DATA:
            return UnpackGeometry(p.batch, p.in_channels, _pad3(p.in_spatial, 1),
                                  _strides5(p.x), length, shift if corr else zeros,
                                  _pad3(plan.step, 1), _pad3(plan.tiles, 1))  # fmt: skip
        return UnpackGeometry(p.out_channels, p.in_channels // p.groups, taps, _strides5(p.w),
                              length, zeros, taps, (1, 1, 1))  # fmt: skip

    def prepare(self, p: ConvProblem, tiles: TileConfig) -> Runner:
        plan = self.plan(p)
        per_wave = plan.per_wave
        gemm = self._cmac(p, plan)
        bm, bn, bf = tiles.block_m, tiles.block_n, tiles.block_k
        cmac_grid = (cmac_programs(gemm.geo, bm, bn, bf),)
        cmacs: dict[bool, KernelLaunch] = {}

        def cmac(buffers: _Buffers, accumulate: bool) -> None:
            launch = cmacs.get(accumulate)
            if launch is None:
                launch = cmacs[accumulate] = KernelLaunch(
                    fft_cmac_kernel, cmac_grid, dict(num_warps=tiles.num_warps), geo=gemm.geo,
                    CONJ_A=gemm.conj_a, CONJ_B=gemm.conj_b, ACCUMULATE=accumulate,
                    BLOCK_M=bm, BLOCK_N=bn, BLOCK_F=bf,
                )  # fmt: skip
            launch(A=buffers.spectrum_floats(gemm.a), B=buffers.spectrum_floats(gemm.b),
                   C=buffers.spectrum_floats(gemm.c))  # fmt: skip

        direction = p.direction
        filter_out = direction == Direction.BACKWARD_FILTER
        unpack_geo = self._unpack_geometry(p, plan)
        valid = math.prod(unpack_geo.step)
        out_desc = {Direction.FORWARD: p.y, Direction.BACKWARD_DATA: p.x}.get(direction, p.w)
        bc, bq = copy_blocks(unpack_geo.chans, valid, out_desc.strides[1], p.device)
        unpack_grid = (
            (1 if filter_out else per_wave) * unpack_geo.rows
            * cdiv(unpack_geo.chans, bc) * cdiv(valid, bq),
        )  # fmt: skip
        unpacks: dict[tuple[bool, bool], KernelLaunch] = {}

        def unpack(buffers: _Buffers, out, bias, wave: int, alpha: float, beta: float) -> None:
            key = (bias is not None, beta != 0)
            launch = unpacks.get(key)
            if launch is None:
                launch = unpacks[key] = KernelLaunch(
                    fft_unpack_kernel, unpack_grid, dict(num_warps=4), geo=unpack_geo,
                    HAS_BIAS=key[0], BETA_NONZERO=key[1], BLOCK_C=bc, BLOCK_Q=bq,
                )  # fmt: skip
            launch(BUF=buffers.real, OUT=out, BIAS=bias if bias is not None else out,
                   wave_start=wave * per_wave, alpha=float(alpha), beta=float(beta))  # fmt: skip

        # What each wave transforms: (pack launch, ConvTensors field, spectrum).
        wave_rows = per_wave * p.batch
        if direction == Direction.FORWARD:
            inputs = [(self._pack(p, plan, "x", wave_rows), "x", X_SIDE)]
        elif direction == Direction.BACKWARD_DATA:
            inputs = [(self._pack(p, plan, "dy", wave_rows), "y", DY_SIDE)]
        else:
            inputs = [(self._pack(p, plan, "x", wave_rows), "x", X_SIDE),
                      (self._pack(p, plan, "dy", wave_rows), "y", DY_SIDE)]  # fmt: skip
        pack_w = None if filter_out else self._pack(p, plan, "w", p.out_channels)

        def run(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
            buffers = _Buffers(p, plan, workspace)
            if pack_w is not None:
                pack_w(SRC=t.w, BUF=buffers.real, wave_start=0)
                buffers.forward_transform(FILTER)
            for wave in range(plan.waves):
                for pack, field, spectrum in inputs:
                    pack(SRC=getattr(t, field), BUF=buffers.real, wave_start=wave * per_wave)
                    buffers.forward_transform(spectrum)
                if filter_out:  # dw's spectrum sums the waves, transformed back at the end
                    cmac(buffers, accumulate=wave > 0)
                    continue
                cmac(buffers, accumulate=False)
                buffers.inverse_transform(gemm.c)
                unpack(buffers, t.written(direction), t.bias, wave, alpha, beta)
            if filter_out:
                buffers.inverse_transform(FILTER)
                unpack(buffers, t.w, None, 0, alpha, beta)

        return run


class FftTiling(Fft):
    name = "FFT_TILING"
    tiled = True


#: Filter taps (all dims together) from which the heuristic tries the FFT algorithms first,
#: in strict float32 on a GPU, where the implicit GEMM's cost grows with the taps and the
#: transforms' does not. Measured on an H200 (BENCHMARKS.md, "Large filters"), suite
#: large_kernels (2-D 9x9 to 31x31, 1-D 31 to 127 taps), every direction: the better of FFT
#: and FFT_TILING ran 1.5x to 19x IMPLICIT_GEMM. Smaller filters were not measured.
PREFER_FROM_TAPS = 31


def spectrum_elements(p: ConvProblem, tiled: bool) -> int:
    """Complex values a plan's products read and write: every tile's data spectra and the
    filter's, each `freqs` long."""
    plan = make_plan(p, tiled)
    data = math.prod(plan.tiles) * p.batch * (p.in_channels + p.out_channels)
    return plan.freqs * (data + p.out_channels * p.in_channels // p.groups)


def fft_preferred(p: ConvProblem) -> list[str]:
    """The FFT algorithms the heuristic should try first for `p`, the likely faster first:
    none unless `p` is strict float32 on a GPU with PREFER_FROM_TAPS taps or more, stride 1
    and dilation 1. The whole-image FFT is left out where its workspace is above the share of
    the device's memory that GEMM may take unasked (gemm.PREFER_UP_TO_MEMORY_SHARE);
    FFT_TILING's stays bounded.

    Of the two, the plan with fewer spectrum values (spectrum_elements) comes first, FFT on a
    tie (one tile covers the image: the same plan). On long 1-D signals the whole transform's
    filter spectrum, K x C at every frequency, outweighs the tiles' overlap: measured
    FFT_TILING 1.2x to 2.6x FFT at 63 and 127 taps (but 0.9x at 31 taps forward and
    backward-data); on a 56x56 image with a 9x9 filter nine 32x32 tiles transform more than
    one 64x64 image: FFT 1.6x to 1.7x."""
    if p.device != "cuda" or not strict_float32(p) or math.prod(p.kernel) < PREFER_FROM_TAPS:
        return []
    whole_image = Fft()
    if whole_image.supports(p) is not None:
        return []
    memory = device_memory_bytes(torch.cuda.current_device())
    too_large = whole_image.workspace_bytes(p) > memory * PREFER_UP_TO_MEMORY_SHARE
    whole = [] if too_large else ["FFT"]
    if spectrum_elements(p, tiled=True) < spectrum_elements(p, tiled=False):
        return ["FFT_TILING", *whole]
    return [*whole, "FFT_TILING"]
