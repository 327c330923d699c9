"""SlotLaunch's key for a compiled kernel: every value that compiles a kernel of its own must
be in it, or a later call runs the kernel compiled for an earlier value (the compiled launch
path runs on the GPU only, so the key is checked here directly)."""

import torch
import triton.language as tl
from triton.runtime.jit import JITFunction

from rtdnn.kernels.launch import SlotLaunch, _Compiled, _descriptor_wrapper_parts


def _kernel(X, alpha, n, FLAG: tl.constexpr, BLOCK: tl.constexpr):  # never launched
    pass


# Compiled-mode JITFunction even under TRITON_INTERPRET, which only the key needs.
KERNEL = JITFunction(_kernel)


def _key(*values) -> tuple:
    launch = SlotLaunch(KERNEL, (1,), {}, ("X", "alpha", "n", "FLAG", "BLOCK"))
    return launch._signature(0, values)[0]


def test_a_constant_slot_keys_by_value():
    x = torch.empty(16)
    assert _key(x, 1.0, 32, True, 16) != _key(x, 1.0, 32, False, 16)
    assert _key(x, 1.0, 32, True, 16) != _key(x, 1.0, 32, True, 32)
    # Run-time values share a kernel where Triton's specialization does not tell them apart.
    assert _key(x, 1.0, 32, True, 16) == _key(x, 0.5, 48, True, 16)
    assert _key(x, 1.0, 32, True, 16) != _key(x, 1.0, 1, True, 16)  # n == 1 specializes
    assert _key(x, 1.0, 32, True, 16) != _key(x.half(), 1.0, 32, True, 16)


def test_arguments_in_kernel_order_with_tensors_as_addresses():
    x = torch.empty(16)
    args = SlotLaunch(KERNEL, (1,), {}, ("X", "FLAG"), alpha=2.0, n=7, BLOCK=16)._signature(
        0, (x, True)
    )[1]
    assert args == [x.data_ptr(), 2.0, 7, True, 16]


def test_a_tensor_descriptor_keys_by_everything_but_its_address():
    """Host-side TMA descriptors (attention's tiles) go to Triton's launcher as they are, which
    builds each one's CUtensorMap; the key tells apart every geometry Triton could specialize
    on, and descriptors of two tensors with the same geometry share a kernel."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    def desc(t, block=(1, 1, 64, 64)):
        return TensorDescriptor(t, list(t.shape), list(t.stride()), list(block))

    x, y = torch.empty(2, 3, 128, 64), torch.empty(2, 3, 128, 64)
    assert _key(desc(x), 1.0, 32, True, 16) == _key(desc(y), 1.0, 32, True, 16)
    assert _key(desc(x), 1.0, 32, True, 16) != _key(desc(x, (1, 1, 128, 64)), 1.0, 32, True, 16)
    assert _key(desc(x), 1.0, 32, True, 16) != _key(desc(x.half()), 1.0, 32, True, 16)
    z = torch.empty(2, 3, 256, 64)
    assert _key(desc(x), 1.0, 32, True, 16) != _key(desc(z), 1.0, 32, True, 16)
    launch = SlotLaunch(KERNEL, (1,), {}, ("X",), alpha=2.0, n=7, FLAG=True, BLOCK=16)
    d = desc(x)
    assert launch._signature(0, (d,))[1][0] is d  # Triton's launcher expands it


def test_a_missing_argument_is_refused():
    """A launch without a value for every argument fails when it is made. (Extra names are
    allowed: ops pass one dict of sizes to kernels that take some of them.)"""
    import pytest

    with pytest.raises(TypeError, match=r"no value for \['BLOCK'\]"):
        SlotLaunch(KERNEL, (1,), {}, ("X",), alpha=2.0, n=7, FLAG=True)


class _FakeCompiled(_Compiled):
    """What SlotLaunch keeps of a compiled kernel, with a C launcher that records its calls
    (and, given `descriptors`, takes host-side tensor descriptors at those positions)."""

    def __init__(self, descriptors=()):
        self.function, self.metadata, self.flags = "function", "metadata", (False, True)
        self.calls = []
        self.c_launch = lambda *args: self.calls.append(args)
        self.descriptors, self.tensor_maps = descriptors, {}


def test_a_prepared_launch_calls_the_c_launcher_with_raw_addresses(monkeypatch):
    """The GPU's road after a kernel is compiled, run with its CUDA calls stood in for: the
    grid, the current stream and the compiled kernel's function and flags, then every
    argument in the kernel's order, tensors as addresses; a value that compiles another
    kernel takes Triton's own road."""
    from rtdnn.kernels import launch

    monkeypatch.setattr(launch, "INTERPRETED", False)
    # (A CPU build of torch has neither function.)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)
    slow = []
    monkeypatch.setattr(SlotLaunch, "_slow_path", lambda self, *a: slow.append(a))
    run = SlotLaunch(KERNEL, (3, 2), {}, ("X", "alpha", "FLAG"), n=7, BLOCK=16)
    x = torch.empty(16)
    fake = _FakeCompiled()
    run.compiled[run._signature(0, (x, 0.5, True))[0]] = fake
    run(x, 0.5, True)
    assert fake.calls == [
        (3, 2, 1, 1234, "function", False, True, None, None, "metadata", None, None, None,
         x.data_ptr(), 0.5, 7, True, 16)
    ]  # fmt: skip
    run(x, 0.25, False)  # FLAG=False compiles a kernel of its own
    assert len(fake.calls) == 1 and len(slow) == 1


