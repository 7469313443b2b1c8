"""Block-sparse x dense: one block row of a BCSR matrix A times a dense B, as a TPP.

A (M x K) is block-sparse in blocks of ``bm x bk``, stored as block CSR (BCSR): ``rowptr``
(M/bm + 1 int32: the blocks of block row i are entries ``rowptr[i]..rowptr[i+1]``), ``colidx``
(int32 per stored block: its block column) and ``values`` (one dense row-major ``bm x bk`` block
per stored block, f32 or bf16; bf16 products may flush denormals to zero, as ``vdpbf16ps`` and
AMX's ``tdpbf16ps`` do, and so may a denormal of C with beta=1 in a row that holds blocks). On AMX
hosts bf16 blocks of at most 32 x 32 with n a multiple of 16 run on the tiles: a call loads its tile
configuration unless it is the one loaded, and leaves it loaded (``tppasm.tilerelease()()`` releases the
tiles). One kernel call computes one block row against a column panel of
the dense B (K x n, row stride ``ldb``; bf16: VNNI2 ``(K/2, n, 2)``, see :func:`tppasm.vnni_pack`)::

    C (bm x n) = beta*C + sum over p in [rowptr[0], rowptr[1]) of values[p] @ B[colidx[p]*bk : +bk, :]

so a loop nest over block rows and column panels passes ``rowptr[i:i + 2]`` and views of B and C
(see ``bench/spmm.py``). Why row-wise (CSR) with the sparse operand on the left: C and B are
row-major, so the dense dimension n lies along vector registers; every element of a sparse block
is broadcast against whole rows of B, which keeps the vectors full for any block size (4x4 to
32x32), and all blocks of a block row accumulate into the same C rows, held in registers.

``count`` is the number of stored blocks (``colidx`` and ``values`` hold at least that many, and
by default exactly that many; an all-zero matrix still stores one unused block). The index arrays
are checked before the native call (:class:`BlockSpmmKernel`, ValueError naming the bad entry).
The raw kernel, which loop nests call, checks them too, against the ``count`` it is given (which
it cannot check: colidx and values must hold that many): it never reads outside its operands, and
a block row with an index out of range gets NaN in every element of its C block instead of a result.

>>> import numpy as np, tppasm
>>> spmm = tppasm.block_spmm(bm=2, bk=2, n=3, kb=2)
>>> rowptr = np.array([0, 1], np.int32); colidx = np.array([1], np.int32)
>>> values = np.ones((1, 2, 2), np.float32); B = np.arange(12, dtype=np.float32).reshape(4, 3)
>>> C = np.empty((2, 3), np.float32); spmm(rowptr, colidx, values, B, C, count=1); C.tolist()
[[15.0, 17.0, 19.0], [15.0, 17.0, 19.0]]
"""
from dataclasses import dataclass

import numpy as np

from . import display
from .dtypes import DtypeError, dtype as to_dtype, name_of, numpy_dtype
from .kernel import Descriptor, get_kernel, in_body, scalar_arg
from .keywords import refuse_keywords
from .layout import as_array, empty_for
from .lazy import KernelWrapper, one_wrapper
from .operand import (OperandError, OperandSpec, as_ndarray, check, like_inputs, mark_written, origin_of,
                      refuse_overlap)

DTYPES = {"f32": 1, "bf16": 2}      # dtype -> VNNI factor of B
INDEX = "i32"


