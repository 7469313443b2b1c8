"""What the kernel cache stores and how: only position-independent code (audited for every
generator), keys that cover everything generation reads, entry stubs as patched templates, kernels
that come back byte for byte and behave the same; and the bounded in-process cache."""
import gc
import json
import struct
import tempfile
import types
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tppasm as tpp
import tppasm.cache as tc
from isa.memory import mapped
from isa.x86 import Function, rax
from tests.golden import descriptors, generated
from tests.scripts import run
from tppasm import backends, kernel as tk
from tppasm.cache import disk, kernels, position, stubs
from tppasm.eltwise import Unary
from tppasm.x86.entry import Addresses, Vectorcall, build_entry


@pytest.fixture
def cache_dir(tmp_path):
    """This process uses a fresh cache in ``tmp_path`` (and its own again afterwards)."""
    with tc.using(tmp_path):
        yield tmp_path


# -- what is stored --------------------------------------------------------------------------

def test_every_generator_emits_position_independent_code():
    """The audit passes every golden descriptor on every ISA (x86 and SVE), the AMX tile
    configuration and SVE's MMLA BRGEMM: every registered generator, so every kernel is cached."""
    from tppasm.brgemm import Brgemm
    from tppasm.tiles import TileConfig, TileRelease
    from tppasm.sve.brgemm import MmlaBrgemm
    extra = {"amx": [TileConfig(Brgemm(32, 32, 32, dtype="bf16", tile_setup=False)), TileRelease()],
             "sve": [MmlaBrgemm(m=5, n=7, k=9, dtype="bf16"), MmlaBrgemm(m=8, n=8, k=16, dtype="i8")]}
    kinds = set()
    for isa in ("avx2", "avx512", "amx", "sve"):
        for desc in generated(isa) + extra.get(isa, []):
            code = backends.generate(desc, isa).code
            assert position.audit(code, backends.family(isa)) is None, (isa, desc)
            kinds.add((backends.family(isa), desc.kind))
    generators = {k for k in backends.registered()                 # not those a docstring example adds
                  if backends._GENERATORS[k].__module__.startswith(("tppasm.x86.", "tppasm.sve."))}
    assert kinds == generators


def _x86(emit):
    fn = Function("f", ["ptr"])
    emit(fn.asm, fn.args[0])
    return fn.finalize().code


@pytest.mark.parametrize("code, why", [
    (lambda: _x86(lambda a, p: a.mov(rax, 0x7F00_1234_5678)), "absolute address"),
    (lambda: _x86(lambda a, p: a.call(rax)), "indirect"),
    (lambda: _x86(lambda a, p: a.mov(rax, [0x1000])), "absolute memory"),
    (lambda: b"\xe8\x00\x10\x00\x00\xc3", "outside the blob"),          # call +0x1000
    (lambda: b"\x48\x8b\x05\x00\x10\x00\x00\xc3", "RIP-relative"),      # mov rax, [rip+0x1000]
    (lambda: b"\x0f\x0b\xff\xff", "undecodable"),
], ids=["imm64", "call-reg", "moffs", "call-out", "rip-out", "junk"])
def test_audit_refuses_code_tied_to_an_address(code, why):
    assert why in position.audit(code(), "x86")


@pytest.mark.parametrize("words, why", [
    ([0x90000000, 0xD65F03C0], "adrp"),                 # adrp x0, 0
    ([0x94000100, 0xD65F03C0], "outside"),              # bl +0x400
    ([0xD61F0000], "br"),                               # br x0
    ([0x58000400, 0xD65F03C0], "outside"),              # ldr x0, +0x80 (literal)
    ([0xD503201F], "past its end"),                     # nop, then nothing
])
def test_audit_refuses_aarch64_code_tied_to_an_address(words, why):
    assert why in position.audit(struct.pack(f"<{len(words)}I", *words), "sve")