def test_triton_s_descriptor_wrapper_is_unwrapped():
    """Triton's launcher wraps its C entry point to encode host-side tensor descriptors at
    every call; SlotLaunch takes the entry point and the descriptors' positions and metadata
    from that wrapper, and leaves a launcher it does not recognize alone."""
    from triton.backends.nvidia.driver import wrap_handle_tensordesc

    def entry(*args):
        return args

    signature = {"A": "tensordesc<bf16[64, 64]>", "n": "i32", "B": "tensordesc<bf16[64, 32]>"}
    metas = [{"swizzle": 128}, {"swizzle": 64}]
    assert _descriptor_wrapper_parts(wrap_handle_tensordesc(entry, signature, metas)) == (
        entry, ((0, metas[0]), (2, metas[1])),
    )  # fmt: skip
    assert _descriptor_wrapper_parts(wrap_handle_tensordesc(entry, signature, None)) is None
    assert _descriptor_wrapper_parts(wrap_handle_tensordesc(entry, {"n": "i32"}, None)) is None
    assert _descriptor_wrapper_parts(print) is None


def test_a_tensor_descriptor_is_encoded_once_per_address(monkeypatch):
    """A descriptor slot reaches the C launcher as its encoded map, shape and strides, encoded
    at the first call with its tensor's address and reused by later calls at that address."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from rtdnn.kernels import launch

    monkeypatch.setattr(launch, "INTERPRETED", False)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)
    encoded = []

    def encode(desc, meta):
        encoded.append((desc.base.data_ptr(), meta))
        return [f"map{len(encoded)}", *desc.shape, *desc.strides]

    monkeypatch.setattr(launch, "make_tensordesc_arg", encode)
    run = SlotLaunch(KERNEL, (1,), {}, ("X", "alpha"), n=7, FLAG=True, BLOCK=16)
    x, y = torch.empty(64, 32), torch.empty(64, 32)

    def desc(t):
        return TensorDescriptor(t, [64, 32], [32, 1], [16, 16])

    fake = _FakeCompiled(descriptors=((0, {"swizzle": 64}),))
    run.compiled[run._signature(0, (desc(x), 0.5))[0]] = fake
    run(desc(x), 0.5)
    run(desc(x), 0.25)
    run(desc(y), 0.5)
    assert encoded == [(x.data_ptr(), {"swizzle": 64}), (y.data_ptr(), {"swizzle": 64})]
    head = (1, 1, 1, 1234, "function", False, True, None, None, "metadata", None, None, None)
    assert fake.calls == [
        (*head, "map1", 64, 32, 32, 1, 0.5, 7, True, 16),
        (*head, "map1", 64, 32, 32, 1, 0.25, 7, True, 16),
        (*head, "map2", 64, 32, 32, 1, 0.5, 7, True, 16),
    ]


def test_a_bound_descriptor_view_keys_as_the_descriptor_does():
    """A descriptor view bound to each call's tensor (what the Hopper convolutions and the TMA
    GEMM prepare once) keys as the TensorDescriptor it stands for: by shape, strides, block,
    dtype and alignment, not by address; equal views share a number; the launch takes the
    bound view itself, and Triton's JIT a checked TensorDescriptor with the same fields."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from rtdnn.kernels.launch import BoundDescriptor, DescriptorView

    def view(t, block=(1, 1, 64, 64)):
        return DescriptorView(t.shape, t.stride(), block)

    x, y = torch.empty(2, 3, 128, 64), torch.empty(2, 3, 128, 64)
    key = _key(view(x).bind(x), 1.0, 32, True, 16)
    assert key == _key(view(y).bind(y), 1.0, 32, True, 16)  # another view, equal fields
    assert key != _key(view(x, (1, 1, 128, 64)).bind(x), 1.0, 32, True, 16)
    assert key != _key(view(x).bind(x.half()), 1.0, 32, True, 16)
    z = torch.empty(2, 3, 256, 64)
    assert key != _key(view(z).bind(z), 1.0, 32, True, 16)
    flat = torch.empty(2 * 3 * 128 * 64 + 1)
    moved = flat[1:].view(2, 3, 128, 64)  # 4 bytes past a 16-byte boundary
    assert key != _key(view(x).bind(moved), 1.0, 32, True, 16)
    # And never as a TensorDescriptor of the same fields, which the launcher takes otherwise.
    assert key != _key(TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 1, 64, 64]),
                       1.0, 32, True, 16)  # fmt: skip
    launch = SlotLaunch(KERNEL, (1,), {}, ("X",), alpha=2.0, n=7, FLAG=True, BLOCK=16)
    bound = view(x).bind(x)
    assert type(bound) is BoundDescriptor
    assert launch._signature(0, (bound,))[1][0] is bound
    real = launch._bind((bound,))[0]
    assert type(real) is TensorDescriptor and real.base is x
    assert (real.shape, real.strides, real.block_shape) == (
        list(x.shape),
        list(x.stride()),
        [1, 1, 64, 64],
    )


