"""The native Python entry of a kernel: it checks its arguments itself, then calls the kernel.

Reading ``arr.ctypes.data`` costs about 1 µs per array from Python, and ctypes converts each
``py_object`` argument for about 0.2 µs. So the stub takes a single argument, the tuple of the
call's arguments (arrays, then small non-negative ints), and checks with a few compares each
that every array is exactly an ``ndarray`` with the expected dtype object, rank, dimensions,
strides and writability, and that every int is a one-digit ``int``; then it loads the data
pointers and int values into the raw kernel's argument registers and calls it. On a mismatch it
returns ``1 + argument index`` and the Python side explains the problem.

On CPython 3.11+ the same checks are the C function of a builtin that becomes the kernel's
``__call__`` (:func:`make_builtin`): the interpreter then enters the stub directly with the
argument vector (no ctypes, no Python frame; ~0.2 µs per call here against ~0.75 µs through
ctypes), and the stub hands any call it cannot vouch for to the Python path.

The stub holds this process's addresses (of ``numpy.ndarray``, the dtype objects, the raw kernel)
as 64-bit immediates, every one of them asked of an :class:`Addresses` object: the kernel cache
(:mod:`tppasm.cache.stubs`) builds a stub once with placeholders and patches them in each process;
the raw kernel stays position independent. The CPython and NumPy object layouts it relies on are
verified once at import (:data:`NATIVE_CHECKS`); if they do not hold, every call takes the Python
path.
"""
import ctypes
import sys

import numpy as np

from isa.x86 import Function, dword, eax, gpr, qword, r10, r11, rax, rsp
from isa.x86.function import INT_ARGS

from ..operand import in_place_ok

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


class Addresses:
    """The process addresses a stub embeds, one method per kind; :func:`build_entry` asks for each
    through these methods only, and every answer becomes a ``mov reg, imm64``.

    >>> Addresses((), (), 0).none() == id(None)
    True
    """

    def __init__(self, operands, scalars, raw_address, call=None):
        self.operands, self.scalars, self.raw_address, self.call = operands, scalars, raw_address, call

    def raw(self):
        return self.raw_address

    def ndarray(self):
        return id(np.ndarray)

    def dtype(self, i):
        return id(self.operands[i].np_dtype)          # builtin and ml_dtypes dtypes are singletons

    def int(self):
        return id(int)

    def keyword(self, j):
        return id(sys.intern(self.scalars[j]))        # call-site keyword names are interned strings

    def none(self):
        return id(None)

    def capi(self, name):
        return capi_address(name)

    def divert(self):
        return self.call.divert_flag

    def fallback(self):
        return id(self.call.fallback)


