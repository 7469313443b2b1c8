"""BRGEMM: ``C = beta*C + sum_{i<count} A_i @ B_i``, then an optional bias row and activation.

Every parameter (layouts, ``batch=``, dtypes, the epilogue, ``stream_c``, ``pace``) is explained
in ``help(tppasm.brgemm)``: the docstring of :func:`brgemm`, the function, whose name in the
package hides this module's.

>>> import numpy as np, tppasm
>>> gemm = tppasm.brgemm(m=2, n=3, k=4)
>>> A = np.ones((2, 2, 4), np.float32); B = np.ones((2, 4, 3), np.float32)
>>> C = np.empty((2, 3), np.float32); gemm(A, B, C, count=2); C.tolist()
[[8.0, 8.0, 8.0], [8.0, 8.0, 8.0]]
"""
from dataclasses import dataclass, replace

import numpy as np

from . import backends, display
from .eltwise import UNARY_OPS
from .kernel import Descriptor, get_kernel, in_body, scalar_arg
from .keywords import refuse_keywords
from .layout import empty_for
from .lazy import CodeAddress, KernelWrapper, one_wrapper
from .operand import (OperandError, OperandSpec, as_ndarray, check, data_address, like_inputs, mark_written,
                      origin_of, refuse_masked, refuse_overlap)
from .tile_calls import configuring, on_tiles, self_configuring

A_DTYPE = {"f32": "f32", "bf16": "bf16", "i8": "u8"}
B_DTYPE = {"f32": "f32", "bf16": "bf16", "i8": "i8"}
SIGNS = ("us", "ss", "su", "uu")     # int8 signedness of (A, B); "us" is what vpdpbusd/tdpbusd take
A_BITS = (7, 8)                      # i8 "us": the bits of A's values (7: 0..127, see brgemm())
INT8_DTYPE = {"u": "u8", "s": "i8"}
C_DTYPES = {"f32": ("f32",), "bf16": ("f32", "bf16"), "i8": ("i32",)}
VNNI = {"f32": 1, "bf16": 2, "i8": 4}
BATCHES = ("stride", "offset", "address")
MAX_PACE = 64
MAX_SIZE = 1 << 40       # elements: any size, ld or stride beyond (4 TiB of fp32) is a mistake
ACTS = {
    None: lambda x: x,
    "relu": lambda x: np.maximum(x, 0),
    "gelu": UNARY_OPS["gelu"],
    "gelu_erf": UNARY_OPS["gelu_erf"],
    "gelu_erf_fast": UNARY_OPS["gelu_erf"],
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "tanh": np.tanh,
}


