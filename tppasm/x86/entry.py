"""The native Python entry of a kernel: it checks its arguments itself, then calls the kernel.

Reading ``arr.ctypes.data`` costs about 1 µs per array from Python, and ctypes converts each
``py_object`` argument for about 0.2 µs. So the stub takes a single argument, the tuple of the
call's arguments (arrays, then small non-negative ints), and checks with a few compares each
that every array is exactly an ``ndarray`` with the expected dtype object, rank, dimensions,
strides and writability, and that every int is a one-digit ``int``; then it loads the data
pointers and int values into the raw kernel's argument registers and calls it. On a mismatch it
returns ``1 + argument index`` and the Python side explains the problem.

The stub holds this process's addresses (of ``numpy.ndarray``, the dtype objects, the raw kernel)
as immediates: it is rebuilt in every process and never cached; the raw kernel stays position
independent. The CPython and NumPy object layouts it relies on are verified once at import
(:data:`NATIVE_CHECKS`); if they do not hold, every call takes the Python path.
"""
import ctypes
import sys

import numpy as np

from isa.x86 import Function, dword, eax, gpr, qword, r10, r11, rax
from isa.x86.function import INT_ARGS

# PyArrayObject_fields offsets (numpy 1.x and 2.x, 64-bit)
OB_TYPE, DATA, NDIM, DIMS, STRIDES, DESCR, FLAGS = 8, 16, 24, 32, 40, 56, 64
WRITEABLE = 0x0400
TUPLE_SIZE, TUPLE_ITEMS = 16, 24
# CPython int: 3.12+ keeps (ndigits << 3 | sign) in lv_tag, earlier versions the digit count
LONG_TAG, LONG_DIGIT0 = 16, 24
LONG_ONE_DIGIT = 8 if sys.version_info >= (3, 12) else 1
LONG_MAX = (1 << 30) - 1


def _layout_holds():
    a = np.zeros((3, 5), np.float32)[:, 1:]
    q = ctypes.c_int64.from_address
    try:
        dims = ctypes.cast(q(id(a) + DIMS).value, ctypes.POINTER(ctypes.c_int64))
        strides = ctypes.cast(q(id(a) + STRIDES).value, ctypes.POINTER(ctypes.c_int64))
        t = (a, 12345)
        n = t[1]
        return (q(id(a) + OB_TYPE).value == id(np.ndarray) and q(id(a) + DATA).value == a.ctypes.data
                and ctypes.c_int32.from_address(id(a) + NDIM).value == 2 and (dims[0], dims[1]) == a.shape
                and (strides[0], strides[1]) == a.strides and q(id(a) + DESCR).value == id(a.dtype)
                and bool(ctypes.c_int32.from_address(id(a) + FLAGS).value & WRITEABLE)
                and q(id(t) + TUPLE_SIZE).value == 2 and q(id(t) + TUPLE_ITEMS + 8).value == id(n)
                and q(id(n) + LONG_TAG).value == LONG_ONE_DIGIT
                and ctypes.c_uint32.from_address(id(n) + LONG_DIGIT0).value == 12345)
    except Exception:
        return False


NATIVE_CHECKS = _layout_holds()


def build_entry(name, operands, scalars, raw_address, count_scalar=None):
    """Entry stub ``int entry(tuple args)``: args are the operand arrays, then the int scalars.

    Scalars must be ints in [1, 2**30). ``count_scalar`` names the scalar that bounds batched
    operands (their leading dimension must be at least that large). Returns None when some
    expected value does not fit an immediate (the kernel then always takes the Python path).
    """
    n_args = len(operands) + len(scalars)
    if n_args > len(INT_ARGS):
        raise ValueError(f"{name}: a raw kernel takes at most {len(INT_ARGS)} arguments")
    limits = [d for s in operands for d in s.shape] + [st * s.np_dtype.itemsize for s in operands
                                                       for st in s.strides]
    if any(abs(v) >= 1 << 31 for v in limits):
        return None
    fn = Function(name + ".entry", ["object"], returns="i32")
    a = fn.asm
    tup, item, ptr = r11, rax, r10
    a.mov(tup, fn.args[0])
    fails = []

    def fail_label(index):
        label = a.label()
        fails.append((label, index + 1))
        return label

    a.cmp(qword[tup + TUPLE_SIZE], n_args)
    a.jne(fail_label(n_args))
    regs = INT_ARGS[:n_args]
    for j in range(len(scalars)):               # scalars first: the count bounds the arrays
        i = len(operands) + j
        fail = fail_label(i)
        a.mov(item, [tup + TUPLE_ITEMS + 8 * i])
        a.mov(ptr, id(int))
        a.cmp([item + OB_TYPE], ptr)
        a.jne(fail)
        a.cmp(qword[item + LONG_TAG], LONG_ONE_DIGIT)
        a.jne(fail)
        a.mov(gpr(regs[i].num, 32), dword[item + LONG_DIGIT0])
    count = regs[len(operands) + scalars.index(count_scalar)] if count_scalar else None
    for i, spec in enumerate(operands):
        fail = fail_label(i)
        a.mov(item, [tup + TUPLE_ITEMS + 8 * i])
        a.mov(ptr, id(np.ndarray))
        a.cmp([item + OB_TYPE], ptr)
        a.jne(fail)
        a.mov(ptr, id(spec.np_dtype))           # builtin and ml_dtypes dtypes are singletons
        a.cmp([item + DESCR], ptr)
        a.jne(fail)
        a.cmp(dword[item + NDIM], len(spec.shape) + spec.batch)
        a.jne(fail)
        if spec.writable:
            a.test(dword[item + FLAGS], WRITEABLE)
            a.jz(fail)
        dims = ([None] if spec.batch else []) + list(spec.shape)
        a.mov(ptr, [item + DIMS])
        for axis, d in enumerate(dims):
            if d is None:
                a.cmp([ptr + 8 * axis], count)
                a.jl(fail)
            else:
                a.cmp(qword[ptr + 8 * axis], d)
                a.jne(fail)
        a.mov(ptr, [item + STRIDES])
        es = spec.np_dtype.itemsize
        for axis, (d, st) in enumerate(zip(dims, spec.strides)):
            if d is None or d > 1:              # numpy leaves strides of length-1 axes arbitrary
                a.cmp(qword[ptr + 8 * axis], st * es)
                a.jne(fail)
        a.mov(regs[i], [item + DATA])
    a.mov(rax, raw_address)
    a.call(rax)
    a.xor(eax, eax)
    fn.ret()
    for label, code in fails:
        a.bind(label)
        a.mov(eax, code)
        fn.ret()
    return fn.finalize()