@dataclass(frozen=True)
class BlockSpmm(Descriptor):
    """One block row of a BCSR A (blocks ``bm x bk``, ``kb`` block columns) times B (kb*bk x n)."""

    bm: int
    bk: int
    n: int
    kb: int
    ldb: int = 0
    ldc: int = 0
    dtype: str = "f32"
    beta: int = 0

    kind = "block_spmm"
    scalars = ("count",)
    count_scalar = "count"

    def __post_init__(self):
        self._normalize()
        for name in ("ldb", "ldc"):
            if not getattr(self, name) and isinstance(self.n, int):
                object.__setattr__(self, name, self.n)

    def validate(self):
        for name in ("bm", "bk", "n", "kb"):
            value = getattr(self, name)
            _need(isinstance(value, int) and 1 <= value < 1 << 24, name, value, "an int from 1 to 2**24 - 1")
        _need(self.dtype in DTYPES, "dtype", self.dtype, " or ".join(map(repr, DTYPES)))
        _need(self.dtype != "bf16" or self.bk % 2 == 0, "bk", self.bk,
              "an even int for dtype='bf16' (B's rows pair up in VNNI2)")
        for name in ("ldb", "ldc"):
            value = getattr(self, name)
            _need(value >= self.n, name, value, f"an int >= n={self.n} (the row width)")
        _need(self.beta in (0, 1) and not isinstance(self.beta, float), "beta", self.beta, "0 or 1")
        for name, nbytes in (("ldb", self.kb * self.bk * self.ldb * 4), ("ldc", self.bm * self.ldc * 4)):
            _need(nbytes < 1 << 31, name, getattr(self, name),
                  "a value that keeps B and C under 2 GiB (the kernel's offsets are 32-bit)")
        block = self.bm * self.bk * (4 if self.dtype == "f32" else 2)
        _need(block < 1 << 31, "bm * bk", self.bm * self.bk,
              f"blocks under 2 GiB (this one is {block >> 30} GiB; the kernel's offsets are 32-bit): smaller bm or bk")

    @property
    def vnni(self):
        return DTYPES[self.dtype]

    def operands(self):
        f = self.vnni
        if f == 1:
            b = OperandSpec("b", "f32", (self.kb * self.bk, self.n), (self.ldb, 1), ld_name="ldb")
        else:
            b = OperandSpec("b", self.dtype, (self.kb * self.bk // f, self.n, f), (self.ldb * f, f, 1))
        return (OperandSpec("rowptr", INDEX, (2,), (1,)),
                OperandSpec("colidx", INDEX, (), (1,), batch=True),
                OperandSpec("values", self.dtype, (self.bm, self.bk), (self.bm * self.bk, self.bk, 1), batch=True),
                b,
                OperandSpec("c", "f32", (self.bm, self.n), (self.ldc, 1), writable=True, ld_name="ldc"))

    def allocated(self):
        """C when the kernel only writes it (beta=0); with beta=1 C is read too, so always passed."""
        return () if self.beta else ("c",)

    def work(self):
        """Bytes + flops of a call with a few stored blocks in the row (the count is not known here)."""
        return 2 * self.bm * self.bk * self.n * 4 + sum(s.nbytes() for s in self.operands())

    def check_indices(self, rowptr, colidx, count):
        """Raise ValueError unless ``rowptr`` (2,) and the ``colidx`` entries it selects are in range."""
        start, end = (int(v) for v in rowptr[:2])
        if not 0 <= start <= end <= count:
            raise ValueError(f"{self.kind}: rowptr = [{start}, {end}] must satisfy 0 <= rowptr[0] <= rowptr[1] <= "
                             f"count={count} (the stored blocks); build it with tppasm.spmm.bcsr(...)")
        cols = np.asarray(colidx[start:end])
        bad = (cols < 0) | (cols >= self.kb)
        if bad.any():
            p = start + int(np.argmax(bad))
            raise ValueError(f"{self.kind}: colidx[{p}] = {int(colidx[p])} is not a block column of A: "
                             f"expected 0..{self.kb - 1} (kb={self.kb} blocks of {self.bk} rows of B)")

    def reference(self, rowptr, colidx, values, b, c, count=None):
        """The same with NumPy (float64 sums), in place on ``c``; ``count`` defaults to what the call
        infers, the blocks ``colidx`` and ``values`` hold."""
        if count is None:
            count = _stored_blocks(colidx, values)
        self.check_indices(rowptr, colidx, count)
        acc = c.astype(np.float64) if self.beta else np.zeros(c.shape)
        if self.vnni > 1:
            b = np.swapaxes(b, -1, -2).reshape(-1, self.n)
        for p in range(int(rowptr[0]), int(rowptr[1])):
            j = int(colidx[p])
            acc += values[p].astype(np.float64) @ b[j * self.bk:(j + 1) * self.bk].astype(np.float64)
        c[...] = acc.astype(c.dtype)


def _stored_blocks(colidx, values):
    """``count`` left out: the blocks ``colidx`` and ``values`` hold (TypeError if they differ)."""
    if len(colidx) != len(values):
        raise TypeError(f"block_spmm: pass count= (the stored blocks): it is inferred only when colidx and values "
                        f"hold the same number of blocks, and colidx holds {len(colidx)}, values {len(values)}")
    return len(colidx)


def _need(ok, name, value, legal):
    if not ok:
        raise ValueError(f"block_spmm: {name}={display.shown(value)}; expected {legal}")


class BlockSpmmKernel(KernelWrapper):
    """A :class:`BlockSpmm` kernel whose calls check the index arrays' contents first (the raw
    kernel's own check can only poison C); in a loop body the call is traced as the kernel's."""

    def __call__(self, rowptr, colidx, values, b, c=None, *, count=None, **wrong):
        """``count`` defaults to the number of blocks ``colidx`` and ``values`` hold (when they agree);
        without ``c`` (beta=0 only) C is allocated and returned."""
        if in_body() and not wrong:
            return self.kernel(*(rowptr, colidx, values, b) + (() if c is None else (c,)), count=count)
        return self._run(self.kernel, (rowptr, colidx, values, b, c), count, wrong)

    def reference(self, rowptr, colidx, values, b, c=None, *, count=None, **wrong):
        """The same with NumPy, on the call's arguments, checked as the call checks them: in place on
        ``c``, or without it on a new C that it returns.

        >>> import numpy as np, tppasm
        >>> k = tppasm.block_spmm(bm=1, bk=1, n=1, kb=2); B = np.ones((2, 1), np.float32)
        >>> k.reference(np.array([0, 2], np.int32), np.array([0, 1], np.int32), np.ones((2, 1, 1), np.float32), B)
        array([[2.]], dtype=float32)
        """
        return self._run(self.kernel.reference, (rowptr, colidx, values, b, c), count, wrong)

    def _run(self, run, objs, count, wrong):
        """``run`` (the kernel, or its reference) on ``objs`` (rowptr, colidx, values, b, c) once they
        passed the call's checks; with ``c`` None, on a new C that it returns."""
        if wrong:
            raise TypeError(display.wrong_call(self.kernel, sum(x is not None for x in objs), wrong))
        rowptr, colidx, values, b, c = objs
        if c is None:
            if self.desc.beta:
                raise TypeError("block_spmm: the kernel was built with beta=1 (C += A @ B), so it reads C: pass c "
                                f"({self.desc.bm}, {self.desc.n}) float32")
            c = empty_for(self.kernel.operands[4])
            self._run(run, objs[:4] + (c,), count, wrong)
            return like_inputs(c, objs[:4])         # (a tensor when an input is one)
        d = self.desc
        count = scalar_arg(d.kind, "count", self.kernel._count_of(objs) if count is None else count)
        ops = self.kernel.operands
        if type(rowptr) is type(colidx) is type(values) is type(b) is type(c) is np.ndarray:
            check(ops[0], rowptr, who=d.kind)
            check(ops[1], colidx, count, who=d.kind)
            d.check_indices(rowptr, colidx, count)
            run(*objs, count=count)
            return
        # torch tensors, DLPack objects (zero-copy views: C's result lands in the caller's tensor), or
        # anything else, checked here in the caller's terms
        arrays = []
        for spec, obj in zip(ops, objs):
            if origin_of(obj) is None:
                check(spec, obj, who=d.kind)           # not an array: say which shape and dtype to pass
            arrays.append(as_ndarray(obj, spec.name, d.kind, writes=spec.writable))
        for spec, arr, obj in zip(ops, arrays, objs):
            check(spec, arr, count, d.kind, origin_of(obj))
        d.check_indices(arrays[0], arrays[1], count)
        refuse_overlap(d.kind, ops, arrays, count, [origin_of(o) for o in objs])    # in the caller's terms
        run(*arrays, count=count)
        mark_written([c])


def block_spmm(bm, bk, n, kb, dtype="f32", *, ldb=0, ldc=0, beta=0, isa=None, **wrong):
    """A JIT'd block-sparse x dense kernel (see the module docstring): call it as
    ``spmm(rowptr, colidx, values, B, C, count=stored_blocks)``.

    >>> import tppasm
    >>> tppasm.block_spmm(bm=4, bk=4, n=64, kb=8).desc.kind
    'block_spmm'
    """
    refuse_keywords("block_spmm", wrong, None)
    desc = BlockSpmm(bm=bm, bk=bk, n=n, kb=kb, ldb=ldb, ldc=ldc, dtype=dtype, beta=beta)
    return checked(get_kernel(desc, isa))


def checked(kernel):
    """The :class:`BlockSpmmKernel` over ``kernel`` (:func:`tppasm.lazy.one_wrapper`: one per kernel).

    >>> import copy, tppasm
    >>> k = tppasm.block_spmm(bm=2, bk=2, n=8, kb=2)
    >>> k is tppasm.block_spmm(bm=2, bk=2, n=8, kb=2) is copy.copy(k)
    True
    """
    return one_wrapper(kernel, BlockSpmmKernel)


# -- BCSR helpers -------------------------------------------------------------------------------

def bcsr(a, bm, bk, dtype=None):
    """(rowptr, colidx, values) of dense ``a`` (M x K) in blocks of ``bm x bk``: every block with a
    nonzero is stored (at least one block is always stored: an all-zero ``a`` keeps one unused
    block). ``dtype`` converts the values (e.g. "bf16").

    >>> a = np.zeros((4, 6), np.float32); a[0, 5] = 1; a[3, 0] = 2
    >>> rowptr, colidx, values = bcsr(a, 2, 3)
    >>> rowptr.tolist(), colidx.tolist(), values.shape
    ([0, 1, 2], [1, 0], (2, 2, 3))
    """
    _block_sizes("bcsr", bm, bk)
    a = as_array(a, "bcsr")                     # (a bf16 torch tensor too, which np.asarray refuses)
    if a.ndim != 2 or a.shape[0] % bm or a.shape[1] % bk:
        raise ValueError(f"bcsr: a must be 2-D with bm={bm} dividing its rows and bk={bk} its columns, "
                         f"got shape {a.shape}")
    mb, kb = a.shape[0] // bm, a.shape[1] // bk
    blocks = a.reshape(mb, bm, kb, bk).transpose(0, 2, 1, 3)
    keep = blocks.reshape(mb, kb, bm * bk).any(axis=2)
    rows, cols = np.nonzero(keep)
    rowptr = np.zeros(mb + 1, np.int32)
    np.cumsum(keep.sum(axis=1), out=rowptr[1:])
    dt = a.dtype if dtype is None else to_dtype(dtype)
    values = np.zeros((max(len(rows), 1), bm, bk), dt)
    values[:len(rows)] = blocks[rows, cols]
    colidx = np.zeros(max(len(rows), 1), np.int32)
    colidx[:len(rows)] = cols
    return rowptr, colidx, values


def random_block_sparse(m, k, bm, bk, sparsity, rng, dtype=np.float32):
    """A dense (m x k) matrix whose ``bm x bk`` blocks are zero with probability ``sparsity``
    (exactly round(sparsity * blocks) of them), the others standard normal. ``dtype``: a float
    (f32, bf16, float16, float64) or an integer one, whose values are the normal ones rounded
    (unsigned: their magnitudes); a kept block that comes out all zero in ``dtype`` is drawn
    again, so every other block holds a nonzero.

    >>> a = random_block_sparse(8, 8, 4, 4, 0.5, np.random.default_rng(0))
    >>> int((a.reshape(2, 4, 2, 4).transpose(0, 2, 1, 3).reshape(4, 16) != 0).any(axis=1).sum())
    2
    """
    _block_sizes("random_block_sparse", bm, bk)
    for name, size, block in (("m", m, bm), ("k", k, bk)):
        if not _is_size(size) or size % block:
            raise ValueError(f"random_block_sparse: {name}={size!r}; expected a positive multiple of "
                             f"b{name}={block} (whole blocks)")
    if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float, np.integer, np.floating)) or \
            not 0.0 <= sparsity <= 1.0:
        raise ValueError(f"random_block_sparse: sparsity={sparsity!r} must be a number in [0, 1]")
    if not (hasattr(rng, "permutation") and hasattr(rng, "standard_normal")):
        raise TypeError(f"random_block_sparse: rng={rng!r} is not a NumPy random generator; pass "
                        "np.random.default_rng(seed)")
    dt = _value_dtype(dtype)
    mb, kb = m // bm, k // bk
    zero = np.zeros(mb * kb, bool)
    zero[rng.permutation(mb * kb)[:int(round(sparsity * mb * kb))]] = True
    zero = zero.reshape(mb, kb)
    a = _normal_as(rng.standard_normal((mb, kb, bm, bk)), dt)
    a[zero] = 0
    redraw = ~zero & ~(a != 0).any(axis=(2, 3))
    while redraw.any():                     # (an integer dtype rounds 38% of the normals to 0)
        a[redraw] = _normal_as(rng.standard_normal((int(redraw.sum()), bm, bk)), dt)
        redraw &= ~(a != 0).any(axis=(2, 3))
    return np.ascontiguousarray(a.transpose(0, 2, 1, 3).reshape(m, k))