def build_entry(name, operands, scalars, raw_address, count_scalar=None, call=None, addresses=None, overlap=True,
                store=None):
    """Entry stub ``int entry(tuple args)``: args are the operand arrays, then the int scalars.

    Scalars must be ints in [1, 2**30). ``count_scalar`` names the scalar that bounds batched
    operands (their leading dimension must be at least that large). Returns None when some
    expected value does not fit an immediate (the kernel then always takes the Python path).

    With ``call`` (a :class:`Vectorcall`), the stub is instead the C function of a CPython builtin
    (``METH_FASTCALL | METH_KEYWORDS``) taking the arrays and, by keyword only, the scalars
    (default 1, except ``count_scalar``: left out, it is the number of blocks the batched operands
    hold, when they all hold the same number); it returns None, and hands every call it cannot
    vouch for to ``call.fallback``.

    ``addresses`` (default: this process's, from ``raw_address`` and ``call``) gives every address
    the stub embeds (:class:`Addresses`). ``overlap``: hand a call whose output overlaps another
    operand to the Python path (:func:`_overlap_checks`); a loop nest's entry, whose arrays may be
    updated in place, leaves it out.

    ``store`` (an address; with ``call=None``, no scalars and ``overlap=False``): once every array
    passed, their data pointers are written to consecutive 64-bit words from ``store`` instead of
    the argument registers, and the raw "kernel" is called without arguments: any number of arrays
    (a loop nest's entry: ``store`` is where its context block holds them).
    """
    addr = addresses or Addresses(operands, scalars, raw_address, call)
    n_args = len(operands) + len(scalars)
    if store is not None and (call is not None or scalars or overlap):
        raise ValueError(f"{name}: store= writes array pointers alone; it takes call=None, no scalars and "
                         "overlap=False")
    if n_args > len(INT_ARGS) and store is None:
        raise ValueError(f"{name}: a raw kernel takes at most {len(INT_ARGS)} arguments")
    limits = [d for s in operands for d in s.shape] + [st * s.np_dtype.itemsize for s in operands
                                                       for st in s.strides]
    if any(abs(v) >= 1 << 31 for v in limits):
        return None
    if overlap and (any(st < 0 for s in operands for st in s.strides)
                    or (count_scalar is None and any(s.batch for s in operands))):
        return None                             # (spans the overlap check does not compute)
    if call is None:
        fn = Function(name + ".entry", ["object"], returns="i32")
    else:
        fn = Function(name + ".call", ["ptr", "ptr", "i64", "ptr"], returns="ptr")
        fn.stack(SAVED_SIZE)
    a = fn.asm
    items, item, ptr = r11, rax, r10
    fails = []

    def fail_label(index):
        label = a.label()
        fails.append((label, index + 1))
        return label

    regs = INT_ARGS[:n_args]
    if call is None:
        a.mov(items, fn.args[0])
        a.cmp(qword[items + TUPLE_SIZE], n_args)
        a.jne(fail_label(n_args))
        a.add(items, TUPLE_ITEMS)
        _load_scalars(a, addr, items, operands, scalars, regs, fail_label)
    else:
        _vectorcall_head(a, addr, fn, operands, scalars, regs, fail_label, count_scalar)
    count = regs[len(operands) + scalars.index(count_scalar)] if count_scalar else None
    for i, spec in enumerate(operands):
        fail = fail_label(i)
        a.mov(item, [items + 8 * i])
        a.mov(ptr, addr.ndarray())
        a.cmp([item + OB_TYPE], ptr)
        a.jne(fail)
        a.mov(ptr, addr.dtype(i))
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
            if d is None:                       # the batch stride matters only past the first block
                one_block = a.label()
                a.cmp(count, 1)
                a.je(one_block)
                a.cmp(qword[ptr + 8 * axis], st * es)
                a.jne(fail)
                a.bind(one_block)
            elif d > 1:                         # numpy leaves strides of length-1 axes arbitrary
                a.cmp(qword[ptr + 8 * axis], st * es)
                a.jne(fail)
        if store is None:
            a.mov(regs[i], [item + DATA])
    if store is not None:                       # every array passed: their pointers to store, in order
        base = INT_ARGS[0]                      # (free: the tuple is in items)
        a.mov(base, store)
        for i in range(len(operands)):
            a.mov(item, [items + 8 * i])
            a.mov(ptr, [item + DATA])
            a.mov([base + 8 * i], ptr)
    if overlap:
        _overlap_checks(a, name, operands, regs, count, fail_label(n_args if call is None else -1))
    if call is None:
        a.mov(rax, addr.raw())
        a.call(rax)
        a.xor(eax, eax)
        fn.ret()
        for label, code in fails:
            a.bind(label)
            a.mov(eax, code)
            fn.ret()
    else:
        _vectorcall_tail(a, addr, fn, call, [label for label, _ in fails])
    return fn.finalize()


def _overlap_checks(a, kind, operands, regs, count, fail):
    """Go to ``fail`` (the Python path, which decides exactly: :func:`tppasm.operand.refuse_overlap`)
    when the bytes an output spans intersect those of another operand, unless the two are the same
    array where ``kind`` may run in place (:func:`tppasm.operand.in_place_ok`: then equal data
    pointers mean the same view, both having passed their checks). ``regs[i]`` holds operand i's
    data pointer, ``count`` the batch count; rax, r10 and r11 are free."""
    for w, sw in enumerate(operands):
        if not sw.writable:
            continue
        for j, sj in enumerate(operands):
            if j == w or (sj.writable and j < w):
                continue
            done = a.label()
            if in_place_ok(kind, sw, sj):
                a.cmp(regs[w], regs[j])
                a.je(done)
            _span_end(a, rax, sw, regs[w], count)
            a.cmp(regs[j], rax)                  # j starts at or past w's end: apart
            a.jae(done)
            _span_end(a, r10, sj, regs[j], count)
            a.cmp(regs[w], r10)                  # w starts before j's end (and j before w's): overlap
            a.jb(fail)
            a.bind(done)