def test_a_bound_descriptor_view_is_encoded_once_per_address(monkeypatch):
    """As a TensorDescriptor: encoded at the first call with its tensor's address (from the
    view's shape, strides and block), reused by later calls at that address."""
    from rtdnn.kernels import launch
    from rtdnn.kernels.launch import DescriptorView

    monkeypatch.setattr(launch, "INTERPRETED", False)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)
    encoded = []

    def encode(desc, meta):
        encoded.append((desc.base.data_ptr(), desc.block_shape, meta))
        return [f"map{len(encoded)}", *desc.shape, *desc.strides]

    monkeypatch.setattr(launch, "make_tensordesc_arg", encode)
    run = SlotLaunch(KERNEL, (1,), {}, ("X", "alpha"), n=7, FLAG=True, BLOCK=16)
    x, y = torch.empty(64, 32), torch.empty(64, 32)
    view = DescriptorView([64, 32], [32, 1], [16, 16])
    fake = _FakeCompiled(descriptors=((0, {"swizzle": 64}),))
    run.compiled[run._signature(0, (view.bind(x), 0.5))[0]] = fake
    run(view.bind(x), 0.5)
    run(view.bind(x), 0.25)
    run(view.bind(y), 0.5)
    assert encoded == [(x.data_ptr(), [16, 16], {"swizzle": 64}),
                       (y.data_ptr(), [16, 16], {"swizzle": 64})]  # fmt: skip
    head = (1, 1, 1, 1234, "function", False, True, None, None, "metadata", None, None, None)
    assert fake.calls == [
        (*head, "map1", 64, 32, 32, 1, 0.5, 7, True, 16),
        (*head, "map1", 64, 32, 32, 1, 0.25, 7, True, 16),
        (*head, "map2", 64, 32, 32, 1, 0.5, 7, True, 16),
    ]


def _gpu_road(monkeypatch):
    """SlotLaunch's GPU road on the CPU: the device and stream stood in for, and Triton's own
    path (compiling) recorded instead of run."""
    from rtdnn.kernels import launch

    monkeypatch.setattr(launch, "INTERPRETED", False)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)
    slow = []
    monkeypatch.setattr(SlotLaunch, "_slow_path", lambda self, key, *a: slow.append(key))
    return slow