@dataclass(frozen=True)
class Brgemm(Descriptor):
    """The BRGEMM descriptor; 0 for an ld/stride means its dense default."""

    m: int
    n: int
    k: int
    lda: int = 0
    ldb: int = 0
    ldc: int = 0
    stride_a: int = 0
    stride_b: int = 0
    beta: int = 0
    dtype: str = "f32"
    c_dtype: str = ""
    batch: str = "stride"
    bias: bool = False
    act: object = None
    tile_setup: bool = True     # AMX: True = load its config when another is loaded; False = a nest's (tileconfig())
    signs: str = "us"           # i8: A and B (u)nsigned or (s)igned: us (u8 x s8), ss, su, uu
    stream_c: bool = False      # non-temporal stores of C where the kernel can (see brgemm())
    pace: int = 0               # x86: cycles per k group at least (see brgemm())
    prefetch: bool = True       # x86 / AMX: software prefetches of the lines ahead (see brgemm())
    a_bits: int = 8             # i8 "us": 7 promises A <= 127 (see brgemm())

    kind = "brgemm"
    scalars = ("count",)
    count_scalar = "count"

    def __post_init__(self):
        self._normalize()
        dense = {"lda": self.k, "ldb": self.n, "ldc": self.n}
        for name, value in dense.items():
            if _is_int(getattr(self, name)) and not getattr(self, name):
                object.__setattr__(self, name, value)
        if _is_int(self.stride_a) and not self.stride_a and _is_int(self.lda):
            object.__setattr__(self, "stride_a", self.m * self.lda if _is_int(self.m) else 0)
        if _is_int(self.stride_b) and not self.stride_b and _is_int(self.ldb):
            groups = -(-self.k // VNNI.get(self.dtype, 1)) if _is_int(self.k) else 0
            object.__setattr__(self, "stride_b", groups * VNNI.get(self.dtype, 1) * self.ldb)
        if not self.c_dtype and self.dtype in C_DTYPES:
            object.__setattr__(self, "c_dtype", C_DTYPES[self.dtype][0])

    # -- checks -------------------------------------------------------------------------------
    def validate(self):
        for name in ("m", "n", "k"):
            _need(_is_int(getattr(self, name)) and 1 <= getattr(self, name) < MAX_SIZE, name, getattr(self, name),
                  "an int in [1, 2**40)")
        if self.dtype not in VNNI:
            raise ValueError(f"brgemm: dtype={self.dtype!r}; legal values: {', '.join(VNNI)}")
        # A's rows may overlap (lda < k): it is only read, e.g. a convolution reads the S*bc values
        # under each output pixel as one row, consecutive pixels stride*bc apart
        _need(_is_int(self.lda) and 1 <= self.lda < MAX_SIZE, "lda", self.lda,
              "an int in [1, 2**40) (A's row stride)")
        for name, least in (("ldb", self.n), ("ldc", self.n)):
            value = getattr(self, name)
            _need(_is_int(value) and least <= value < MAX_SIZE, name, value,
                  f"an int in [{least}, 2**40) (at least the row width)")
        for name in ("stride_a", "stride_b"):
            value = getattr(self, name)
            _need(_is_int(value) and 0 <= value < MAX_SIZE, name, value,
                  "an int in [0, 2**40) (elements between blocks)")
        _need(self.beta in (0, 1) and not isinstance(self.beta, float), "beta", self.beta, "0 or 1")
        _need(self.c_dtype in C_DTYPES[self.dtype], "c_dtype", self.c_dtype,
              f"{' or '.join(map(repr, C_DTYPES[self.dtype]))} for dtype={self.dtype!r}")
        _need(self.batch in BATCHES, "batch", self.batch, ", ".join(map(repr, BATCHES)))
        _need(self.batch == "stride" or (self.stride_a, self.stride_b) == self.dense_strides(), "stride_a, stride_b",
              (self.stride_a, self.stride_b), f"them left out with batch={self.batch!r}: its blocks are found by "
              f"{'offsets' if self.batch == 'offset' else 'addresses'}, not strides (or pass batch='stride')")
        _need(self.bias in (False, True), "bias", self.bias, "True or False")
        _need(self.act in ACTS, "act", self.act, ", ".join(map(repr, ACTS)))
        _need(self.tile_setup in (False, True), "tile_setup", self.tile_setup, "True or False")
        _need(self.stream_c in (False, True), "stream_c", self.stream_c, "True or False")
        _need(self.prefetch in (False, True), "prefetch", self.prefetch, "True or False")
        _need(_is_int(self.pace) and 0 <= self.pace <= MAX_PACE, "pace", self.pace,
              f"an int in [0, {MAX_PACE}] (cycles per k group; 0: no pacing)")
        _need(self.signs in SIGNS if self.dtype == "i8" else self.signs == "us", "signs", self.signs,
              f"one of {', '.join(map(repr, SIGNS))} (signedness of A and B) for dtype='i8', else 'us'")
        _need(_is_int(self.a_bits) and self.a_bits in A_BITS, "a_bits", self.a_bits,
              "8 (A's values 0..255) or 7 (A promised 0..127: a u7 BRGEMM, see help(tppasm.brgemm))")
        _need(self.a_bits == 8 or (self.dtype, self.signs) == ("i8", "us"), "a_bits", self.a_bits,
              f"8 with dtype={self.dtype!r}, signs={self.signs!r}: a_bits=7 is for dtype='i8', signs='us' "
              "(unsigned A, signed B)")
        if self.dtype == "i8":
            _need(not self.bias, "bias", self.bias, "False for dtype='i8' (int32 C has no fp32 bias)")
            _need(self.act in (None, "relu"), "act", self.act, "None or 'relu' for dtype='i8'")

    def dense_strides(self):
        """(stride_a, stride_b) of blocks stored one after the other: the defaults."""
        return self.m * self.lda, self.groups * self.vnni * self.ldb

    @property
    def checked_call(self):
        """Only stride batches are checked natively; :class:`BatchedBrgemm` checks the others."""
        return self.batch == "stride"

    def unchecked_error(self, how):
        """The TypeError for ``kernel{how}(...)`` of a raw kernel that is not :attr:`checked_call`."""
        return TypeError(f"brgemm: this raw kernel (batch={self.batch!r}) does not check its offsets or addresses; "
                         f"use the object tppasm.brgemm(...) returns, which does: gemm{how}(...)")

    @property
    def vnni(self):
        return VNNI[self.dtype]

    @property
    def groups(self):
        """Rows of B in the VNNI layout: ceil(k / f)."""
        return -(-self.k // self.vnni)

    # -- operands -------------------------------------------------------------------------------
    def block_specs(self):
        """(A block, B block) specs, without the batch dimension."""
        f = self.vnni
        a_dtype, b_dtype = (INT8_DTYPE[c] for c in self.signs) if self.dtype == "i8" else \
            (A_DTYPE[self.dtype], B_DTYPE[self.dtype])
        which = "signs" if self.dtype == "i8" else ""          # the parameter that sets their dtypes, for messages
        a = OperandSpec("a", a_dtype, (self.m, self.k), (self.lda, 1), ld_name="lda", dtype_param=which,
                        max_value=127 if self.a_bits == 7 else None)
        if f == 1:
            b = OperandSpec("b", "f32", (self.k, self.n), (self.ldb, 1), ld_name="ldb")
        else:
            b = OperandSpec("b", b_dtype, (self.groups, self.n, f), (self.ldb * f, f, 1),
                            ld_name="", dtype_param=which)
        return a, b

    def operands(self):
        """The raw kernel's arrays, in argument order (``count`` follows them)."""
        a, b = self.block_specs()
        c = OperandSpec("c", self.c_dtype, (self.m, self.n), (self.ldc, 1), writable=True, ld_name="ldc")
        if self.batch == "stride":
            ops = [_batched(a, self.stride_a), _batched(b, self.stride_b), c]
        elif self.batch == "offset":
            ops = [a, b, c, OperandSpec("offsets", "i64", (2,), (2, 1), batch=True)]
        else:
            ops = [OperandSpec("a_ptrs", "i64", (), (1,), batch=True),
                   OperandSpec("b_ptrs", "i64", (), (1,), batch=True), c]
        if self.bias:
            ops.append(OperandSpec("bias", "f32", (self.n,), (1,)))
        return tuple(ops)

    def work(self):
        return 2 * self.m * self.n * self.k + sum(s.nbytes() for s in self.operands())

    def allocated(self):
        """C, when the kernel only writes it (beta=0, any batch): ``C = gemm(A, B)``."""
        return () if self.beta else ("c",)

    # -- reference ------------------------------------------------------------------------------
    def reference(self, a, b, c, *rest, count=None):
        """NumPy BRGEMM on the same arguments as the public call, in place on ``c`` (unchecked: the
        kernel's ``reference`` checks them as its call does).

        Stride: ``(a, b, c[, bias])``; offset: ``(a, b, c, offsets[, bias])``; address:
        ``(a_blocks, b_blocks, c[, bias])`` with sequences of blocks. ``count`` defaults to what the
        call infers: the blocks of a and b, the rows of offsets.
        """
        if len(rest) != (self.batch == "offset") + self.bias:
            raise TypeError(f"brgemm.reference: batch={self.batch!r}, bias={self.bias} takes (a, b, c"
                            f"{', offsets' if self.batch == 'offset' else ''}{', bias' if self.bias else ''}); "
                            f"got {3 + len(rest)} arrays")
        if count is None:
            count = _batch_count(self, a, b, rest) if self.batch != "stride" else _stride_count(a, b)
        rest = list(rest)
        if self.batch == "offset":
            offsets = np.asarray(rest.pop(0))[:count]
            a_blocks = [_view(a, int(o), self.block_specs()[0]) for o in offsets[:, 0]]
            b_blocks = [_view(b, int(o), self.block_specs()[1]) for o in offsets[:, 1]]
        else:
            a_blocks, b_blocks = list(a[:count]), list(b[:count])
        bias = rest.pop(0) if self.bias else None
        c[...] = self.compute(a_blocks, b_blocks, c, bias)

    def unspecified(self, a, b, c, *rest):
        """C's rows whose A rows hold a value above A's promised ``max_value`` (``a_bits=7``: 127; the
        whole C where A is a buffer of offset blocks or a list of address blocks)."""
        bound = self.block_specs()[0].max_value
        if bound is None:
            return {}
        if self.batch == "stride":
            a = np.asarray(a)
            big = (a.reshape(-1, self.m, a.shape[-1]) > bound).any(axis=(0, 2))
            return {"c": np.broadcast_to(big[:, None], c.shape)}
        big = any((np.asarray(x) > bound).any() for x in (a if self.batch == "address" else [a]))
        return {"c": np.full(c.shape, big)}

    def compute(self, a_blocks, b_blocks, c, bias=None):
        """beta*C + sum A_i @ B_i (+ bias, act) in float64 / int64, cast to C's dtype (NaN and
        infinities in, IEEE results out, without warnings)."""
        exact = self.dtype == "i8"
        wide = np.int64 if exact else np.float64
        acc = c.astype(wide) if self.beta else np.zeros(c.shape, wide)
        with np.errstate(invalid="ignore", over="ignore"):
            for ai, bi in zip(a_blocks, b_blocks):
                if self.vnni > 1:
                    bi = np.swapaxes(bi, -1, -2).reshape(self.groups * self.vnni, self.n)[:self.k]
                acc += ai.astype(wide) @ bi.astype(wide)
            if exact:
                acc = ((acc + 2 ** 31) % 2 ** 32 - 2 ** 31)
            if bias is not None:
                acc += bias.astype(wide)
            return ACTS[self.act](acc).astype(c.dtype)


def _stride_count(a, b):
    """``count`` left out with batch='stride': the blocks A and B hold (TypeError if they differ)."""
    if len(a) != len(b):
        raise TypeError(f"brgemm: pass count= (how many blocks to reduce over): it is inferred only when A and "
                        f"B hold the same number of blocks, and A holds {len(a)}, B {len(b)}")
    return len(a)


def _batched(spec, stride):
    return replace(spec, strides=(stride,) + spec.strides, batch=True)


def _view(buf, offset, spec):
    flat = buf.reshape(-1)
    es = flat.itemsize
    return np.lib.stride_tricks.as_strided(flat[offset:], spec.shape, [s * es for s in spec.strides])


def _is_int(v):
    return type(v) is int or isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _need(ok, name, value, legal):
    if not ok:
        raise ValueError(f"brgemm: {name}={display.shown(value)}; expected {legal}")


def unchecked_in_body(desc):
    """Why a kernel whose native entry cannot vouch for its calls (``desc.checked_call`` False: an
    offset or address batch) is refused in a loop body."""
    return (f"{desc.kind} with batch={desc.batch!r} cannot run in a loop body: its offsets or addresses "
            "are checked in Python on each call; in a body use batch='stride' with views of the blocks "
            "(A[i, k0:k1] and count=...)")


class BatchedBrgemm(KernelWrapper):
    """A BRGEMM batched by offsets or addresses: checks the batch in Python, then calls the kernel.

    ``kernel`` is the underlying :class:`tppasm.kernel.Kernel` (its raw entry is what loop nests
    call); its attributes are available here too.
    """

    def __repr__(self):
        return f"<BatchedBrgemm of {self.kernel!r}>"

    def __call__(self, *arrays, count=None, **wrong):
        """``gemm(A, B, C, offsets[, bias])`` (batch="offset") or ``gemm(A_blocks, B_blocks, C[, bias])``
        (batch="address"); ``count`` defaults to the number of offset rows / of blocks. With beta=0 the
        kernel only writes C: leave it out (or pass None) and it is allocated and returned,
        ``C = gemm(A, B, offsets)``, as an unbatched kernel's ``C = gemm(A, B)``."""
        arrays, made = self._with_c(arrays, wrong)
        args, _, count, target = self._checked(*arrays[:3], arrays[3:], count)
        self.kernel._raw(*map(data_address, args), count)
        mark_written([target])
        return made if made is None else like_inputs(made, arrays)

    def raw_call(self, *arrays, count=None, check=True):
        """:meth:`tppasm.kernel.Kernel.raw_call` of ``gemm(A, B, C, ...)`` (C passed), checked as a call whatever
        ``check`` says; the address holds the kernel and what args point into (offsets copied, blocks)."""
        arrays, _ = self._with_c(arrays, {}, allocate=False)
        args, held, count, _ = self._checked(*arrays[:3], arrays[3:], count)
        if not self.kernel.runnable:
            self.kernel._raw()                  # (ISAUnavailableError: code this host cannot run)
        return CodeAddress(self.kernel.raw.address, (self.kernel, args, held)), (*map(data_address, args), count)

    def _with_c(self, arrays, wrong, allocate=True):
        """(the call's arrays with C third, the C allocated for a beta=0 call that left it out or passed
        None, if ``allocate``, else None); TypeError naming the call forms for too few arrays."""
        d = self.desc
        if wrong:
            raise TypeError(display.wrong_call(self.kernel, len(arrays), wrong))
        full = 3 + (d.batch == "offset") + d.bias
        # one short and what is third is no C (2-D, not int64 offsets): C left out, not offsets or bias
        left_out = len(arrays) == full - 1 and (len(arrays) == 2 or not _looks_like_c(arrays[2]))
        if allocate and not d.beta and (left_out or (len(arrays) == full and arrays[2] is None)):
            if in_body():
                raise TypeError(unchecked_in_body(d))
            c = empty_for(next(s for s in self.kernel.operands if s.name == "c"))
            return arrays[:2] + (c,) + arrays[2 if left_out else 3:], c
        if len(arrays) < 3:
            read = " (beta=1: C is read, so always passed)" if d.beta else ""
            raise TypeError(f"brgemm with batch={d.batch!r}: call it as {display.call_forms(self.kernel)}{read}; "
                            f"got {len(arrays)} array{'' if len(arrays) == 1 else 's'}")
        return arrays, None

    def reference(self, *arrays, count=None, **wrong):
        """The same with NumPy, on the call's arguments, checked as the call checks them: in place on C,
        or (beta=0) on a new C that it returns when C is left out or None.

        >>> import numpy as np, tppasm
        >>> g = tppasm.brgemm(m=1, n=1, k=2, batch="offset"); A = np.ones((1, 4), np.float32)
        >>> C = np.empty((1, 1), np.float32); g.reference(A, np.ones((2, 1), np.float32), C, np.zeros((3, 2), np.int64))
        >>> C.tolist()                   # three blocks (the offsets' rows), each 1 * 1 + 1 * 1
        [[6.0]]
        """
        arrays, made = self._with_c(arrays, wrong)
        args, blocks, count, target = self._checked(*arrays[:3], arrays[3:], count)
        if self.desc.batch == "offset":
            self.desc.reference(*args, count=count)
        else:
            self.desc.reference(*blocks, *args[2:], count=count)
        mark_written([target])
        return made if made is None else like_inputs(made, arrays)

    def _checked(self, a, b, c, rest, count):
        """(the raw kernel's arrays, the A and B blocks of an address batch, count, C as passed), once
        every argument passed the checks of a call (TypeError or OperandError naming the fix)."""
        d, who = self.desc, "brgemm"
        if in_body() and not all(isinstance(x, (np.ndarray, list, tuple)) for x in (a, b, c)):
            raise TypeError(unchecked_in_body(d))
        target, c_origin, rest_origins = c, origin_of(c), [origin_of(x) for x in rest]
        a, b = (_as_blocks(x, name, who) for x, name in ((a, "a"), (b, "b")))
        c = _foreign(c, "c", who, writes=True)
        rest = [_foreign(x, "offsets" if i == 0 and d.batch == "offset" else "bias", who) for i, x in enumerate(rest)]
        count = scalar_arg(who, "count", _batch_count(d, a, b, rest) if count is None else count)
        spec_a, spec_b = d.block_specs()
        ops = {s.name: s for s in self.kernel.operands}
        check(ops["c"], c, who=who, origin=c_origin)
        rest, held = list(rest), [None, None]
        if d.batch == "offset":
            if not rest or rest[0] is None:
                raise OperandError(f"{who}: batch='offset' takes the block offsets after C: gemm(A, B, C, offsets"
                                   f"{', bias' if d.bias else ''}), offsets an int64 array (count, 2) of (A, B) "
                                   "element offsets, one row per block")
            offsets = rest.pop(0)
            check(ops["offsets"], offsets, count, who=who, origin=rest_origins[0] if rest_origins else None)
            offsets = offsets[:count].copy()       # what is checked is what runs, whatever other threads do
            for spec, buf, col in ((spec_a, a, 0), (spec_b, b, 1)):
                _check_buffer(spec, buf, offsets[:, col], who)
            args = [a, b, c, offsets]
        else:
            ptrs, held = [], []
            for spec, blocks in ((spec_a, a), (spec_b, b)):
                if not isinstance(blocks, (list, tuple)):
                    got = f"an array of shape {blocks.shape}" if isinstance(blocks, np.ndarray) else \
                        f"a {type(blocks).__name__}"
                    raise OperandError(f"{who}: operand {spec.name} must be a list or tuple of blocks {spec.shape} for "
                                       f"batch='address', got {got}: pass list({spec.name}) to give its blocks "
                                       "as they are, or build the kernel with batch='stride' for an array of blocks")
                if len(blocks) < count:
                    raise OperandError(f"{who}: operand {spec.name} holds {len(blocks)} blocks; count={count} needs "
                                       f"at least {count}: pass count<={len(blocks)} or more blocks")
                blocks = list(blocks[:count])      # held until the call returns
                for blk in blocks:
                    check(spec, blk, who=who)
                ptrs.append(np.array(list(map(data_address, blocks)), np.int64))
                held.append(blocks)
            args = ptrs + [c]
        if d.bias:
            if not rest:
                raise OperandError(f"{who}: the kernel was built with bias=True; pass bias (n,) float32")
            bias = rest.pop(0)
            check(ops["bias"], bias, who=who, origin=rest_origins[1 if d.batch == "offset" else 0])
            args.append(bias)
        if rest:
            raise TypeError(f"{who}: too many arrays for batch={d.batch!r}, bias={d.bias}")
        if d.batch == "offset":                # (A's and B's whole buffers: C may not lie in them)
            refuse_overlap(who, self.kernel.operands, args, count, [None, None, c_origin])
        else:
            blocks = held[0] + held[1] + [c] + args[3:]
            refuse_overlap(who, [spec_a] * count + [spec_b] * count + list(self.kernel.operands[2:]), blocks,
                           origins=[None] * (2 * count) + [c_origin])
        return args, held, count, target


def _looks_like_c(x):
    """Whether ``x`` could be C (two axes, not the int64 of offsets) rather than offsets or a bias."""
    return getattr(x, "ndim", None) == 2 and not str(getattr(x, "dtype", "")).endswith("int64")


def _as_blocks(x, name, who):
    """A buffer, or a sequence of blocks (batch='address'), with torch tensors and DLPack objects
    as zero-copy NumPy views (:func:`tppasm.operand.as_ndarray`)."""
    if isinstance(x, (list, tuple)):
        return [_foreign(blk, name, who) for blk in x]
    return _foreign(x, name, who)


def _foreign(x, name, who, writes=False):
    """``x`` as a plain NumPy view if it is a torch tensor, a DLPack object or an ndarray subclass's
    instance (:func:`tppasm.operand.as_ndarray`), else itself (to be checked)."""
    return as_ndarray(x, name, who, writes) if origin_of(x) is not None else x


def _batch_count(desc, a, b, rest):
    """``count`` left out: the rows of the offsets array, or the number of A and B blocks when both
    sequences hold the same number (else TypeError asking for ``count=``)."""
    if desc.batch == "offset":
        offsets = rest[0] if rest else None
        return len(offsets) if isinstance(offsets, np.ndarray) and offsets.ndim == 2 else 1
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            raise TypeError(f"brgemm: pass count= (how many blocks to reduce over): it is inferred only when "
                            f"A and B hold the same number of blocks, and A holds {len(a)}, B {len(b)}")
        return len(a)
    return 1


def _check_buffer(spec, buf, offsets, who):
    refuse_masked(buf, f"{who}: operand {spec.name}")
    if not isinstance(buf, np.ndarray) or buf.dtype != spec.np_dtype or not buf.flags.c_contiguous:
        raise OperandError(f"{who}: with batch='offset', operand {spec.name} must be a C-contiguous "
                           f"{spec.np_dtype} array (offsets count elements from its start)")
    extent = 1 + sum((d - 1) * s for d, s in zip(spec.shape, spec.strides))
    if buf.size < extent:
        raise OperandError(f"{who}: operand {spec.name} holds {buf.size} elements, fewer than one block "
                           f"{spec.shape} spans ({extent})")
    if len(offsets) and (offsets.min() < 0 or offsets.max() > buf.size - extent):
        bad = int(offsets[(offsets < 0) | (offsets > buf.size - extent)][0])
        raise OperandError(f"{who}: offset {bad} for operand {spec.name} is out of range: a block "
                           f"spans {extent} elements and the buffer holds {buf.size}, so offsets "
                           f"must be in 0..{buf.size - extent}")


def brgemm(m, n, k, dtype="f32", *, lda=0, ldb=0, ldc=0, stride_a=0, stride_b=0, beta=0, c_dtype="",
           batch="stride", bias=False, act=None, tile_setup=True, signs="us", stream_c=False, pace=0, prefetch=True,
           a_bits=8, isa=None, **wrong):
    """A JIT'd BRGEMM kernel, ``C = beta*C + sum_{i<count} A_i @ B_i`` (then an optional bias row and
    activation): call it as ``gemm(A, B, C, count=c)``, or ``C = gemm(A, B)`` with beta=0 (C a new
    array, or a torch tensor when A or B is one).

    m, n, k: the block sizes; ``beta`` 0 (C is only written) or 1 (added to); ``isa``: the ISA level to
    generate for ("avx2", "avx512", "amx" or "sve"; None: the host's, or ``TPPASM_ISA``); ``tile_setup`` (AMX):
    False for a kernel that a loop nest's :func:`tppasm.tileconfig` configures once per thread (called from
    Python it configures itself, :mod:`tppasm.tile_calls`), True for one that loads its own tile configuration
    when another is loaded. ``c_dtype``: C's dtype (below);
    ``signs``: for dtype="i8", whether A and B are (u)nsigned or (s)igned ("us", "ss", "su", "uu").

    Row-major blocks: A_i is (m, k) with row stride ``lda`` (its rows may overlap: lda < k is fine);
    B_i is (k, n) with row stride ``ldb``, or for bf16 / int8 in the VNNI layout ``(k/f, n, f)``
    (f = 2 / 4 consecutive rows of B interleaved, see :func:`tppasm.layout.vnni_pack`) whose group
    rows are ``f*ldb`` elements apart;
    C is (m, n) with row stride ``ldc``. The batch is addressed three ways (``batch=``):

    - ``"stride"``: A is (>=count, m, k) with strides (stride_a, lda, 1), B likewise (stride_b);
    - ``"offset"``: an int64 (>=count, 2) array of element offsets (off_a, off_b) into C-contiguous
      A and B buffers; every offset is checked against the buffers before the kernel runs;
    - ``"address"``: from Python, sequences of count A blocks and count B blocks (a slow path that
      builds the pointer arrays); the raw kernel takes two int64 arrays of block addresses.

    dtypes: ``f32``; ``bf16`` (A bf16, B bf16 VNNI2, fp32 accumulation, C ``f32`` or ``bf16`` rounded to
    nearest even; denormal inputs and products may count as zero, as the bf16 dot instructions flush them,
    and so may a bf16 C's denormal results where ``vcvtneps2bf16`` rounds them: AVX-512 BF16 and AMX hosts);
    ``i8`` (A uint8, B int8 VNNI4, C int32, exact: sums wrap modulo 2**32 as ``vpdpbusd`` does). Any k: B
    has ceil(k/f) row groups, and the padding entries of the last one are never used (``vnni_pack`` writes
    zeros there; any values are ignored). ``c_dtype`` left out: f32 (i32 for i8). Epilogue: ``bias=True``
    adds an fp32 row vector of n (f32/bf16), then ``act`` in None, "relu", "gelu" (tanh form), "gelu_erf" (x
    Phi(x), BERT's), "gelu_erf_fast", "sigmoid", "tanh", on the fp32 sums (a bf16 C is rounded once, after
    it; for a bf16 C the x86 kernels evaluate gelu_erf to 2^-16 relative, ~1/128 of the rounding, in half
    the instructions). "gelu_erf_fast" is gelu_erf to an absolute error of 2^-22 max(1, |x|), the accuracy
    class of torch's gelu (relative error ~1e-7 for x > 0, larger where x Phi(x) is tiny, x < -2): a table
    of polynomials on the AVX-512 and AVX2 kernels, without division (on Zen 4 a 64 x 64 x 384 fp32 BRGEMM
    with bias spends 16 cycles per output vector on it against gelu_erf's 38); the SVE kernels evaluate
    gelu_erf.

    ``stream_c=True`` asks for non-temporal stores of C (around the caches, no read for ownership):
    for outputs written once and too large for the caches to keep until their next reader, such as
    a convolution layer's output at batch 8. It is a hint that changes no result: the AVX2 and
    AVX-512 kernels follow it for the full vectors of C (any dtype) in their final stores (after
    the last batch chunk, see :mod:`tppasm.x86.brgemm`) when the tile's address is aligned to the
    store (checked at run time; ``ldc`` must keep rows aligned) and there is no transcendental
    activation; other stores, and the AMX and SVE kernels, store as usual.

    ``pace=P`` (0..64 cycles) is a hint for kernels that stream B from memory, each B line used by a
    row or a few (a GEMV: batch-1 decoding): the AVX2 and AVX-512 kernels add a chain of P dependent
    one-cycle additions per k group, on a register nothing reads, so the k loop issues B's loads at
    most one group (4 bytes of every column) per P cycles. On a core whose memory stream slows down
    when demand loads run far ahead of the hardware prefetcher, that is faster: on Zen 4, one core
    streaming int8 weights from DRAM (m = 1, panels of 2048 x 64) read 23.7-25.1 GB/s at P = 0 and
    24.7-28.7 at P = 12, in three interleaved runs; bf16 gained nothing there (``vdpbf16ps``'s longer
    latency paces its loop already). It changes no result; the AMX tile kernels (bf16 and int8 on AMX
    hosts) and the SVE kernels ignore it. Which P (if any) is fastest depends on the host's memory
    system, so measure it (``bench.models.stream_pace`` does, for the LLM's decoding).

    ``prefetch=False`` leaves out the kernel's software prefetches (the x86 kernels' ``prefetcht0``
    of B lines ahead and ``prefetcht1`` of the next batch chunk; the AMX kernels' ``prefetcht0`` of
    the next batch block), leaving the hardware prefetcher alone; another hint that changes no result
    (the SVE kernels issue none either way). Which is faster depends on the nest around the kernel:
    on an Emerald Rapids Xeon, AMX blocks whose operands sit in L2 ran 1.2-1.4x faster without,
    nests that bring A or C from L3 10-28% slower (on Zen 4, AVX-512 GEMMs of 1024^3 and 2048^3 ran
    0-3% slower without); ``python -m bench gemm`` and ``mlp`` tune it on AMX hosts.

    Few columns or one row: the x86 kernels vectorize over n and walk a row-major B one strip of
    columns at a time, so n < 16 costs what n = 16 does and m = 1 reads B at about half the
    memory's speed. For a matrix-vector product, a few columns, or a row against a large weight,
    keep B transposed, (n, k) (``torch.nn.Linear``'s layout), and call :func:`tppasm.gemm_nt`
    ``(m, n, k)(a, b_t)`` (or :func:`tppasm.fc.forward`, which takes that route itself). On Zen 4, 1
    thread, fp32, ms: (1024, 1024) x (1024, 1) brgemm 0.43, gemm_nt 0.050, numpy 0.052; (1, 4096) x
    (4096, 4096) brgemm 4.3, gemm_nt 1.96, numpy 2.25.

    ``a_bits=7`` (dtype="i8", signs="us") promises that every value of A is at most 127, as a
    quantizer with 7-bit codes writes them (:func:`tppasm.quantize` with ``bits=7``; torch's fbgemm
    quantizes activations so, its "reduce_range"). The x86 kernels without a VNNI dot (AVX2 without
    AVX-VNNI, AVX-512 without AVX512-VNNI) then multiply with ``vpmaddubsw``, whose int16 sums of two
    u8 x s8 products are exact only below 128 * 128 * 2: 3 instructions per 4 k values of a column
    where the exact u8 path takes 4 and splits every operand (on Zen 4 at AVX2, 64 x 32 x 2048: 150
    GOP/s with 8 bits, 227 with 7). Other kernels compute the same sums as with 8. A value above 127
    breaks the promise: its row of C is then unspecified on the kernels that take it.

    >>> import numpy as np, tppasm
    >>> g = tppasm.brgemm(m=1, n=2, k=4, dtype="i8", batch="offset")
    >>> A = np.array([[1, 2, 3, 4]], np.uint8); B = tppasm.vnni_pack(np.ones((4, 2), np.int8), 4)
    >>> C = np.empty((1, 2), np.int32)
    >>> g(A, B, C, np.zeros((2, 2), np.int64), count=2); C.tolist()
    [[20, 20]]
    """
    refuse_keywords("brgemm", wrong, "c_dtype")
    desc = Brgemm(m=m, n=n, k=k, lda=lda, ldb=ldb, ldc=ldc, stride_a=stride_a, stride_b=stride_b,
                  beta=beta, dtype=dtype, c_dtype=c_dtype, batch=batch, bias=bias, act=act,
                  tile_setup=tile_setup, signs=signs, stream_c=stream_c, pace=pace, prefetch=prefetch,
                  a_bits=a_bits)
    if (desc.pace or not desc.prefetch) and backends.level(isa) == "sve":   # SVE: no pace, no prefetches
        desc.validate()
        desc = replace(desc, pace=0, prefetch=True)
    kernel = get_kernel(desc, isa)
    if desc.batch == "stride":
        return self_configuring(kernel)         # (tile_setup=False on AMX: Python calls configure the tiles)
    return batched(kernel if desc.tile_setup or not on_tiles(kernel) else configuring(kernel))     # Python only


def batched(kernel):
    """The :class:`BatchedBrgemm` over ``kernel`` (:func:`tppasm.lazy.one_wrapper`: one per kernel).

    >>> import tppasm
    >>> tppasm.brgemm(2, 2, 2, batch="offset") is tppasm.brgemm(2, 2, 2, batch="offset")
    True
    """
    return one_wrapper(kernel, BatchedBrgemm)
