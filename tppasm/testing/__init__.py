"""Property-based testing of kernels: check a kernel or loop kernel against its NumPy reference.

:func:`assert_matches_reference` runs the native code on copies of the arrays whose outputs are
poisoned, and the NumPy reference (a kernel's ``reference``, a loop kernel's ``python``) on other
copies, then checks that

- every output element was written (a write-only output holds poison nowhere afterwards: it is
  filled with a signalling NaN (or a byte pattern) for one run and a finite value for a second);
- nothing outside an operand changed (each copy sits in a buffer whose padding between rows and
  64-byte guards around are poison, compared bit for bit afterwards), and no input changed;
- every written array matches the reference: exactly for integers, within dtype-aware
  tolerances for floats (``rtol`` 1e-5 for fp32, 2**-7 (two bf16 ulps) for bf16, and ``atol =
  rtol * max|reference|`` for sums that cancel, at least 2**-137 (4096 subnormal ulps: results
  that are all subnormal, where the rounding of each of up to 8192 terms adds up to half an ulp);
  kernels computing in bf16 add an absolute floor of
  2**20 smallest normals, as bf16 dot products flush denormal inputs and products to zero), NaN
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
import numpy as np

from ..dtypes import numpy_dtype
from ..kernel import ISAUnavailableError, scalar_arg
from ..layout import empty, empty_for
from ..operand import as_ndarray, check as check_operand, origin_of

GUARD = 64                                # bytes of poison before and after each copy
# (first run, second run) poison bit patterns per item size for floats: a signalling NaN that no
# arithmetic produces, then a large finite value; for integers two byte patterns
FLOAT_POISON = {2: (0x7FA5, 0xFF7A), 4: (0x7FA5A5A5, 0xFF7A5A5A), 8: (0x7FF4A5A5A5A5A5A5, 0xFFEA5A5A5A5A5A5A)}
INT_POISON = (0xA5, 0x5A)
RTOL = {"f32": 1e-5, "bf16": 2.0 ** -7}
# bf16 dot products (vdpbf16ps, tdpbf16ps, SVE bfdot) flush denormal inputs and products to zero:
# results that small may differ from the exact reference by up to (terms x the smallest normal)
FTZ_ATOL = float(np.finfo(np.float32).tiny) * 2.0 ** 20
SUBNORMAL_ATOL = 2.0 ** -137


def __getattr__(name):
    """The strategies, imported (with hypothesis) on first use: ``tppasm.testing.operands``..."""
    import importlib
    strategies = importlib.import_module(__name__ + ".strategies")
    if name == "strategies":
        return strategies
    if name in strategies.__all__:
        return getattr(strategies, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def poison_bits(dtype, run):
    """The poison bit pattern (an unsigned int of the item size) of run 0 or 1 for ``dtype``.

    >>> hex(poison_bits(np.float32, 0)), hex(poison_bits(np.int8, 1))
    ('0x7fa5a5a5', '0x5a')
    """
    dt = numpy_dtype(dtype)                      # "i8" is tppasm's int8 (NumPy's int64)
    if run not in (0, 1):
        raise ValueError(f"poison_bits: run={run!r}; expected 0 (the first run) or 1 (the second)")
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
    whether any of them changed."""

    def __init__(self, array, poison, fill_view=False):
        a = np.asarray(array)
        if any(s < 0 for s in a.strides):
            raise ValueError("assert_matches_reference: arrays with negative strides are not kernel operands; "
                             "pass np.ascontiguousarray(...)")
        item = a.itemsize
        span = (sum((d - 1) * s for d, s in zip(a.shape, a.strides)) + item) if a.size else 0
        lead = GUARD + (a.ctypes.data % 64) // item * item
        total = -(-(lead + span + GUARD) // item)
        self.buffer = empty((total,), a.dtype)
        _bits(self.buffer)[...] = poison
        self.poison = poison
        self.view = np.lib.stride_tricks.as_strided(self.buffer[lead // item:], a.shape, a.strides)
        self.cover = np.zeros(total, bool)
        np.lib.stride_tricks.as_strided(self.cover[lead // item:], a.shape,
                                        [s // item for s in a.strides])[...] = True
        if not fill_view:
            self.view[...] = a

    def outside_changed(self):
        """Indices (into the buffer) of poison elements outside the view that changed."""
        return np.flatnonzero(~self.cover & (_bits(self.buffer) != self.poison))

    def unwritten(self):
        """A boolean mask over the view: elements that still hold the poison."""
        return _bits(np.ascontiguousarray(self.view)) == self.poison


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
        only = [] if kernel.desc.beta else [2]
    else:
        names = [s.name for s in kernel.operands]
        alloc = set(kernel.desc.allocated())
        written = [i for i, s in enumerate(kernel.operands) if s.writable]
        only = [i for i, s in enumerate(kernel.operands) if s.name in alloc]
    if outputs is not None:
        picked = [_position(o, names) for o in ([outputs] if isinstance(outputs, (str, int, np.integer)) else outputs)]
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
    if count is None:
        if kind == "batched":
            from ..brgemm import _batch_count
            count = _batch_count(kernel.desc, arrays[0], arrays[1], arrays[3:])
        else:
            count = kernel._count_of(arrays)
    return kernel.reference(*arrays, count=count)


def _compare(name, got, want, rtol, atol, floor=None, skip=None):
    """Problems (strings) where ``got`` differs from ``want``; ``floor``: the least ``atol``;
    ``skip``: a mask of elements whose values are unspecified."""
    floats = "bf16" if got.dtype.name == "bfloat16" else "f32" if got.dtype.kind == "f" else None
    if floats:
        g, w = got.astype(np.float64), np.asarray(want).astype(np.float64)
        r = RTOL[floats] if rtol is None else rtol
        finite = np.abs(w[np.isfinite(w)])
        a = r * (float(finite.max()) if finite.size else 0.0) if atol is None else atol
        a = max(a, floor or 0.0)
        with np.errstate(invalid="ignore"):
            ok = np.isclose(g, w, rtol=r, atol=a, equal_nan=True) | (g == w)
        tol = f" (rtol={r:g}, atol={a:g})"
    else:
        g, w = got, np.asarray(want)
        ok = g == w
        tol = " (integers: exact)"
    if skip is not None:
        ok = ok | skip
    bad = np.argwhere(~ok)
    if not len(bad):
        return []
    shown = "; ".join(f"[{', '.join(map(str, idx))}] got {g[tuple(idx)].item()!r} want {w[tuple(idx)].item()!r}"
                      for idx in bad[:5])
    return [f"{name}: {len(bad)} of {ok.size} elements differ from the reference{tol}: {shown}"]


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
        values = a.astype(np.float32).tolist() if a.dtype.name == "bfloat16" else a.tolist()
        lines.append(f"{n} = np.empty({a.shape}, {dt})" if i in only else f"{n} = np.array({values!r}, {dt})")
    return "case:\n  " + "\n  ".join(lines) + (f"\n  count = {count}" if count is not None else "")


def check(kernel, arrays, count=None, outputs=None, rtol=None, atol=None):
    """The checks of :func:`assert_matches_reference` on one set of arrays; a list of problems."""
    kind = _kind(kernel)
    for name, tol in (("rtol", rtol), ("atol", atol)):
        if tol is not None and (isinstance(tol, bool) or not isinstance(tol, (int, float, np.integer, np.floating))
                                or not tol >= 0):
            raise ValueError(f"assert_matches_reference: {name}={tol!r}; expected a number >= 0, or None for the "
                             "dtype's default (see tppasm.testing)")
    if kind != "loop" and not getattr(kernel, "runnable", True):
        raise ISAUnavailableError(f"assert_matches_reference: {kernel!r} cannot run on this host; check it where "
                                  "it runs (or in the interpreter, isa.x86.interp)")
    arrays = _operands_of(kernel, kind, arrays, count)
    names, written, only = _roles(kernel, kind, arrays, outputs)
    runs = []
    for run in (0, 1):
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
    _reference(kernel, kind, ref, count)
    skip = {} if kind == "loop" else kernel.desc.unspecified(*ref)
    problems = []
    for i, (first, second) in enumerate(zip(*runs)):
        if not isinstance(first, Guarded):
            continue
        for copy in (first, second):
            outside = copy.outside_changed()
            if len(outside):
                problems.append(f"{names[i]}: {len(outside)} elements outside the operand were written "
                                "(row padding or guard bytes)")
                break
        if i in only:
            missed = np.argwhere(first.unwritten() & second.unwritten())
            if len(missed):
                problems.append(f"{names[i]}: {len(missed)} of {first.view.size} output elements were never "
                                f"written, first at {tuple(int(v) for v in missed[0])}")
                continue
        if i in written:
            bf16 = getattr(getattr(kernel, "desc", None), "dtype", None) == "bf16"
            floor = None if atol is not None else FTZ_ATOL if bf16 else SUBNORMAL_ATOL
            problems += _compare(names[i], first.view, ref[i], rtol, atol, floor, skip.get(names[i]))
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
    outputs the kernel only writes; for a loop kernel, the arrays its calls only write).
    ``rtol``/``atol``: float tolerances (defaults in the module docstring). ``max_examples``:
    hypothesis examples (default: the active hypothesis profile's), with a strategy only.
    """
    strategy = arrays[0] if len(arrays) == 1 and _is_strategy(arrays[0]) else None
    if not arrays:
        strategy = _operands_strategy(kernel)
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

    @given(strategy)
    def run(case):
        assert_matches_reference(kernel, *case, count=count, outputs=outputs, rtol=rtol, atol=atol)
    if max_examples is not None:
        run = settings(max_examples=max_examples)(run)
    run()


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
