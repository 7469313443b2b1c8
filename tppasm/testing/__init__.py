"""Property-based testing of kernels: check a kernel or loop kernel against its NumPy reference.

:func:`assert_matches_reference` runs the native code on copies of the arrays whose outputs are
poisoned, and the NumPy reference (a kernel's ``reference``, a loop kernel's ``python``) on other
copies, then checks that

- every output element was written (a write-only output holds poison nowhere afterwards: it is
  filled with a signalling NaN (or a byte pattern) for one run, a huge positive finite value for
  a second and a huge negative one for a third), and no run's result depends on the poison (each
  run's values are compared, so reading a write-only output shows, even through max or min);
- nothing outside an operand changed (each copy sits in a buffer whose padding between rows and
  guards around are poison, compared bit for bit afterwards: 64 bytes, or one step of the
  array's outermost dimension up to 64 KiB, so a row or block written one too far shows; of
  padding beyond 16 MiB and four times the array, a huge leading dimension's, the window of a row's
  length either side of each row), and no input changed;
- every written array matches the reference: exactly for integers, within dtype-aware
  tolerances for floats (``tppasm.testing.compare``): element-wise kinds per element (fp32 within
  ``rtol`` 1e-5 of each reference value, bf16 within two bf16 ulps of it; a reduction to the
  largest value too), kinds that sum (BRGEMMs, add and sumsq reductions, norms, softmax, muladd,
  rotary, loop kernels) within ``rtol * |reference| + rtol * max|reference|`` (sums that cancel;
  softmax and rotary: the largest of each row, which they compute apart; norms: ``rtol`` times each
  element's size ``r |gamma| (max|x_row| + |mean|) + |beta|``, r = 1/sqrt(var + eps)), and those
  that sum products (BRGEMMs, gemm_nt, block SpMM, muladd, add and sumsq reductions) also within
  ``max(rtol, n u / (1 - n u))`` (n terms, u = 2**-24) times the element's reference on the
  absolute values of the inputs (``|c| + |bias| + sum |a||b|``, the size its rounding scales
  with; with the default ``rtol`` each element's bound is then its own: ``rtol * |reference|`` or
  ``max(rtol, 2 n u / (1 - n u))`` times its size, without ``rtol * max|reference|``, and after a
  BRGEMM epilogue that bends the sum (GELU, sigmoid, tanh) ``rtol * |reference|`` plus its
  steepest slope near the element's sum times that, sizes and sums taken before it); both at
  least 2**-137 (4096 subnormal ulps: results that are all subnormal, where the rounding of each of
  up to 8192 terms adds up to half an ulp),
  kernels computing in bf16 at least 2**20 smallest normals (bf16 dot products flush denormal
  inputs and products to zero), ``gelu_erf_fast`` within its documented 2**-22 max(1, |x|); NaN
  where the reference has NaN, infinities equal; elements a TPP leaves unspecified (its
  descriptor's ``unspecified``: quantize's codes of a row holding a NaN or inf) are not compared.

On a mismatch it raises AssertionError naming the kernel, the array, how many elements differ and
the first of them, with the arrays themselves when they are small (a case to paste). Pass it a
hypothesis strategy instead of arrays (``tppasm.testing.strategies``: operands of a kernel,
shapes with tails, leading dimensions, unaligned arrays, bf16/int8 edge values, VNNI-packed B,
loop bounds and block sizes) and it runs the check for each example, hypothesis shrinking any
failure to a minimal one.

Importing this package does not import hypothesis; the strategies do (the ``test`` extra).

>>> import numpy as np, tppasm
>>> from tppasm.testing import assert_matches_reference
>>> x = np.array([[-1.0, 2.0, -3.0]], np.float32)
>>> assert_matches_reference(tppasm.relu(1, 3), x, np.empty_like(x))       # passes silently
>>> assert_matches_reference(tppasm.relu(1, 3))          # a hypothesis strategy of its operands
"""
import re
from datetime import timedelta

import numpy as np