def test_a_repeated_launch_binds_as_the_key_does(monkeypatch):
    """A call whose values key as the last call's did takes that call's compiled kernel
    without building its key; a value that keys otherwise (another dtype, a misaligned
    address, another constant, an int that Triton specializes otherwise) takes the key's
    road and the kernel compiled for it."""
    slow = _gpu_road(monkeypatch)
    run = SlotLaunch(KERNEL, (1,), {}, ("X", "alpha", "n", "FLAG"), BLOCK=16)
    x, y = torch.empty(64), torch.empty(64)
    kernels = {}

    def compiled_for(*values):
        key = run._signature(0, values)[0]
        if key not in kernels:
            kernels[key] = run.compiled[key] = _FakeCompiled()
        return kernels[key]

    first = compiled_for(x, 0.5, 32, True)
    run(x, 0.5, 32, True)
    assert run.fast is not None and len(first.calls) == 1
    run(x, 0.5, 32, True)  # the launcher's road: what the key's road gave
    assert first.calls[1] == first.calls[0]
    run(y, 0.25, 48, True)  # the same kernel, this call's arguments
    assert first.calls[-1][13:] == (y.data_ptr(), 0.25, 48, True, 16)
    others = [
        (x.half(), 0.5, 32, True),  # dtype
        (torch.empty(65)[1:], 0.5, 32, True),  # 4 bytes past a 16-byte boundary
        (x, 0.5, 32, False),  # a compile-time constant
        (x, 0.5, 1, True),  # n == 1 specializes
        (x, 0.5, 2**31, True),  # beyond 32 bits
    ]
    for values in others:
        kernel = compiled_for(*values)
        assert kernel is not first
        run(*values)
        assert len(kernel.calls) == 1
        calls = len(first.calls)
        run(x, 0.5, 32, True)  # and back
        assert len(first.calls) == calls + 1
    assert len(first.calls) == 3 + len(others) and not slow
    run(x, 1, 32, True)  # an int where a float was: a key of its own, not compiled yet
    assert len(slow) == 1


def test_the_launcher_launches_what_the_key_launches(monkeypatch):
    """For every pair of calls among values of each slot kind (tensors of two dtypes and
    alignments, bound descriptor views, floats, ints, None, constants), the launcher made for
    the first call launches the second exactly when the two keys are equal, with the
    arguments the key's road gives."""
    import itertools

    from rtdnn.kernels.launch import DescriptorView, _fast_launcher

    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)
    run = SlotLaunch(KERNEL, (1,), {}, ("X", "alpha", "n", "FLAG"), BLOCK=16)
    t = torch.empty(129)
    view = DescriptorView([64], [1], [16])
    firsts = [t[:64], t[1:65].half(), t[1:65], None, view.bind(t[:64]), view.bind(t[1:65])]
    seconds = [*firsts, t[64:128], view.bind(t[64:128]), 0.5]
    alphas, ns, flags = [0.5, 2.0, None, 3], [32, 33, 1, 2**40], [True, False, 1]
    head = (1, 1, 1, 1234, "function", False, True, None, None, "metadata", None, None, None)
    for first in itertools.product(firsts, alphas[:2], ns[:2], flags[:2]):
        fake = _FakeCompiled()
        launch = _fast_launcher(run, first, fake, 0)
        assert launch is not None
        key = run._signature(0, first)[0]
        for second in itertools.product(seconds, alphas, ns, flags):
            other_key, args = run._signature(0, second)
            launched = launch(second)
            assert launched == (other_key == key), (first, second)
            assert fake.calls == ([(*head, *args)] if launched else [])
            fake.calls.clear()


def test_a_slot_kind_without_a_launcher_keeps_the_key(monkeypatch):
    """A host-side TensorDescriptor (its fields are keyed one by one) has no launcher: each call
    builds its key, and still reaches the kernel compiled for it."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from rtdnn.kernels import launch

    slow = _gpu_road(monkeypatch)
    monkeypatch.setattr(launch, "make_tensordesc_arg", lambda desc, meta: ["map"])
    run = SlotLaunch(KERNEL, (1,), {}, ("X", "alpha"), n=7, FLAG=True, BLOCK=16)
    x = torch.empty(64, 32)
    desc = TensorDescriptor(x, [64, 32], [32, 1], [16, 16])
    fake = _FakeCompiled(descriptors=((0, {}),))
    run.compiled[run._signature(0, (desc, 0.5))[0]] = fake
    run(desc, 0.5)
    run(desc, 0.25)
    assert run.fast is None and len(fake.calls) == 2 and not slow