def _span_end(a, dst, spec, data, count):
    """``dst`` = one past the last byte ``spec``'s operand at ``data`` spans (strides are non-negative)."""
    es = spec.np_dtype.itemsize
    dims = ([None] if spec.batch else []) + list(spec.shape)
    a.mov(dst, data)
    span = es                                   # the constant part, added once where it fits an imm32
    for d, st in zip(dims, spec.strides):
        if d is None:
            a.mov(r11, count)
            a.sub(r11, 1)
            a.imul(r11, r11, st * es)            # (st * es < 2**31: build_entry checked)
            a.add(dst, r11)
        elif d > 1 and (d - 1) * st * es < 1 << 30:
            span += (d - 1) * st * es
        elif d > 1:
            a.mov(r11, d - 1)
            a.imul(r11, r11, st * es)
            a.add(dst, r11)
    if span < 1 << 31:
        a.add(dst, span)
    else:
        a.mov(r11, span >> 30)
        a.shl(r11, 30)
        a.add(r11, span & ((1 << 30) - 1))
        a.add(dst, r11)


def _load_scalars(a, addr, items, operands, scalars, regs, fail_label):
    """Scalar i from ``items[len(operands) + i]``: a one-digit positive ``int``."""
    item, ptr = rax, r10
    for j in range(len(scalars)):               # scalars first: the count bounds the arrays
        i = len(operands) + j
        fail = fail_label(i)
        a.mov(item, [items + 8 * i])
        a.mov(ptr, addr.int())
        a.cmp([item + OB_TYPE], ptr)
        a.jne(fail)
        a.cmp(qword[item + LONG_TAG], LONG_ONE_DIGIT)
        a.jne(fail)
        a.mov(gpr(regs[i].num, 32), dword[item + LONG_DIGIT0])


# -- the builtin (vectorcall) form ------------------------------------------------------------

# the stub's stack: the incoming (args, nargs, kwnames) for the fallback, and the thread state
SAVED_ARGS, SAVED_NARGS, SAVED_KWNAMES, SAVED_TSTATE, SAVED_SIZE = 0, 8, 16, 24, 32
METH_FASTCALL_KEYWORDS = 0x0080 | 0x0002


class Vectorcall:
    """What a builtin entry needs besides the kernel: ``fallback`` (a Python callable taking the
    same arguments), the address of an int32 that is nonzero while calls must take the fallback
    (loop tracing), and whether the call releases the interpreter lock.

    >>> Vectorcall.available() in (True, False)
    True
    """

    def __init__(self, fallback, divert_flag, release_gil):
        self.fallback, self.divert_flag, self.release_gil = fallback, divert_flag, release_gil

    @staticmethod
    def available():
        """The CPython functions the stub calls are exported (3.11 and later: ``PyObject_Vectorcall``)."""
        return NATIVE_CHECKS and all(hasattr(ctypes.pythonapi, f) for f in CAPI)


CAPI = ("PyObject_Vectorcall", "Py_IncRef", "PyEval_SaveThread", "PyEval_RestoreThread",
         "PyCFunction_NewEx")


def capi_address(name):
    """The address of the CPython C API function ``name`` (one of :data:`CAPI`), for generated calls."""
    return ctypes.cast(getattr(ctypes.pythonapi, name), ctypes.c_void_p).value


def _vectorcall_head(a, addr, fn, operands, scalars, regs, fail_label, count_scalar=None):
    """Save (args, nargs, kwnames); divert while the flag is set; accept exactly the arrays
    positionally plus either no keywords (scalars = 1, ``count_scalar`` inferred) or the
    scalars' names as keywords."""
    args, nargs, kwnames = fn.args[1:]
    items, ptr = r11, r10
    a.mov([rsp + SAVED_ARGS], args)
    a.mov([rsp + SAVED_NARGS], nargs)
    a.mov([rsp + SAVED_KWNAMES], kwnames)
    a.mov(items, args)
    a.mov(ptr, addr.divert())
    a.cmp(dword[ptr], 0)
    a.jne(fail_label(-1))
    a.cmp(nargs, len(operands))
    a.jne(fail_label(-1))
    keywords, loaded = a.label(), a.label()
    a.test(kwnames, kwnames)
    a.jnz(keywords)
    for j, name in enumerate(scalars):
        if name == count_scalar:
            _infer_count(a, addr, items, operands, regs[len(operands) + j], fail_label(-1))
        else:
            a.mov(gpr(regs[len(operands) + j].num, 32), 1)
    a.jmp(loaded)
    a.bind(keywords)
    if not scalars:
        a.jmp(fail_label(-1))
    else:
        a.cmp(qword[kwnames + TUPLE_SIZE], len(scalars))
        a.jne(fail_label(-1))
        for j in range(len(scalars)):
            a.mov(ptr, addr.keyword(j))
            a.cmp([kwnames + TUPLE_ITEMS + 8 * j], ptr)
            a.jne(fail_label(-1))
        _load_scalars(a, addr, items, operands, scalars, regs, fail_label)
    a.bind(loaded)