from ..dtypes import numpy_dtype
from ..kernel import ISAUnavailableError, scalar_arg
from ..layout import empty, empty_for
from ..operand import as_ndarray, check as check_operand, origin_of
from .compare import (FTZ_ATOL, NORM_KINDS, RTOL, SUBNORMAL_ATOL, bounds_terms, compare as _compare,  # noqa: F401
                      documented_atol, epilogue, flushed_atol, is_summing, norm_sizes, row_wise, scratch_hint,
                      scratch_positions, terms_summed, unwritten_hint, without_epilogue)

GUARD = 64                                # bytes of poison before and after each copy, at least
GUARD_MAX = 64 << 10                      # ... and at most, when one outer step is larger
SPARSE_PADDING = 16 << 20                 # padding bytes past which only windows around the rows are poisoned
# poison bit patterns of the three runs per item size for floats: a signalling NaN that no
# arithmetic produces, then huge finite values of opposite signs (max(out, ...) keeps the positive
# one, min(out, ...) the negative one, and vmaxps/vminps pass a NaN first operand through); for
# integers byte patterns of both signs
FLOAT_POISON = {2: (0x7FA5, 0x7F7A, 0xFF7A), 4: (0x7FA5A5A5, 0x7F7A5A5A, 0xFF7A5A5A),
                8: (0x7FF4A5A5A5A5A5A5, 0x7FEA5A5A5A5A5A5A, 0xFFEA5A5A5A5A5A5A)}
INT_POISON = (0xA5, 0x5A, 0x81)
RUNS = len(INT_POISON)
HYPOTHESIS_DEADLINE = timedelta(milliseconds=200)   # hypothesis' default, which a check does not keep


_STRATEGIES = ("TAILS", "dims", "shapes", "leading_dimensions", "dtypes", "values", "arrays", "vnni_b", "operands",
               "block_sizes", "loop_bounds")     # tppasm.testing.strategies.__all__, served from here too


def __getattr__(name):
    """The strategies, imported (with hypothesis) on first use: ``tppasm.testing.operands``...
    Any other name is an AttributeError without importing them (``hasattr`` works without hypothesis)."""
    if name != "strategies" and name not in _STRATEGIES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    strategies = importlib.import_module(__name__ + ".strategies")    # (without hypothesis: says what to install)
    return strategies if name == "strategies" else getattr(strategies, name)


def poison_bits(dtype, run):
    """The poison bit pattern (an unsigned int of the item size) of run 0, 1 or 2 for ``dtype``.

    >>> hex(poison_bits(np.float32, 0)), hex(poison_bits(np.int8, 1))
    ('0x7fa5a5a5', '0x5a')
    """
    dt = numpy_dtype(dtype)                      # "i8" is tppasm's int8 (NumPy's int64)
    if isinstance(run, bool) or run not in range(RUNS):
        raise ValueError(f"poison_bits: run={run!r}; expected 0 (the first run), 1 or 2")
    if dt.name == "bfloat16" or (dt.kind == "f" and dt.itemsize in FLOAT_POISON):
        return FLOAT_POISON[dt.itemsize][run]
    if dt.kind in "iub":
        return int.from_bytes(bytes([INT_POISON[run]]) * dt.itemsize, "little")
    raise ValueError(f"poison_bits: dtype {dt} is no kernel operand's; expected floats (2, 4 or 8 bytes, "
                     "bfloat16) or integers")


def _bits(a):
    return a.view(f"u{a.itemsize}")