def test_code_that_is_not_position_independent_is_not_stored(cache_dir):
    code = tc.kernel_code()
    bad = Function("bad", ["ptr"])
    bad.asm.mov(rax, 0x7F00_1234_5678)
    raw = bad.finalize()
    desc = Unary("relu", 2, 2)
    with pytest.warns(RuntimeWarning, match="not position independent"):
        got, from_disk = code.raw(desc, "avx2", lambda d, i: raw)
    assert got is raw and not from_disk and not code.store._pending


def test_kernels_with_counts_past_32_bits_run_uncached_without_a_bug_warning(cache_dir):
    """2^31 rows take a 64-bit immediate, which the audit cannot tell from an address: the kernel
    is built and not stored, and no "generator bug" warning is raised (one is for other code)."""
    code = tc.kernel_code()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        k = tpp.reduce("add", 1 << 40, 8, over="cols")
    assert k.runnable and not code.store._pending


def test_batch_strides_whose_chunk_step_passes_32_bits_run_uncached_without_a_bug_warning(cache_dir):
    """A BRGEMM's batch stride of 2^22 fp32 elements: every field is below 2^31, but a chunk of
    blocks steps by more, which the generator adds as a 64-bit immediate (it warned of a bug)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        k = tpp.brgemm(8, 8, 8, dtype="f32", stride_a=1 << 22)
    assert k.runnable


def test_key_covers_every_field_and_the_features(monkeypatch):
    code = kernels.KernelCode(None)
    base = Unary("relu", 4, 8)
    keys = {code.raw_key(base, "avx2")}
    for change in (dict(m=5), dict(n=9), dict(ldi=9), dict(ldo=10), dict(dtype="bf16"), dict(out_dtype="bf16"),
                   dict(op="tanh")):
        keys.add(code.raw_key(Unary(**{**vars(base), **change}), "avx2"))
    keys.add(code.raw_key(base, "avx512"))
    real = kernels.host()
    fewer = dict(real.features, avx512f=not real.features.get("avx512f"))
    # the host is read once per process (a fresh KernelCode here)
    monkeypatch.setattr(kernels, "host", lambda: types.SimpleNamespace(levels=real.levels, features=fewer))
    keys.add(kernels.KernelCode(None).raw_key(base, "avx2"))
    monkeypatch.setattr(kernels, "host", lambda: types.SimpleNamespace(levels=(), features=real.features))
    keys.add(kernels.KernelCode(None).raw_key(base, "avx2"))
    assert len(keys) == 11


def test_stub_key_covers_the_interpreter_build(monkeypatch):
    code = kernels.KernelCode(None)
    desc = Unary("relu", 4, 8)
    args = (desc.kind, tuple(desc.operands()), (), None, "entry")
    keys = {code.stub_key(*args), code.stub_key(*args[:-1], "call")}
    monkeypatch.setattr(kernels.sys, "abiflags", "d", raising=False)          # a debug build
    keys.add(code.stub_key(*args))
    monkeypatch.setattr(kernels.np, "__version__", "0.0")
    keys.add(code.stub_key(*args))
    monkeypatch.setattr(kernels.sys.implementation, "cache_tag", "cpython-0")
    keys.add(code.stub_key(*args))
    assert len(keys) == 5


def test_descriptor_without_faithful_text_is_not_stored():
    class Opaque:
        pass
    assert kernels.describe((1, "a", None, 2.5)) == "(1, 'a', None, 2.5,)"
    assert kernels.describe((1, Opaque())) is None


class _FarAddresses(Addresses):
    """Addresses above 4 GiB whatever the host (a non-PIE Python has some below)."""

    def _far(self, *what):
        return 0x7F00_0000_0000 + (hash(what) & 0xFFFF_FFF0)

    def raw(self): return self._far("raw")
    def ndarray(self): return self._far("ndarray")
    def dtype(self, i): return self._far("dtype", i)
    def int(self): return self._far("int")
    def keyword(self, j): return self._far("keyword", j)
    def none(self): return self._far("none")
    def capi(self, name): return self._far("capi", name)
    def divert(self): return self._far("divert")
    def fallback(self): return self._far("fallback")


@pytest.mark.parametrize("form", stubs.FORMS)
def test_stub_template_patched_equals_the_stub_built_directly(form):
    for desc in descriptors():
        if not desc.checked_call:
            continue
        ops, scalars = tuple(desc.operands()), tuple(desc.scalars)
        call = None if form == "entry" else Vectorcall(None, 0, release_gil=form == "call-nogil")
        t = stubs.template(desc.kind, ops, scalars, desc.count_scalar, form)
        addresses = _FarAddresses(ops, scalars, 0, call)
        direct = build_entry(desc.kind, ops, scalars, 0, desc.count_scalar, call=call, addresses=addresses)
        assert stubs.instantiate(t, addresses).code == direct.code, desc
        back = stubs.Template.from_meta(t.code, json.loads(json.dumps(t.as_meta())))
        assert back == t


def test_malformed_template_metadata_is_refused():
    desc = Unary("relu", 2, 3)
    t = stubs.template(desc.kind, tuple(desc.operands()), (), None, "entry")
    meta = t.as_meta()
    meta["relocations"][0][0] += 1                       # not a mov r64, imm64 slot any more
    with pytest.raises(ValueError, match="slot"):
        stubs.Template.from_meta(t.code, meta)
    meta = t.as_meta()
    meta["relocations"][0][1] = ["__class__"]
    with pytest.raises(ValueError):
        stubs.Template.from_meta(t.code, meta)


# -- the in-process cache --------------------------------------------------------------------

@pytest.fixture
def small_limit():
    tk.set_kernel_cache_limit(4)
    yield
    tk.set_kernel_cache_limit(tk.DEFAULT_LIMIT)


def test_in_process_cache_is_bounded_and_frees_code(small_limit):
    gc.collect()
    before = mapped()
    for n in range(1000, 1040):
        tpp.unary("copy", 1, n)
    gc.collect()
    assert len(tk._CACHE) == 4
    assert mapped()[0] - before[0] <= 2 * 4 + 2          # raw + stub per held kernel (+ slack)


def test_evicted_kernels_still_held_stay_valid(small_limit):
    from loops import Loop, kernel
    held = tpp.unary("relu", 2, 777)
    zero = tpp.zero(2, 3)

    @kernel("A", Loop(0, 4))
    def clear(i, X):
        zero(X[i])
    X = np.ones((4, 2, 3), np.float32)
    clear(X)
    for n in range(2000, 2010):
        tpp.unary("copy", 1, n)
    tpp.cache_clear()
    gc.collect()
    assert tpp.unary("relu", 2, 777) is held            # referenced: found again, not rebuilt
    x = np.array([[-1, 2] * 388 + [3], [4, -5] * 388 + [-6]], np.float32)
    y = np.full_like(x, np.nan)
    held(x, y)
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    X[...] = 1
    clear(X)                                            # the nest still calls its (evicted) zero kernel
    assert not X.any()


def test_limit_errors_name_the_fix():
    for bad in (-1, "8", 2.5, True):
        with pytest.raises(ValueError, match="int >= 0"):
            tpp.set_kernel_cache_limit(bad)
    out = run("""
        import tppasm                   # read at the first kernel: python -m tppasm cache clear still works
        try:
            tppasm.relu(2, 2)
        except ValueError as e:
            print(e)
    """, {"TPPASM_KERNEL_CACHE": "many"})
    assert "TPPASM_KERNEL_CACHE='many'" in out


def test_cached_kernel_results_match_generated(cache_dir):
    """In this process: generated, then loaded from disk by a fresh store; same code, same results."""
    desc = Unary("gelu", 3, 21)
    first = tk.Kernel(desc, tk.host().isa, code_cache=tc.kernel_code())
    tc.flush()
    again = tk.Kernel(desc, tk.host().isa, code_cache=kernels.KernelCode(disk.DiskStore(cache_dir, 1 << 20)))
    assert again.from_disk and again.raw.code == first.raw.code
    x = np.linspace(-3, 3, 63, dtype=np.float32).reshape(3, 21)
    y1, y2 = np.full_like(x, np.nan), np.full_like(x, np.nan)
    first(x, y1)
    again(x, y2)
    np.testing.assert_array_equal(y1, y2)


def _operands(kernel, rng, count):
    """Arrays for ``kernel``'s operands as strided views of buffers: inputs random, outputs NaN."""
    bases, views = [], []
    for spec in kernel.operands:
        shape, es = spec.full_shape(count), spec.np_dtype.itemsize
        span = 1 + sum((d - 1) * st for d, st in zip(shape, spec.strides))
        base = (np.full(span, np.nan, np.float32) if spec.writable else
                rng.uniform(-2, 2, span).astype(np.float32)).astype(spec.np_dtype)
        bases.append(base)
        views.append(np.lib.stride_tricks.as_strided(base, shape, [st * es for st in spec.strides]))
    return bases, views