def _infer_count(a, addr, items, operands, count, fail):
    """``count`` left out: the number of blocks the batched operands hold, when they all hold the
    same number in [1, 2**30); anything else goes to ``fail`` (the fallback infers or explains)."""
    item, ptr = rax, r10
    first = True
    for i, spec in enumerate(operands):
        if not spec.batch:
            continue
        a.mov(item, [items + 8 * i])
        a.mov(ptr, addr.ndarray())
        a.cmp([item + OB_TYPE], ptr)
        a.jne(fail)
        a.cmp(dword[item + NDIM], len(spec.shape) + 1)
        a.jne(fail)
        a.mov(ptr, [item + DIMS])
        a.mov(ptr, [ptr])
        if first:
            a.mov(count, ptr)
            a.cmp(count, 1)
            a.jl(fail)
            a.cmp(count, LONG_MAX)
            a.jg(fail)
            first = False
        else:
            a.cmp(ptr, count)
            a.jne(fail)


def _vectorcall_tail(a, addr, fn, call, fails):
    """Call the kernel (releasing the interpreter lock if asked), return a new reference to None;
    every failure calls the fallback with the saved arguments and returns its result."""
    if call.release_gil:
        for r in INT_ARGS:                           # the kernel's arguments survive the C call
            a.push(r)
        a.mov(rax, addr.capi("PyEval_SaveThread"))
        a.call(rax)
        a.mov([rsp + 6 * 8 + SAVED_TSTATE], rax)
        for r in reversed(INT_ARGS):
            a.pop(r)
    a.mov(rax, addr.raw())
    a.call(rax)
    if call.release_gil:
        a.mov(INT_ARGS[0], [rsp + SAVED_TSTATE])
        a.mov(rax, addr.capi("PyEval_RestoreThread"))
        a.call(rax)
    a.mov(INT_ARGS[0], addr.none())
    a.mov(rax, addr.capi("Py_IncRef"))
    a.call(rax)
    a.mov(rax, addr.none())
    fn.ret()
    for label in fails:
        a.bind(label)
    a.mov(INT_ARGS[0], addr.fallback())
    a.mov(INT_ARGS[1], [rsp + SAVED_ARGS])
    a.mov(INT_ARGS[2], [rsp + SAVED_NARGS])
    a.mov(INT_ARGS[3], [rsp + SAVED_KWNAMES])
    a.mov(rax, addr.capi("PyObject_Vectorcall"))
    a.call(rax)
    fn.ret()


class MethodDef(ctypes.Structure):
    """CPython's ``PyMethodDef``."""
    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p), ("ml_flags", ctypes.c_int),
                ("ml_doc", ctypes.c_char_p)]


_new_builtin = None


def make_builtin(name, stub, owner, doc=None):
    """A CPython builtin function whose C implementation is ``stub`` (from :func:`build_entry`
    with ``call``) and that keeps ``owner`` alive (make it the object that owns the stub's memory).

    Its ``__self__`` (which the stub ignores) is the tuple ``(owner, method_def)``: the builtin's
    dealloc reads its ``PyMethodDef`` before it drops ``__self__``, and the garbage collector clears
    no tuple, so the def outlives the builtin however a reference cycle through ``owner`` is broken
    (held anywhere else, a collected cycle could free it first: a read after free).

    >>> from isa.x86 import Function
    >>> code = Function("ret", []).finalize()        # (never called here)
    >>> b = make_builtin("f", code, owner=code)
    >>> b.__self__[0] is code, type(b.__self__[1]).__name__
    (True, 'MethodDef')
    """
    global _new_builtin
    if _new_builtin is None:
        _new_builtin = ctypes.pythonapi.PyCFunction_NewEx
        _new_builtin.restype = ctypes.py_object
        _new_builtin.argtypes = (ctypes.c_void_p, ctypes.py_object, ctypes.py_object)
    ml = MethodDef(name.encode(), stub.address, METH_FASTCALL_KEYWORDS, doc.encode() if doc else None)
    return _new_builtin(ctypes.addressof(ml), (owner, ml), None)