class Guarded:
    """A copy of ``array`` with the same strides and alignment modulo 64 bytes, inside a buffer
    whose other elements (row padding, guards) hold ``poison``; :meth:`outside_changed` says
    whether any of them changed.

    >>> import numpy as np
    >>> from tppasm.testing import Guarded
    >>> g = Guarded(np.zeros((2, 3), np.float32), poison=0x7FA5A5A5)
    >>> g.view[1, 2] = 1.0; len(g.outside_changed())             # inside the copy: fine
    0
    >>> g.buffer[-1] = 0.0; len(g.outside_changed())             # a guard element: shows
    1
    """

    def __init__(self, array, poison, fill_view=False):
        a = np.asarray(array)
        if any(s < 0 for s in a.strides):
            raise ValueError("assert_matches_reference: arrays with negative strides are not kernel operands; "
                             "pass np.ascontiguousarray(...)")
        item = a.itemsize
        span = (sum((d - 1) * s for d, s in zip(a.shape, a.strides)) + item) if a.size else 0
        guard = guard_bytes(a)
        lead = guard + (a.ctypes.data % 64) // item * item
        total = -(-(lead + span + guard) // item)
        self.buffer = empty((total,), a.dtype)          # only the windows below are touched
        self.poison = poison
        self.view = np.lib.stride_tricks.as_strided(self.buffer[lead // item:], a.shape, a.strides)
        self.windows = poison_windows(a, lead // item, total, guard)
        for start, stop in self.windows:
            _bits(self.buffer[start:stop])[...] = poison
        self.cover = np.zeros(total, bool)              # zeroed pages stay virtual but for the view's
        np.lib.stride_tricks.as_strided(self.cover[lead // item:], a.shape,
                                        [s // item for s in a.strides])[...] = True
        if not fill_view:
            self.view[...] = a

    def outside_changed(self):
        """Indices (into the buffer) of poison elements outside the view that changed."""
        found = [start + np.flatnonzero(~self.cover[start:stop] & (_bits(self.buffer[start:stop]) != self.poison))
                 for start, stop in self.windows]
        return np.concatenate(found) if found else np.zeros(0, np.intp)

    def unwritten(self):
        """A boolean mask over the view: elements that still hold the poison."""
        return _bits(np.ascontiguousarray(self.view)) == self.poison


def guard_bytes(array):
    """Bytes of poison on each side of a copy of ``array``: its largest step (a row of a matrix, a
    block of a batch) rounded up to 64 bytes, so a whole row or block written one too far lands
    in them, at least :data:`GUARD` and at most :data:`GUARD_MAX`.

    >>> guard_bytes(np.zeros(5, np.float32)), guard_bytes(np.zeros((4, 100), np.float32)[:, :8])
    (64, 448)
    """
    step = max((s for d, s in zip(array.shape, array.strides) if d > 1), default=0)
    return min(max(GUARD, -(-step // 64) * 64), GUARD_MAX)


def poison_windows(array, lead, total, guard):
    """The (start, stop) element ranges of a copy's buffer of ``total`` elements (``array``'s
    elements from element ``lead`` on, ``guard`` bytes of guard each side) that hold poison and are
    checked: the whole buffer, unless the padding between the array's runs of adjacent elements
    exceeds :data:`SPARSE_PADDING` and four times the array (a huge leading dimension); then each run
    with a window of its own length (:data:`GUARD` bytes to ``guard``) either side, and the guards.

    >>> x = np.zeros((2, 10**8), np.float32)[:, :4]            # virtual: no page is touched
    >>> poison_windows(x[:1], 16, 36, 64), poison_windows(x, 16, 10**8 + 36, 64)
    ([(0, 36)], [(0, 36), (100000000, 100000036)])
    """
    item = array.itemsize
    if (total - array.size) * item <= max(SPARSE_PADDING, 4 * array.nbytes):
        return [(0, total)]
    offsets = np.zeros((), np.int64)
    for d, s in zip(array.shape, array.strides):
        offsets = offsets[..., None] + np.arange(d, dtype=np.int64) * (s // item)
    offsets = offsets.ravel() + lead
    if not np.all(offsets[1:] > offsets[:-1]):     # falling strides (a view's rows) list them in order
        offsets = np.unique(offsets)
    breaks = np.flatnonzero(np.diff(offsets) != 1) + 1
    starts, ends = offsets[np.r_[0, breaks]], offsets[np.r_[breaks - 1, len(offsets) - 1]] + 1
    pad = min(max(GUARD, -(-int((ends - starts).max()) * item // 64) * 64), guard) // item
    lo, hi = np.maximum(starts - pad, 0), np.minimum(ends + pad, total)
    lo[0], hi[-1] = 0, total
    reach = np.maximum.accumulate(hi)
    first = np.flatnonzero(np.r_[True, lo[1:] > reach[:-1]])
    last = np.r_[first[1:] - 1, len(lo) - 1]
    return [(int(a), int(b)) for a, b in zip(lo[first], reach[last])]


def _kind(kernel):
    if hasattr(kernel, "python") and hasattr(kernel, "array_names"):
        return "loop"
    # a BRGEMM batched by offsets or addresses takes other arrays than its raw kernel's operands;
    # other wrappers (block_spmm's, which checks the indices first) take the operands as they are
    if hasattr(kernel, "kernel") and getattr(getattr(kernel, "desc", None), "kind", None) == "brgemm":
        return "batched"
    if hasattr(kernel, "operands") and hasattr(kernel, "desc"):
        return "kernel"
    raise TypeError(f"assert_matches_reference: {type(kernel).__name__} is not a tppasm kernel or loop kernel; "
                    "pass what tppasm.unary(...)/brgemm(...)/... or @loops.kernel(...) returns")


def _roles(kernel, kind, arrays, outputs):
    """(names, written indices, write-only indices) of the call's arrays."""
    if kind == "loop":
        names = list(kernel.array_names)
        access = kernel.accesses(*arrays)
        written = [i for i, n in enumerate(names) if "written" in access[n]]
        only = [i for i, n in enumerate(names) if access[n] == "written"]
    elif kind == "batched":
        names = ["a", "b", "c"] + (["offsets"] if kernel.desc.batch == "offset" else []) + \
            (["bias"] if kernel.desc.bias else [])
        written = [2]
        only = [2] if "c" in kernel.desc.allocated() else []      # beta=0: C only written, so poisoned
    else:
        names = [s.name for s in kernel.operands]
        alloc = set(kernel.desc.allocated())
        written = [i for i, s in enumerate(kernel.operands) if s.writable]
        only = [i for i, s in enumerate(kernel.operands) if s.name in alloc]
    if outputs is not None:
        picked = [_position(o, names) for o in ([outputs] if isinstance(outputs, (str, int, np.integer)) else outputs)]
        for i in picked:
            if i not in written:
                raise ValueError(f"assert_matches_reference: outputs names {names[i]!r}, which the kernel only "
                                 f"reads; name arrays it writes ({', '.join(names[j] for j in written)}), or leave "
                                 "outputs= out")
        only = picked
        written = sorted(set(written) | set(picked))
    return names, written, only


def _position(output, names):
    """The position of ``output`` (a name in ``names`` or a position) among the call's arrays."""
    if isinstance(output, str) and output in names:
        return names.index(output)
    if isinstance(output, (int, np.integer)) and not isinstance(output, (bool, np.bool_)) and \
            0 <= output < len(names):
        return int(output)
    raise ValueError(f"assert_matches_reference: outputs holds {output!r}; expected names of the arrays "
                     f"({', '.join(names)}) or their positions 0..{len(names) - 1}")


def _operands_of(kernel, kind, arrays, count):
    """``arrays`` as NumPy arrays (torch tensors and DLPack objects viewed, not copied), a kernel's
    write-only outputs added where only its inputs are given (as a call allocates them), each
    checked against the kernel's operands: OperandError (a ValueError) names what to pass."""
    arrays = [as_ndarray(a, f"#{i}", "assert_matches_reference") if origin_of(a) in ("torch", "dlpack") else a
              for i, a in enumerate(arrays)]
    if kind == "loop" and count is not None:
        raise TypeError(f"assert_matches_reference: count={count!r} is given for a loop kernel, which takes no "
                        "count (its arrays' shapes say how much to compute); leave count= out")
    if kind == "batched":             # C left out (or None) with beta=0: allocated, as the call does
        arrays = list(kernel._with_c(tuple(arrays), {})[0])
    if kind != "kernel":              # the call checks them (batched BRGEMMs, loop kernels), but the
        for i, a in enumerate(arrays):    # copies need a dtype that can hold poison
            if isinstance(a, np.ndarray) and not (a.dtype.kind in "iubf" or a.dtype.name == "bfloat16"):
                raise ValueError(f"assert_matches_reference: array #{i} has dtype {a.dtype}, which no kernel "
                                 "takes; pass arrays of the dtypes the kernel computes in")
        return arrays
    specs, who = kernel.operands, f"assert_matches_reference: {kernel.desc.kind}"
    alloc = [i for i, s in enumerate(specs) if s.name in kernel.desc.allocated()]
    if alloc and len(arrays) == len(specs) - len(alloc):
        given = iter(arrays)
        arrays = [empty_for(s) if i in alloc else next(given) for i, s in enumerate(specs)]
    if len(arrays) != len(specs):
        inputs = [s.name for i, s in enumerate(specs) if i not in alloc]
        also = f", or its {len(inputs)} inputs ({', '.join(inputs)})" if alloc else ""
        raise TypeError(f"{who} takes {len(specs)} arrays ({', '.join(s.name for s in specs)}){also}; "
                        f"got {len(arrays)}")
    if count is not None:
        n = scalar_arg(who, "count", count)
    elif kernel.desc.count_scalar is not None:
        n = kernel._count_of(arrays)
    else:
        n = 1
    for spec, a in zip(specs, arrays):
        check_operand(spec, a, n, who)
    return arrays


def _call(kernel, kind, arrays, count):
    if kind == "loop":
        return kernel(*arrays)
    return kernel(*arrays) if count is None else kernel(*arrays, count=count)


def _reference(kernel, kind, arrays, count):
    if kind == "loop":
        return kernel.python(*arrays)
    if kernel.desc.count_scalar is None:
        return kernel.reference(*arrays)
    return kernel.reference(*arrays, count=_count(kernel, kind, arrays, count))


def _count(kernel, kind, arrays, count):
    """The blocks a call of a batched kernel on ``arrays`` sums: ``count``, or as the call infers it."""
    if kernel.desc.count_scalar is None:
        return 1
    if count is None:
        if kind == "batched":
            from ..brgemm import _batch_count
            return _batch_count(kernel.desc, arrays[0], arrays[1], arrays[3:])
        return kernel._count_of(arrays)
    return count


def _absolute(a):
    """A copy of ``a`` (its layout kept) with each float replaced by its absolute value; integers
    (indices, offsets, addresses) as they are; a list of blocks block by block."""
    if isinstance(a, (list, tuple)):
        return [_absolute(x) for x in a]
    if not isinstance(a, np.ndarray):
        return a
    view = Guarded(a, 0).view
    if view.dtype.kind == "f" or view.dtype.name == "bfloat16":
        with np.errstate(invalid="ignore"):
            view[...] = np.abs(view)
    return view


def _magnitudes(kernel, kind, arrays, count):
    """(each array's per-element sum of the sizes of its terms, or None; the terms each sums; each
    array's sums before the kernel's epilogue, or None): the reference on the absolute values of
    the float inputs (:func:`compare.bounds_terms`), and without the epilogue on the inputs (a
    BRGEMM's act: its C); a norm's output: :func:`compare.norm_sizes`."""
    none = [None] * len(arrays)
    if kind == "kernel" and kernel.desc.kind in NORM_KINDS:
        return none[:-1] + [norm_sizes(kernel.desc, *arrays[:-1])], 1, none
    if not bounds_terms(kernel, kind):
        return none, 1, none
    sizes, sums, blocks = [_absolute(a) for a in arrays], list(none), _count(kernel, kind, arrays, count)
    with np.errstate(invalid="ignore", over="ignore"):
        if epilogue(kernel) is None:
            _reference(kernel, kind, sizes, count)
        else:                               # the sums the epilogue bends (a BRGEMM's act), in float64
            bare = without_epilogue(kernel.desc)
            bare.reference(*sizes, count=blocks)
            plain = list(arrays)
            plain[2] = sums[2] = np.asarray(arrays[2]).astype(np.float64)
            bare.reference(*plain, count=blocks)
    n = terms_summed(kernel.desc, int(blocks))
    return [s if isinstance(s, np.ndarray) else None for s in sizes], n, sums


def _case(names, arrays, only, count):
    """The arrays as code to paste, when they are small (write-only outputs as ``np.empty``)."""
    if sum(np.asarray(a).size for a in arrays if isinstance(a, np.ndarray)) > 256:
        return "arrays: " + ", ".join(f"{n} {a.dtype}{a.shape}" for n, a in zip(names, arrays)
                                      if isinstance(a, np.ndarray))
    lines = []
    for i, (n, a) in enumerate(zip(names, arrays)):
        if not isinstance(a, np.ndarray):
            continue
        dt = "ml_dtypes.bfloat16" if a.dtype.name == "bfloat16" else "np." + a.dtype.name
        with np.errstate(invalid="ignore"):
            values = a.astype(np.float32).tolist() if a.dtype.name == "bfloat16" else a.tolist()
        values = re.sub(r"\b(nan|inf)\b", r"np.\1", repr(values))     # (a bare nan or inf does not paste)
        lines.append(f"{n} = np.empty({a.shape}, {dt})" if i in only else f"{n} = np.array({values}, {dt})")
    return "case:\n  " + "\n  ".join(lines) + (f"\n  count = {count}" if count is not None else "")


def _poison_text(dtype, run):
    """What run ``run`` fills a write-only output of ``dtype`` with, in words."""
    value = np.array([poison_bits(dtype, run)], f"u{np.dtype(dtype).itemsize}").view(dtype)[0]
    with np.errstate(invalid="ignore"):
        return repr(float(value)) if np.dtype(dtype).kind == "f" or np.dtype(dtype).name == "bfloat16" \
            else repr(int(value))


def _refuse_misuse(kernel, rtol, atol):
    """``kernel``'s kind; TypeError or ValueError for what no check can run with (a tolerance that is no
    number, a kernel for an ISA this host lacks), raised before any example is drawn."""
    kind = _kind(kernel)
    for name, tol in (("rtol", rtol), ("atol", atol)):
        if tol is not None and (isinstance(tol, bool) or not isinstance(tol, (int, float, np.integer, np.floating))
                                or not 0 <= tol < np.inf):
            raise ValueError(f"assert_matches_reference: {name}={tol!r}; expected a finite number >= 0 (inf would "
                             "compare no value), or None for the dtype's default (see tppasm.testing)")
    if kind != "loop" and not getattr(kernel, "runnable", True):
        where = "under the emulator, isa.aarch64.emulate" if str(getattr(kernel, "isa", "")).startswith("sve") \
            else "in the interpreter, isa.x86.interp"
        raise ISAUnavailableError(f"assert_matches_reference: {kernel!r} cannot run on this host; check it where "
                                  f"it runs (or {where})")
    return kind


def check(kernel, arrays, count=None, outputs=None, rtol=None, atol=None):
    """The checks of :func:`assert_matches_reference` on one set of arrays; a list of problems.

    >>> import numpy as np, tppasm
    >>> from tppasm.testing import check
    >>> x = np.array([[-1.0, 2.0, -3.0]], np.float32)
    >>> check(tppasm.relu(1, 3), [x, np.empty_like(x)])
    []
    """
    kind = _refuse_misuse(kernel, rtol, atol)
    arrays = _operands_of(kernel, kind, arrays, count)
    names, written, only = _roles(kernel, kind, arrays, outputs)
    scratch = scratch_positions(kernel, kind, names)
    runs = []
    for run in range(RUNS):
        copies = []
        for i, a in enumerate(arrays):
            if not isinstance(a, np.ndarray):
                copies.append(a)                # address-batch block lists, used as given
                continue
            copies.append(Guarded(a, poison_bits(a.dtype, run if i in only else 0), fill_view=i in only))
        _call(kernel, kind, [c.view if isinstance(c, Guarded) else c for c in copies], count)
        runs.append(copies)
    # copies in the arrays' own layout: the reference checks its operands as a call does (row strides too)
    ref = [Guarded(a, 0).view if isinstance(a, np.ndarray) else a for a in arrays]
    with np.errstate(invalid="ignore"):    # NumPy warns as it casts a signalling NaN input: expected here
        _reference(kernel, kind, ref, count)
    skip = {} if kind == "loop" else kernel.desc.unspecified(*ref)
    problems = []
    summing, documented = is_summing(kernel, kind), documented_atol(kernel, kind, arrays)
    flushed = flushed_atol(kernel, kind, arrays)
    none = [None] * len(arrays)
    sizes, terms, sums = _magnitudes(kernel, kind, arrays, count) if atol is None else (none, 1, none)
    act, rows = epilogue(kernel), row_wise(kernel, kind)
    for i, copies in enumerate(zip(*runs)):
        first = copies[0]
        if not isinstance(first, Guarded):
            continue
        for copy in copies:
            outside = copy.outside_changed()
            if len(outside):
                many = len(outside) != 1
                problems.append(f"{names[i]}: {len(outside)} element{'s were' if many else ' was'} written outside the "
                                "operand (row padding or guard bytes)")
                break
        if i in scratch:
            continue                            # declared scratch (loops.scratch): what it holds is no result
        if i in only:
            missed = np.argwhere(np.logical_and.reduce([c.unwritten() for c in copies]))
            if len(missed):
                problems.append(f"{names[i]}: {len(missed)} of {first.view.size} output elements were never "
                                f"written, first at {tuple(int(v) for v in missed[0])}"
                                + unwritten_hint(kind, names[i]))
                continue
        if i in written:
            bf16 = getattr(getattr(kernel, "desc", None), "dtype", None) == "bf16"
            floor = None if atol is not None else (FTZ_ATOL if bf16 else SUBNORMAL_ATOL) + documented
            for run, copy in enumerate(copies if i in only else copies[:1]):
                found = _compare(names[i], copy.view, ref[i], rtol, atol, floor, skip.get(names[i]), summing,
                                 sizes[i], terms, exact=True, epilogue=act, rows=rows, sums=sums[i],
                                 flushed=flushed if flushed is not None and flushed.shape == ref[i].shape else None)
                if found:
                    if not run:
                        found = [found[0] + scratch_hint(kind, names[i], copy.view, ref[i], arrays[i])]
                    problems += found if not run else [f"{found[0]} (the output poisoned with "
                                                       f"{_poison_text(copy.view.dtype, run)} before the call: "
                                                       "the kernel reads its write-only output)"]
                    break
        elif not np.array_equal(_bits(np.ascontiguousarray(first.view)), _bits(np.ascontiguousarray(arrays[i]))):
            problems.append(f"{names[i]}: an input was changed by the kernel")
    if problems:
        problems.append(_case(names, arrays, only, count))
    return problems


def assert_matches_reference(kernel, *arrays, count=None, outputs=None, rtol=None, atol=None,
                             max_examples=None):
    """Check ``kernel`` (a kernel, or a ``@loops.kernel`` loop kernel) against its NumPy
    reference on ``arrays``, or on each example of a hypothesis strategy of array tuples (given
    as the only array argument; none: :func:`tppasm.testing.strategies.operands` of the kernel).

    ``arrays`` are what a call takes: every operand, or a kernel's inputs alone (its write-only
    outputs are then allocated); torch tensors and DLPack objects are viewed as NumPy arrays. A
    kernel's arrays are checked against its operands first (OperandError, a ValueError, says
    what to pass). ``count``: a batched kernel's count (default: inferred, as a call does). ``outputs``: names
    or positions of write-only arrays to poison and check as fully written (default: the
    outputs the kernel only writes; for a loop kernel, the arrays its calls only write; ``()``:
    none, for a nest that leaves part of an output by design). A loop kernel's arrays declared
    scratch (``loops.kernel(..., scratch=("S",))``, :mod:`loops.scratch`) are not compared.
    ``rtol``/``atol``: float tolerances (defaults in the module docstring). ``max_examples``:
    hypothesis examples (default: the active hypothesis profile's), with a strategy only. The
    examples have no deadline, unless the active hypothesis profile sets one other than
    hypothesis' default 200 ms.

    >>> import numpy as np, tppasm
    >>> from tppasm.testing import assert_matches_reference
    >>> gemm = tppasm.brgemm(m=4, n=3, k=5, beta=0)
    >>> a, b = np.ones((1, 4, 5), np.float32), np.ones((1, 5, 3), np.float32)
    >>> assert_matches_reference(gemm, a, b, np.empty((4, 3), np.float32))     # every operand: passes silently
    >>> assert_matches_reference(gemm, a, b)                  # the inputs only: C is allocated
    >>> assert_matches_reference(tppasm.relu(2, 3), max_examples=5)     # drawn operands (needs hypothesis)
    >>> assert_matches_reference(gemm, a, b, np.empty((4, 3), np.float32), rtol=-1)
    Traceback (most recent call last):
    ...
    ValueError: assert_matches_reference: rtol=-1; expected a finite number >= 0...
    """
    strategy = arrays[0] if len(arrays) == 1 and _is_strategy(arrays[0]) else None
    if strategy is None and any(_is_strategy(a) for a in arrays):
        raise TypeError("assert_matches_reference: a hypothesis strategy is given beside arrays; pass it as the "
                        "only array argument, drawing the whole tuple (st.tuples(strategy, st.just(out)))")
    if not arrays:
        strategy = _operands_strategy(kernel)
    if strategy is not None:
        _refuse_misuse(kernel, rtol, atol)        # before hypothesis runs (and saves the error as a failure)
    if strategy is None:
        if max_examples is not None:
            raise TypeError(f"assert_matches_reference: max_examples={max_examples!r} is given with arrays, which "
                            "are one example; drop max_examples=, or pass a hypothesis strategy of array tuples "
                            "(or no arrays) to check that many examples")
        problems = check(kernel, arrays, count, outputs, rtol, atol)
        if problems:
            raise AssertionError(f"{kernel!r} does not match its reference:\n" + "\n".join(problems))
        return
    from hypothesis import given, settings

    chosen = _settings(max_examples)

    @given(strategy)
    def run(case):
        if not isinstance(case, (tuple, list)):
            raise TypeError(f"assert_matches_reference: the strategy drew a {type(case).__name__}, not a tuple of "
                            "the arrays of a call; draw tuples (st.tuples(...), tppasm.testing.strategies.operands"
                            "(kernel))")
        assert_matches_reference(kernel, *case, count=count, outputs=outputs, rtol=rtol, atol=atol)
    # hypothesis keys its saved failures by the test function, the same for every kernel: add the kernel's
    # own identity, so a failure saved for one kernel is replayed on that kernel, never deleted by another
    run.hypothesis.inner_test._hypothesis_internal_add_digest = _identity(kernel).encode()
    run = settings(**chosen)(run)
    run()


def _settings(max_examples):
    """The hypothesis settings of a check: ``max_examples`` where given, and no deadline unless the
    active profile sets one other than hypothesis' own default (a check's time is mostly its own:
    three poisoned runs, copies and the NumPy reference, long for a large kernel)."""
    from hypothesis import settings
    if max_examples is not None and (isinstance(max_examples, (bool, np.bool_))
                                     or not isinstance(max_examples, (int, np.integer))):
        raise TypeError(f"assert_matches_reference: max_examples={max_examples!r} ({type(max_examples).__name__}); "
                        "expected an int >= 1, e.g. max_examples=20, or None for the hypothesis profile's")
    if max_examples is not None and max_examples < 1:
        raise ValueError(f"assert_matches_reference: max_examples={max_examples!r}; expected an int >= 1, e.g. "
                         "max_examples=20 (to check the arrays of one call, pass them instead of a strategy)")
    chosen = {} if max_examples is None else {"max_examples": int(max_examples)}
    if settings.default.deadline == HYPOTHESIS_DEADLINE:
        chosen["deadline"] = None
    return chosen


def _identity(kernel):
    """A text that names ``kernel``'s computation the same way in every process (its descriptor, or
    a loop kernel's body), for hypothesis' example database."""
    if _kind(kernel) == "loop":
        body = getattr(kernel, "body", kernel.python)
        return f"loop {getattr(body, '__module__', '')}.{getattr(body, '__qualname__', '')} {kernel.array_names}"
    return f"{type(kernel).__qualname__} {kernel.desc!r} on {getattr(kernel, 'isa', '')}"     # (isa= kernels differ)


def _operands_strategy(kernel):
    """The strategy of the arrays ``kernel`` takes (when a check is given none), or the TypeError."""
    kind = _kind(kernel)
    if kind == "loop":
        raise TypeError("assert_matches_reference: pass a loop kernel its arrays, or a hypothesis strategy "
                        "of array tuples (tppasm.testing.strategies has the pieces)")
    if kind == "kernel" and not kernel.operands:
        raise TypeError(f"assert_matches_reference: {kernel!r} takes no arrays, so it has no results to compare "
                        "with a reference; check a kernel that computes on arrays")
    from .strategies import operands
    return operands(kernel)


def _is_strategy(x):
    return type(x).__module__.startswith("hypothesis.") and hasattr(x, "example")
