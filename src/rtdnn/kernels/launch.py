"""Host-side launch helpers. No policy: callers pick tiles and splits.

A layer runs the same kernels with the same sizes on every step, so launches are prepared once
per problem. `SlotLaunch` and `KernelLaunch` fix a kernel's grid, integer arguments and
compile-time constants; the first call goes through Triton's JIT (compiling if needed) and later
calls go straight to the compiled kernel's launcher, skipping Triton's per-call argument
binding, which costs more than the kernel itself on small layers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import ClassVar

import torch
from triton import knobs
from triton.runtime import _allocation
from triton.tools.tensor_descriptor import TensorDescriptor

from ..core import INTERPRETED, cdiv
from ..core.handle import stream_counters
from .brgemm import brgemm_kernel, identity, split_finish_kernel
from .gemm_tma import gemm_tma_kernel
from .strided import StridedGeometry, strided_c_addr

try:  # Gluon's host-side descriptor (kernels/attention_hopper.py), which also names a layout
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor
except ImportError:
    GluonTensorDescriptor = TensorDescriptor
_DESCRIPTORS = (TensorDescriptor, GluonTensorDescriptor)


class DescriptorView:
    """A host-side TMA descriptor less its tensor: shape, strides and block in elements and,
    for Gluon kernels, the shared-memory layout, fixed when a launch is prepared. bind(t) is
    the call's descriptor of t's data: a layer's launch takes a few descriptors on every
    call, and building a TensorDescriptor (its checks) and keying it (its fields) cost the
    host microseconds each, where a bound view costs a fraction of one. The checks run when
    a bound view first reaches Triton's JIT (BoundDescriptor.materialize); the caller checks
    that each call's tensors are 16-byte aligned (core.tma_aligned), and the launch's key
    holds the alignment."""

    __slots__ = ("shape", "strides", "block_shape", "layout", "padding", "key")
    # A view's fields -> a small int that stands for them in launch keys. Never cleared: a
    # number given again to other fields would pick kernels compiled for the first ones.
    _keys: ClassVar[dict[tuple, int]] = {}

    def __init__(self, shape, strides, block_shape, layout=None, padding: str = "zero"):
        self.shape, self.strides = list(shape), list(strides)
        self.block_shape, self.layout, self.padding = list(block_shape), layout, padding
        fields_key = (tuple(shape), tuple(strides), tuple(block_shape), layout, padding)
        self.key = DescriptorView._keys.setdefault(fields_key, len(DescriptorView._keys))

    def bind(self, base: torch.Tensor) -> BoundDescriptor:
        """The descriptor of `base`'s data seen through this view."""
        return BoundDescriptor(self, base)


class BoundDescriptor:
    """A DescriptorView bound to a call's tensor: it reads as a TensorDescriptor does (base,
    shape, strides, block_shape, layout, padding), which is what the CUtensorMap encoding
    takes (_Compiled.with_tensor_maps)."""

    __slots__ = ("view", "base")

    def __init__(self, view: DescriptorView, base: torch.Tensor):
        self.view, self.base = view, base

    @property
    def shape(self) -> list[int]:
        return self.view.shape

    @property
    def strides(self) -> list[int]:
        return self.view.strides

    @property
    def block_shape(self) -> list[int]:
        return self.view.block_shape

    @property
    def layout(self):
        return self.view.layout

    @property
    def padding(self) -> str:
        return self.view.padding

    def materialize(self) -> TensorDescriptor:
        """Triton's own descriptor (Gluon's where the view has a layout), checked: for its
        JIT, which specializes on the class."""
        v = self.view
        if v.layout is None:
            return TensorDescriptor(self.base, v.shape, v.strides, v.block_shape, v.padding)
        return GluonTensorDescriptor(self.base, v.shape, v.strides, v.block_shape, v.layout,
                                     v.padding)  # fmt: skip


try:  # the CUtensorMap encoding of Triton's CUDA launcher (_Compiled.with_tensor_maps)
    from triton.backends.nvidia.driver import make_tensordesc_arg
except ImportError:  # a Triton without the CUDA backend: its own launcher encodes them
    make_tensordesc_arg = None

#: brgemm_kernel's UPCAST flag (bfloat16 tiles multiplied as float32 under the interpreter).
#: A constant of its own, apart from INTERPRETED (which says how to launch), so that the
#: offline compile checks, which launch through the interpreter's road, compile the GPU's code.
UPCAST = INTERPRETED