@given(kind=st.sampled_from(["unary", "binary", "brgemm"]), m=st.integers(1, 9), n=st.integers(1, 40),
       k=st.integers(1, 12), pad=st.integers(0, 3), dtype=st.sampled_from(["f32", "bf16"]),
       act=st.sampled_from([None, "relu", "tanh"]), seed=st.integers(0, 2 ** 16))
def test_loaded_kernel_is_the_generated_one(kind, m, n, k, pad, dtype, act, seed):
    """Over kinds, shapes, leading dimensions and dtypes: a fresh store loads the bytes the generator
    made, and the loaded kernel writes every output element exactly as the generated one."""
    from tppasm.brgemm import Brgemm
    from tppasm.eltwise import Binary
    desc = {"unary": lambda: Unary(act or "relu", m, n, ldi=n + pad, dtype=dtype),
            "binary": lambda: Binary("max" if act else "add", m, n, lda=n + pad, dtype=dtype),
            "brgemm": lambda: Brgemm(m, n, 2 * k, ldc=n + pad, dtype=dtype, act=act)}[kind]()
    isa = tk.host().isa
    with tempfile.TemporaryDirectory() as root:
        store = disk.DiskStore(root, 1 << 20)
        made = tk.Kernel(desc, isa, code_cache=kernels.KernelCode(store))
        store.flush()
        loaded = tk.Kernel(desc, isa, code_cache=kernels.KernelCode(disk.DiskStore(root, 1 << 20)))
    assert loaded.from_disk and not made.from_disk and loaded.raw.code == made.raw.code
    count = {"count": 2} if desc.scalars else {}
    outs = []
    for kern in (made, loaded):
        bases, views = _operands(kern, np.random.default_rng(seed), 2)
        kern(*views, **count)
        written = [v for v, spec in zip(views, kern.operands) if spec.writable]
        assert not any(np.isnan(w.astype(np.float32)).any() for w in written)
        outs.append([b.astype(np.float32) for b in bases])
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("isa", ["sve", "avx512", "amx"])
def test_code_for_other_isas_round_trips(tmp_path, isa):
    """SVE (run on AArch64 hosts or emulated) and AVX-512 / AMX code (interpreted where the host lacks
    them) come back byte for byte, in the raw-code object their generator makes."""
    from tppasm.brgemm import Brgemm
    desc = Brgemm(8, 8, 16, dtype="bf16") if isa == "amx" else Unary("gelu", 3, 19)
    store = disk.DiskStore(tmp_path, 1 << 20)
    made, _ = kernels.KernelCode(store).raw(desc, isa, backends.generate)
    store.flush()
    loaded, from_disk = kernels.KernelCode(disk.DiskStore(tmp_path, 1 << 20)).raw(desc, isa, None)
    assert from_disk and type(loaded) is type(made) and loaded.code == made.code and loaded.name == made.name


def test_warnings_are_not_raised_on_a_healthy_cache(cache_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tpp.unary("tanh", 2, 11)
        tc.flush()