def _normal_as(x, dt):
    """Standard normal ``x`` in ``dt``: rounded for an integer dtype (magnitudes for an unsigned one)."""
    if dt.kind == "u":
        x = np.abs(x)
    return np.rint(x).astype(dt) if dt.kind in "iu" else x.astype(dt)


def _value_dtype(dtype):
    """``dtype`` as a NumPy dtype: a tppasm name or any NumPy float or integer one (DtypeError naming
    the dtypes if neither)."""
    try:
        dt = numpy_dtype(dtype)
    except TypeError:
        name_of(dtype, "random_block_sparse")        # raises DtypeError naming the dtypes
        raise
    if dt.kind not in "fiu" and dt.name != "bfloat16":
        raise DtypeError(f"random_block_sparse: dtype={dt.name}; expected a float (f32, bf16, float16, float64) or "
                         "integer dtype, e.g. dtype=np.float32")
    return dt


def _is_size(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1


def _block_sizes(who, bm, bk):
    for name, size in (("bm", bm), ("bk", bk)):
        if not _is_size(size):
            raise ValueError(f"{who}: {name}={size!r}; expected a positive int block size")


def check_bcsr(rowptr, colidx, count, kb):
    """Raise ValueError unless ``rowptr`` is non-decreasing from >= 0 to <= ``count`` and every
    stored block it selects has a block column in 0..kb-1 (what a loop nest over the block rows
    needs before it runs the raw kernels).

    >>> check_bcsr(np.array([0, 2, 1], np.int32), np.zeros(2, np.int32), 2, 4)
    Traceback (most recent call last):
    ...
    ValueError: check_bcsr: rowptr decreases at block row 1 (2 then 1); rowptr must be non-decreasing
    """
    rowptr, colidx = np.asarray(rowptr), np.asarray(colidx)
    if rowptr.ndim != 1 or len(rowptr) < 2:
        raise OperandError(f"check_bcsr: rowptr must be 1-D with one entry per block row plus one, got shape "
                           f"{rowptr.shape}")
    for name, a in (("rowptr", rowptr), ("colidx", colidx)):
        if a.dtype.kind not in "iu" or a.ndim != 1:
            raise OperandError(f"check_bcsr: {name} must be a 1-D integer array (int32, as the kernels read it), got "
                               f"{a.dtype} of shape {a.shape}; build them with tppasm.spmm.bcsr(...)")
    if rowptr[0] < 0 or rowptr[-1] > min(count, len(colidx)):
        raise ValueError(f"check_bcsr: rowptr runs from {int(rowptr[0])} to {int(rowptr[-1])}; it must stay in "
                         f"0..{min(count, len(colidx))} (the stored blocks)")
    falls = rowptr[1:] < rowptr[:-1]        # (np.diff would wrap around for an unsigned rowptr)
    if falls.any():
        i = int(np.argmax(falls))
        raise ValueError(f"check_bcsr: rowptr decreases at block row {i} ({int(rowptr[i])} then "
                         f"{int(rowptr[i + 1])}); rowptr must be non-decreasing")
    used = colidx[int(rowptr[0]):int(rowptr[-1])]
    bad = (used < 0) | (used >= kb)
    if bad.any():
        p = int(rowptr[0]) + int(np.argmax(bad))
        raise ValueError(f"check_bcsr: colidx[{p}] = {int(colidx[p])} is not a block column: expected 0..{kb - 1}")