@dataclass(frozen=True)
class TileConfig:
    """Tile shape and launch parameters of one brgemm_kernel compilation."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    #: Untuned, where these tiles come first among a layer's candidates and the shipped table
    #: lacks the layer, whether they keep their place over the choice of a similar layer of
    #: another kind of tiles (algos/tiles.py, tune).
    first_over_similar: ClassVar[bool] = False

    def base(self) -> TileConfig:
        """These tiles' shape and launch parameters alone, without a subclass's choices."""
        return TileConfig(**{f.name: getattr(self, f.name) for f in fields(TileConfig)})


@dataclass(frozen=True)
class TmaGemmTiles(TileConfig):
    """Tiles of the TMA GEMM on plain matrices (kernels/gemm_tma.py), with its split of the
    reduction (1: none), which the tile tuner chooses along with the shape."""

    splits: int = 1


def _launch_hooks_installed() -> bool:
    """Whether a launch hook (a profiler such as proton) is installed: an empty HookChain in
    Triton 3.6, None in earlier versions, when there is none."""
    hook = knobs.runtime.launch_enter_hook
    return hook is not None and bool(getattr(hook, "calls", True))


class _Compiled:
    """A compiled kernel and what its launcher needs besides the arguments."""

    def __init__(self, kernel):
        self.kernel = kernel
        launcher = kernel.run  # loads the module on first access, which sets kernel.function
        self.function = kernel.function
        self.metadata = kernel.packed_metadata
        self.launcher = launcher
        # The C entry point takes the launch flags and scratch pointers itself; a kernel that
        # needs scratch memory goes through the Python wrapper, which allocates it.
        scratch = launcher.global_scratch_size > 0 or launcher.profile_scratch_size > 0
        self.c_launch = None if scratch else launcher.launch
        self.flags = (launcher.launch_cooperative_grid, launcher.launch_pdl)
        # Host-side tensor descriptors: Triton's wrapper of the C entry point encodes a
        # CUtensorMap for each at every call (a driver call). rtdnn encodes each once per
        # address instead and calls the C entry point itself.
        self.descriptors: tuple[tuple[int, dict], ...] = ()
        self.tensor_maps: dict[tuple[int, int], list] = {}
        wrapped = _descriptor_wrapper_parts(launcher.launch)
        if self.c_launch is not None and wrapped is not None and make_tensordesc_arg is not None:
            self.c_launch, self.descriptors = wrapped

    def with_tensor_maps(self, args: list) -> list:
        """args with each host-side tensor descriptor replaced by what the C entry point takes
        for it: its CUtensorMap, then its shape and strides. A descriptor's shape, strides and
        block are part of the compiled kernel's key, so its address alone picks the map; the
        maps hold addresses, not tensors, and one encoded for an address stays right for
        any tensor later placed there with the same shape and strides."""
        out: list = []
        start = 0
        maps = self.tensor_maps
        for position, meta in self.descriptors:
            out += args[start:position]
            desc = args[position]
            key = (position, desc.base.data_ptr())
            encoded = maps.get(key)
            if encoded is None:
                if len(maps) >= 1024:  # a bound on what many addresses keep
                    maps.clear()
                encoded = maps[key] = make_tensordesc_arg(desc, meta)
            out += encoded
            start = position + 1
        out += args[start:]
        return out


def _descriptor_wrapper_parts(launch) -> tuple[object, tuple[tuple[int, dict], ...]] | None:
    """(the C entry point, ((argument position, descriptor metadata), ...)) when `launch` is
    Triton 3.6's tensor-descriptor wrapper (driver.wrap_handle_tensordesc) around it with
    metadata for every descriptor; None otherwise (no descriptors, or a Triton whose wrapper
    differs: its own path is then used)."""
    code = getattr(launch, "__code__", None)
    if code is None or launch.__closure__ is None:
        return None
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in launch.__closure__), strict=True))
    entry, indices = cells.get("launcher"), cells.get("tensordesc_indices")
    metas = cells.get("tensordesc_meta")
    if entry is None or not indices or metas is None or any(m is None for m in metas):
        return None
    return entry, tuple(zip(sorted(indices), metas, strict=True))


def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Global scratch memory for a launch (e.g. the tensor descriptors a kernel builds),
    from PyTorch's caching allocator on the current device and stream."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


@contextlib.contextmanager
def _scratch_allocator() -> Iterator[None]:
    """Triton asks the allocator set by triton.set_allocator for a kernel's scratch memory;
    rtdnn's launches use _scratch and give the caller's allocator back afterwards (Triton
    3.6 keeps it in a ContextVar in triton.runtime._allocation)."""
    token = _allocation._allocator.set(_scratch)
    try:
        yield
    finally:
        _allocation._allocator.reset(token)


class SlotLaunch:
    """One @triton.jit kernel with a fixed grid and fixed arguments, and holes ("slots") for the
    arguments that change between calls (tensors, alpha, beta, seeds), given by position.

    The first call with a new argument signature on a device goes through Triton's JIT,
    compiling if needed; later calls fill the slots and call that compiled
    kernel's C launcher on the current stream. Memory-bound kernels take a few microseconds on
    the GPU, so the host must not take longer: tensors go to the launcher as raw device
    addresses, which spares it a data_ptr() call and a driver query per pointer (the tensors'
    devices were checked when the call was prepared). A call whose values key as the last
    call's did (the usual case: a layer repeats its launches) goes through that key's
    generated launcher (_fast_launcher), which checks each slot and launches without
    building the key.
    """

    def __init__(self, fn, grid: tuple[int, ...], options: dict, slots: tuple[str, ...], **fixed):
        names = list(fn.arg_names)
        missing = set(names) - set(fixed) - set(slots)
        if missing:
            raise TypeError(f"{fn.__name__}: no value for {sorted(missing)}")
        self.fn = fn
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.options = options
        self.template = [fixed.get(n) for n in names]
        self.index = [names.index(s) for s in slots]
        # Slots that are compile-time constants (Triton's compiled functions list their
        # positions; the interpreter's do not, and it compiles nothing).
        constexprs = set(getattr(fn, "constexprs", ()))
        self.constant = [i in constexprs for i in self.index]
        self.compiled: dict[tuple, _Compiled] = {}
        # key -> its launcher (_fast_launcher; None where a slot's kind has none), and the
        # last call's (device, launcher): most calls repeat the last one's key.
        self.launchers: dict[tuple, object] = {}
        self.fast: tuple | None = None

    def _bind(self, values) -> list:
        """Every argument of the kernel, the slots filled with `values` as Triton's JIT takes
        them (bound descriptor views as its own descriptors)."""
        args = self.template.copy()
        for i, v in zip(self.index, values, strict=True):
            args[i] = v.materialize() if type(v) is BoundDescriptor else v
        return args

    def __call__(self, *values) -> None:
        if INTERPRETED:
            self.fn[self.grid](*self._bind(values), **self.options)
            return
        # CUDA is initialized here: the tensors live on it.
        device = torch._C._cuda_getDevice()
        fast = self.fast
        if fast is not None and fast[0] == device and fast[1](values):
            return  # launched as the last call was (_fast_launcher)
        key, args = self._signature(device, values)
        compiled = self.compiled.get(key)
        if compiled is None or compiled.c_launch is None or _launch_hooks_installed():
            self._slow_path(key, compiled, values)
            return
        launcher = self.launchers.get(key, False)
        if launcher is False:
            launcher = self.launchers[key] = _fast_launcher(self, values, compiled, device)
        self.fast = None if launcher is None else (device, launcher)
        if compiled.descriptors:
            args = compiled.with_tensor_maps(args)
        gx, gy, gz = self.grid
        coop, pdl = compiled.flags
        compiled.c_launch(
            gx, gy, gz, torch._C._cuda_getCurrentRawStream(device), compiled.function, coop,
            pdl, None, None, compiled.metadata, None, None, None, *args,
        )  # fmt: skip

    def _signature(self, device: int, values) -> tuple[tuple, list]:
        """The compiled kernel's key for these slot values, and every argument of the kernel
        as its C launcher takes them (tensors as raw addresses).

        The key holds what Triton specializes a compiled kernel on, for the arguments that
        change between calls: each tensor's dtype and 16-byte alignment, each int's
        divisibility by 16, equality to 1 and 32-bit range, and the value itself of anything
        else (a compile-time constant such as BETA_NONZERO, or None), as each value compiles
        a kernel of its own; and the device, as a compiled module is loaded on the device
        current when it was first launched.

        Tensors, most of the slots, come first and add two entries, their dtype and their
        alignment, where every other value adds one: only a tensor adds a dtype, so the
        flat key still says which slot held what.
        """
        args = self.template.copy()
        sig = [device]
        append = sig.append
        for i, constant, v in zip(self.index, self.constant, values, strict=True):
            if not constant and isinstance(v, torch.Tensor):
                ptr = v.data_ptr()
                append(v.dtype)
                append(not ptr & 15)
                args[i] = ptr
                continue
            kind = type(v)
            if constant:
                append((kind, v))
                args[i] = v
            elif kind is float:
                append(float)
                args[i] = v
            elif kind is int:
                append(((v & 15) == 0, v == 1, -(2**31) <= v < 2**31))
                args[i] = v
            elif kind is BoundDescriptor:
                # The view's number stands for its shape, strides, block and layout (what the
                # descriptor's branch below keys); the base's dtype and alignment as for it.
                base = v.base
                append((kind, v.view.key, base.dtype, (base.data_ptr() & 15) == 0))
                args[i] = v
            elif kind in _DESCRIPTORS:
                # A host-side TMA descriptor (_Compiled.with_tensor_maps encodes it). The key
                # holds all of it but the address, so that it is at least as fine as
                # Triton's specialization (the base's dtype, the block shape, Gluon's layout).
                base = v.base
                append((
                    kind, base.dtype, (base.data_ptr() & 15) == 0, tuple(v.shape),
                    tuple(v.strides), tuple(v.block_shape), v.padding, getattr(v, "layout", None),
                ))  # fmt: skip
                args[i] = v
            elif kind is tuple:  # tensors read together (an operand and its index table)
                ptrs = tuple(e.data_ptr() for e in v)
                append(tuple((e.dtype, (q & 15) == 0) for e, q in zip(v, ptrs, strict=True)))
                args[i] = ptrs
            else:
                append((kind, v))
                args[i] = v
        return tuple(sig), args

    def _slow_path(self, key: tuple, compiled: _Compiled | None, values) -> None:
        """Triton's own launch path, with the tensors themselves: the first call of a signature
        (which compiles or loads the kernel), kernels that need scratch memory, and calls
        while a launch hook (a profiler) is installed."""
        args = self._bind(values)
        with _scratch_allocator():
            if compiled is None:
                self.compiled[key] = _Compiled(self.fn[self.grid](*args, **self.options))
            else:
                compiled.kernel[self.grid](*args)


def _fast_launcher(launch: SlotLaunch, values: tuple, compiled: _Compiled, device: int):
    """A function of later calls' slot values that launches `compiled` on `device`'s current
    stream and returns True where the values key as `values` do, else returns False having
    done nothing (and where a launch hook is installed, whose calls take Triton's road): a
    repeated launch without building and hashing its key. None where a slot holds a kind
    with no check here (host-side TMA descriptors, tuples of tensors: those keep the key).
    It is generated Python, one line per check, as Triton binds a JIT function's arguments;
    for slots (X, alpha) of a kernel (X, alpha, n, BLOCK) called with a float32 tensor at an
    aligned address and a float, its source reads

        def launch(values):
            v0, v1 = values
            try:
                if not (v0.dtype is D0 and type(v1) is float):
                    return False
                p0 = v0.data_ptr()
            except AttributeError:  # not a tensor where a tensor was
                return False
            if p0 & 15:
                return False
            if HOOKS():
                return False
            args = [p0, v1, T2, T3]
            c = COMPILED
            c.c_launch(GX, GY, GZ, STREAM(DEVICE), c.function, COOP, PDL, None, None,
                       c.metadata, None, None, None, *args)
            return True

    (D0 float32, T2 and T3 the fixed n and BLOCK; with host-side descriptors, the arguments
    pass through COMPILED.with_tensor_maps first.)"""
    source = _binding_source(launch, values)
    if source is None:
        return None
    names, lines, items = source
    (gx, gy, gz), (coop, pdl) = launch.grid, compiled.flags
    names.update(
        COMPILED=compiled, DEVICE=device, HOOKS=_launch_hooks_installed, GX=gx, GY=gy, GZ=gz,
        COOP=coop, PDL=pdl, STREAM=torch._C._cuda_getCurrentRawStream,
    )  # fmt: skip
    body = [
        "    if HOOKS():", "        return False", f"    args = [{items}]", "    c = COMPILED",
    ]  # fmt: skip
    if compiled.descriptors:
        body.append("    args = c.with_tensor_maps(args)")
    body += [
        "    c.c_launch(GX, GY, GZ, STREAM(DEVICE), c.function, COOP, PDL, None, None,",
        "               c.metadata, None, None, None, *args)",
        "    return True",
    ]
    lines = ["def launch(values):", *lines, *body]
    exec("\n".join(lines), names)  # noqa: S102 (the source is built from names only)
    return names["launch"]


def _binding_source(launch: SlotLaunch, values: tuple) -> tuple[dict, list[str], str] | None:
    """(names, lines, argument list) of _fast_launcher's checks that `values`' key holds: the
    lines check each slot and read the tensors' addresses into p0, p1, ..., returning False
    where a check fails; the argument list is every argument of the kernel in order, tensors
    as those addresses. None where a slot holds a kind with no check here."""
    names: dict[str, object] = {"BoundDescriptor": BoundDescriptor}
    items = [f"T{j}" for j in range(len(launch.template))]
    for j, value in enumerate(launch.template):
        names[f"T{j}"] = value
    checks, reads, aligned, unaligned = [], [], [], []
    for n, (i, constant, v) in enumerate(zip(launch.index, launch.constant, values, strict=True)):
        kind = type(v)
        if not constant and isinstance(v, torch.Tensor):
            names[f"D{n}"] = v.dtype
            checks.append(f"v{n}.dtype is D{n}")  # a torch dtype: a tensor's
            reads.append(f"p{n} = v{n}.data_ptr()")
            (unaligned if v.data_ptr() & 15 else aligned).append(f"p{n}")
            items[i] = f"p{n}"
        elif kind is BoundDescriptor:
            names[f"D{n}"], names[f"K{n}"] = v.base.dtype, v.view.key
            checks.append(
                f"type(v{n}) is BoundDescriptor and v{n}.view.key == K{n} "
                f"and v{n}.base.dtype is D{n}"
            )
            reads.append(f"p{n} = v{n}.base.data_ptr()")
            (unaligned if v.base.data_ptr() & 15 else aligned).append(f"p{n}")
            items[i] = f"v{n}"
        elif kind is int and not constant:
            names[f"S{n}"] = ((v & 15) == 0, v == 1, -(2**31) <= v < 2**31)
            checks.append(
                f"type(v{n}) is int and "
                f"((v{n} & 15) == 0, v{n} == 1, -2147483648 <= v{n} < 2147483648) == S{n}"
            )
            items[i] = f"v{n}"
        elif kind is float and not constant:
            checks.append(f"type(v{n}) is float")
            items[i] = f"v{n}"
        elif kind in (bool, int, float, str, type(None)):
            # A compile-time constant, or a value keyed as itself: the same type and value.
            names[f"K{n}"], names[f"C{n}"] = kind, v
            checks.append(f"type(v{n}) is K{n} and v{n} == C{n}")
            items[i] = f"v{n}"
        else:
            return None
    lines = []
    if values:
        lines.append(f"    {', '.join(f'v{n}' for n in range(len(values)))}, = values")
    # A value of another kind where a tensor was has no dtype (or data_ptr): not this key.
    lines.append("    try:")
    if checks:
        lines += [f"        if not ({' and '.join(checks)}):", "            return False"]
    lines += [f"        {read}" for read in reads] or ["        pass"]
    lines += ["    except AttributeError:", "        return False"]
    if aligned:
        lines += [f"    if ({' | '.join(aligned)}) & 15:", "        return False"]
    for p in unaligned:
        lines += [f"    if not {p} & 15:", "        return False"]
    return names, lines, ", ".join(items)


_launches: dict[tuple, SlotLaunch] = {}


def slot_launch(
    fn,
    grid: tuple[int, ...],
    slots: tuple[str, ...],
    num_warps: int = 4,
    cooperative: bool = False,
    num_stages: int | None = None,
    maxnreg: int | None = None,
    **fixed,
) -> SlotLaunch:
    """A SlotLaunch of fn with these launch options, for a caller that keeps it (a prepared
    call); launch_cached keeps one per key for callers that keep nothing. cooperative: a
    cooperative launch, for kernels whose programs wait on each other: CUDA runs every
    program at once or refuses the launch (an error, never a hang). num_stages: the software
    pipeline's depth (Triton's default when None). maxnreg: registers a thread at launch (a
    warp-specialized Gluon kernel's partitions then trade them)."""
    options = dict(num_warps=num_warps)
    if num_stages is not None:
        options["num_stages"] = num_stages
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    if cooperative and not INTERPRETED:
        options["launch_cooperative_grid"] = True
    return SlotLaunch(fn, grid, options, tuple(slots), **fixed)


def launch_cached(
    fn,
    grid: tuple[int, ...],
    slots: dict,
    num_warps: int = 4,
    cooperative: bool = False,
    num_stages: int | None = None,
    **fixed,
) -> None:
    """fn[grid](**slots, **fixed, num_warps=num_warps) through a SlotLaunch kept per (kernel,
    grid, warps, cooperative, stages, slot names, fixed arguments): for ops that keep no
    prepared call of their own. Triton's own launch path costs tens of microseconds per call,
    more than many small kernels run; this costs a dictionary lookup (of a key as long as the
    arguments: a prepared call's slot_launch skips even that). `fixed` holds what is the same
    from call to call for a problem (sizes, strides, compile-time constants; all hashable),
    `slots` the tensors and scalars that change (alpha, beta; host-side tensor descriptors
    too). See slot_launch for the options."""
    key = (fn, grid, num_warps, cooperative, num_stages, *slots, *fixed.items())
    launch = _launches.get(key)
    if launch is None:
        if len(_launches) >= 4096:  # a bound on what many distinct problems keep alive
            _launches.clear()
        launch = _launches[key] = slot_launch(
            fn, grid, tuple(slots), num_warps, cooperative, num_stages, **fixed
        )
    launch(*slots.values())


class KernelLaunch(SlotLaunch):
    """A SlotLaunch whose changing arguments are given by name: the names of the first call's
    keyword arguments become the slots, and every later call must name the same ones."""

    def __init__(self, fn, grid: tuple[int, ...], options: dict, **args):
        self._setup = (fn, grid, options, args)
        self.slots: tuple[str, ...] | None = None

    def __call__(self, **changes) -> None:
        if self.slots is None:
            fn, grid, options, args = self._setup
            self.slots = tuple(changes)
            fixed = {k: v for k, v in args.items() if k not in changes}
            super().__init__(fn, grid, options, self.slots, **fixed)
        super().__call__(*[changes[name] for name in self.slots])


@dataclass(frozen=True)
class Operand:
    """How a GEMM operand is addressed: setup and load functions and their geometry tuple."""

    setup: object
    load: object
    geo: tuple


@dataclass(frozen=True)
class Output:
    addr: object
    geo: tuple


class BrgemmLaunch:
    """C[b] = act(alpha * sum_t A[b, t] @ B[b, t] + bias + beta * C[b]) for b < batches.

    Sizes, addressing and tiles are fixed at construction; call with the tensors. With
    splits > 1 the workspace must hold `partial_bytes` bytes of float32 partial sums. Below
    FINISH_APART_FROM splits the last split of each tile sums them in the same launch (the
    tiles count their arrivals in the current stream's counters, core.handle); from there on
    a second launch does (split_finish).
    """

    #: From this many splits the partial sums are finished by a launch of their own: a tile's
    #: last split summing 32 partial tiles alone took longer than the GEMM itself (ResNet-50's
    #: 1x1 weight gradients on the TMA GEMM, 2x slower than with a second launch, H200).
    #: Below it, where the finish is short, the second launch's own cost is not worth paying;
    #: where exactly the two cross has not been measured.
    FINISH_APART_FROM = 16

    def __init__(
        self,
        a: Operand,
        b: Operand,
        c: Output,
        *,
        m: int,
        n: int,
        steps: int,
        batches: int,
        tiles: TileConfig,
        precision: str = "ieee",
        activation=identity,
        splits: int = 1,
    ):
        # steps == 0 is valid: C = beta * C + bias (e.g. pixels no filter tap reaches).
        splits = max(1, min(splits, steps))
        self.steps_per_split = cdiv(steps, splits)
        self.splits = cdiv(steps, self.steps_per_split) if steps else 1
        self.partial_bytes = batches * self.splits * m * n * 4 if self.splits > 1 else 0
        self.tiles = cdiv(m, tiles.block_m) * cdiv(n, tiles.block_n)
        self.config = dict(
            a=a, b=b, c=c, m=m, n=n, steps=steps, batches=batches, tiles=tiles,
            precision=precision, activation=activation,
        )  # fmt: skip
        self.finish_apart = self.splits >= self.FINISH_APART_FROM
        self._variants: dict[tuple[bool, bool], tuple[SlotLaunch, SlotLaunch | None]] = {}

    def _variant(self, has_bias: bool, beta_nonzero: bool):
        cfg = self.config
        a, b, c, t = cfg["a"], cfg["b"], cfg["c"], cfg["tiles"]
        m, n = cfg["m"], cfg["n"]
        flags = dict(
            ACTIVATION=cfg["activation"], HAS_BIAS=has_bias, BETA_NONZERO=beta_nonzero,
            SPLITS=self.splits,
        )  # fmt: skip
        # Each distinct geometry is passed once; the operands pick theirs by index.
        geos: list[tuple] = []
        for g in (a.geo, b.geo, c.geo):
            if g not in geos:
                geos.append(g)
        finish = None
        if self.finish_apart:
            finish = split_finish(
                c, m, n, cfg["batches"], self.splits, ACTIVATION=cfg["activation"],
                HAS_BIAS=has_bias, BETA_NONZERO=beta_nonzero,
            )  # fmt: skip
        return SlotLaunch(
            brgemm_kernel,
            (self.tiles, cfg["batches"] * self.splits),
            dict(num_warps=t.num_warps, num_stages=t.num_stages),
            ("A", "B", "C", "BIAS", "WS", "ARRIVALS", "alpha", "beta"), geos=tuple(geos),
            A_GEO=geos.index(a.geo), B_GEO=geos.index(b.geo), C_GEO=geos.index(c.geo), M=m, N=n,
            STEPS=cfg["steps"], steps_per_split=self.steps_per_split,
            A_SETUP=a.setup, A_LOAD=a.load, B_SETUP=b.setup, B_LOAD=b.load, C_ADDR=c.addr,
            PRECISION=cfg["precision"], UPCAST=UPCAST, BLOCK_M=t.block_m,
            BLOCK_N=t.block_n, BLOCK_K=t.block_k, GROUP_M=t.group_m,
            FINISH=not self.finish_apart, **flags,
        ), finish  # fmt: skip

    def __call__(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        c: torch.Tensor,
        *,
        alpha: float = 1.0,
        beta: float = 0.0,
        bias: torch.Tensor | None = None,
        workspace: torch.Tensor | None = None,
    ) -> None:
        key = (bias is not None, beta != 0)
        launches = self._variants.get(key)
        if launches is None:
            launches = self._variants[key] = self._variant(*key)
        launch, finish = launches
        ws = arrivals = c  # not read without split-K (nor the counters with a finish apart)
        if self.splits > 1:
            ws = workspace.view(torch.float32)
            if finish is None:
                arrivals = stream_counters(c.device, self.tiles * self.config["batches"])
        bias_arg = bias if bias is not None else c
        alpha, beta = float(alpha), float(beta)
        launch(a, b, c, bias_arg, ws, arrivals, alpha, beta)
        if finish is not None:
            finish(ws, c, bias_arg, alpha, beta)


#: The split finish's tiles, the first that gives FINISH_PROGRAMS programs or more.
FINISH_TILES = ((64, 64), (32, 64), (16, 64), (16, 32), (8, 32))
FINISH_PROGRAMS = 256  # about two per multiprocessor on the largest GPUs


def split_finish(c: Output, m: int, n: int, batches: int, splits: int, **flags) -> SlotLaunch:
    """The launch that sums a split GEMM's float32 partials (workspace [batches, splits, m,
    n]) in split order into C, addressed by `c`, with the epilogue `flags` (ACTIVATION,
    HAS_BIAS, BETA_NONZERO): brgemm.split_finish_kernel over tiles small enough that every
    multiprocessor takes a share. Slots: WS, C, BIAS, alpha, beta."""
    bm, bn = next(
        (t for t in FINISH_TILES if cdiv(m, t[0]) * cdiv(n, t[1]) * batches >= FINISH_PROGRAMS),
        FINISH_TILES[-1],
    )
    return SlotLaunch(
        split_finish_kernel, (cdiv(m, bm), cdiv(n, bn), batches), dict(num_warps=4),
        ("WS", "C", "BIAS", "alpha", "beta"), geos=(c.geo,), M=m, N=n, C_GEO=0, C_ADDR=c.addr,
        SPLITS=splits, BLOCK_M=bm, BLOCK_N=bn, **flags,
    )  # fmt: skip


@dataclass(frozen=True)
class MatrixLayout:
    """How a GEMM operand sits in memory: a rows x cols matrix, stored as it is (row stride
    `stride`, unit column stride) or, when `transposed`, as its cols x rows transpose (unit
    stride along rows)."""

    rows: int
    cols: int
    stride: int
    transposed: bool

    @classmethod
    def of(cls, rows: int, cols: int, s_row: int, s_col: int) -> MatrixLayout | None:
        """The layout of a rows x cols matrix with these strides, or None when neither
        dimension has a unit stride (or the matrix is one row or column, whose other stride
        is arbitrary)."""
        if rows == 1 or cols == 1:
            return None
        if s_col == 1:
            return cls(rows, cols, s_row, False)
        if s_row == 1:
            return cls(rows, cols, s_col, True)
        return None

    def stored(self) -> tuple[list[int], list[int]]:
        """The shape and strides of the stored (unit-stride last) matrix."""
        if self.transposed:
            return [self.cols, self.rows], [self.stride, 1]
        return [self.rows, self.cols], [self.stride, 1]


class TmaGemmLaunch:
    """C = act(alpha * A @ B + bias + beta * C), A (m x k) and B (k x n) plain matrices read
    through TMA descriptors (kernels/gemm_tma.py), C any m x n strides. Fixed at construction
    like BrgemmLaunch, and called the same way (split: `partial_bytes` of workspace, summed by
    a second launch); the caller checks that both operands' bases are 16-byte aligned (the
    copy engine's rule) before each call.
    """

    def __init__(
        self,
        a: MatrixLayout,
        b: MatrixLayout,
        c_strides: tuple[int, int],
        *,
        tiles: TmaGemmTiles,
        programs: int,
        precision: str = "ieee",
        activation=identity,
    ):
        m, k, n = a.rows, a.cols, b.cols
        bm, bn, bk = tiles.block_m, tiles.block_n, tiles.block_k
        k_tiles = cdiv(k, bk)
        splits = max(1, min(tiles.splits, k_tiles))
        splits = cdiv(k_tiles, cdiv(k_tiles, splits))  # none left empty
        self.splits = splits
        self.partial_bytes = splits * m * n * 4 if splits > 1 else 0
        self.a_view = DescriptorView(*a.stored(), [bk, bm] if a.transposed else [bm, bk])
        self.b_view = DescriptorView(*b.stored(), [bn, bk] if b.transposed else [bk, bn])
        jobs = cdiv(m, bm) * cdiv(n, bn) * splits
        self.gemm = dict(
            M=m, N=n, K=k, stride_cm=c_strides[0], stride_cn=c_strides[1],
            A_T=a.transposed, B_T=b.transposed, ACTIVATION=activation, SPLITS=splits,
            NUM_PROGRAMS=max(1, min(jobs, programs)), PRECISION=precision, UPCAST=UPCAST,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=tiles.group_m,
        )  # fmt: skip
        self.options = dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages)
        self.activation = activation
        # The output as the split finish addresses it: a strided m x n matrix.
        self.c = Output(
            strided_c_addr, StridedGeometry(m, n, 1, 0, 0, 0, c_strides[0], c_strides[1], 0)
        )
        self._variants: dict[tuple[bool, bool], tuple[SlotLaunch, SlotLaunch | None]] = {}

    def _variant(self, has_bias: bool, beta_nonzero: bool):
        flags = dict(HAS_BIAS=has_bias, BETA_NONZERO=beta_nonzero)
        gemm = SlotLaunch(
            gemm_tma_kernel, (self.gemm["NUM_PROGRAMS"],), self.options,
            ("A", "B", "C", "BIAS", "WS", "alpha", "beta"), **flags, **self.gemm,
        )  # fmt: skip
        if self.splits == 1:
            return gemm, None
        m, n = self.gemm["M"], self.gemm["N"]
        return gemm, split_finish(self.c, m, n, 1, self.splits, ACTIVATION=self.activation, **flags)

    def __call__(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        c: torch.Tensor,
        *,
        alpha: float = 1.0,
        beta: float = 0.0,
        bias: torch.Tensor | None = None,
        workspace: torch.Tensor | None = None,
    ) -> None:
        key = (bias is not None, beta != 0)
        launches = self._variants.get(key)
        if launches is None:
            launches = self._variants[key] = self._variant(*key)
        gemm, finish = launches
        a_desc = self.a_view.bind(a)
        b_desc = self.b_view.bind(b)
        bias_arg = bias if bias is not None else c
        alpha, beta = float(alpha), float(beta)
        if finish is None:
            gemm(a_desc, b_desc, c, bias_arg, c, alpha, beta)
            return
        ws = workspace.view(torch.float32)
        gemm(a_desc, b_desc, c, bias_arg, ws, alpha, beta)
        finish(ws, c, bias_arg, alpha, beta)
