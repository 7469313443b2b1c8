"""Functions that follow the System V AMD64 ABI, built around an :class:`Assembler` body.

The builder hands out the argument registers, saves the callee-saved registers the body uses,
keeps the stack 16-byte aligned, issues ``vzeroupper`` on exit after AVX code, and returns a
:class:`JitFunction` callable from Python through ctypes (the interpreter lock is released for
the call).

>>> from isa.x86.registers import rax
>>> fn = Function("add", ["i64", "i64"], returns="i64")
>>> x, y = fn.args
>>> fn.asm.lea(rax, [x + y])
>>> fn.finalize()(2, 40)
42
"""
import ctypes
import numbers
import operator
import sys

from .assembler import Assembler
from .disasm import disassemble
from .registers import REGISTERS, gpr, qword, r10, r11, rax, rsp
from ..memory import ExecutableMemory

CTYPES = {
    "i64": ctypes.c_int64, "u64": ctypes.c_uint64, "i32": ctypes.c_int32, "u32": ctypes.c_uint32,
    "ptr": ctypes.c_void_p, "f32": ctypes.c_float, "f64": ctypes.c_double, "object": ctypes.py_object,
    None: None,
}
_INT_RANGES = {"i64": (-(1 << 63), 1 << 63), "u64": (0, 1 << 64), "i32": (-(1 << 31), 1 << 31), "u32": (0, 1 << 32),
               "ptr": (0, 1 << 64)}
INT_ARGS = [REGISTERS[n] for n in ("rdi", "rsi", "rdx", "rcx", "r8", "r9")]
STACK_ARGS = [r10, r11]          # arguments 7 and 8 are loaded here by the prologue
CALLEE_SAVED = [REGISTERS[n] for n in ("rbx", "rbp", "r12", "r13", "r14", "r15")]


class JitFunction:
    """Machine code in executable memory plus a ctypes entry point; keeps the memory alive.

    >>> from isa.x86.function import JitFunction
    >>> f = JitFunction("answer", bytes([0xB8, 42, 0, 0, 0, 0xC3]), [], "i32")     # mov eax, 42; ret
    >>> f(), len(f.code), f.signature
    (42, 6, ('i32', ()))
    """

    def __init__(self, name, code, argtypes, restype):
        self.name, self.code = name, code
        self.memory = ExecutableMemory(code)
        self.address = self.memory.address
        self.signature = (restype, tuple(argtypes))
        self._cfunc = None

    @property
    def cfunc(self):
        """The ctypes function over the code (made on first use: entry stubs never need one)."""
        if self._cfunc is None:
            restype, argtypes = self.signature
            self._cfunc = ctypes.CFUNCTYPE(CTYPES[restype], *(CTYPES[t] for t in argtypes))(self.address)
            self._cfunc.code_owner = self         # the callable keeps the executable memory mapped
        return self._cfunc

    def __call__(self, *args):
        argtypes = self.signature[1]
        if len(args) != len(argtypes):           # (a ctypes prototype passes extra arguments on, unread)
            raise TypeError(f"{self.name}() takes {len(argtypes)} arguments ({', '.join(argtypes) or 'none'}), "
                            f"got {len(args)}")
        return self.cfunc(*[_argument(self.name, i, value, kind)
                            for i, (value, kind) in enumerate(zip(args, argtypes))])

    def __copy__(self):
        return self         # one function over one mapping (its memory refuses pickling: bound to this process)

    def __deepcopy__(self, memo):
        return self

    def disassemble(self) -> str:
        """The function's machine code as Intel-syntax text."""
        return disassemble(self.code)

    def __repr__(self):
        return f"<JitFunction {self.name} at {self.address:#x}, {len(self.code)} bytes>"


def _argument(name, i, value, kind):
    """``value`` as argument ``i`` (of type ``kind``) of ``name``: an int in the range of an integer or
    pointer kind (a pointer is never a bool or None: ctypes would pass None as the address 0, True as
    1), a real number for f32/f64; else the TypeError or ValueError naming what to pass.

    >>> _argument("f", 0, None, "ptr")                  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: f(): argument 0 (ptr) is None, not an address; pass an int address such as x.ctypes.data ...
    """
    if kind in _INT_RANGES:
        if type(value) is not int:
            value = _as_int(name, i, value, kind)
        lo, hi = _INT_RANGES[kind]
        if not lo <= value < hi:
            raise ValueError(f"{name}(): argument {i} = {value} does not fit {kind} ({lo} <= value < {hi}); "
                             "ctypes would wrap it")
        return value
    if kind in ("f32", "f64") and type(value) is not float:
        if _is_bool(value) or not isinstance(value, numbers.Real):
            fix = f"e.g. float({value!r})" if isinstance(value, str) else "e.g. 2.0"
            raise TypeError(f"{name}(): argument {i} ({kind}) is {_described(value)}, not a real number; pass a "
                            f"float, {fix}")
        return float(value)
    return value


def _as_int(name, i, value, kind):
    """``value`` (not a Python int) as the int argument ``i`` of ``kind``, or the TypeError."""
    what = "an address" if kind == "ptr" else "an integer"
    if kind == "ptr" and isinstance(value, _CTYPES_POINTERS):
        return ctypes.cast(value, ctypes.c_void_p).value or 0
    if _is_bool(value) and kind != "ptr":
        return int(value)                   # (a flag: 0 or 1)
    if _is_bool(value) or value is None:
        fix = "an int address such as x.ctypes.data (0 for a null pointer)" if kind == "ptr" else "an int, e.g. 0"
        raise TypeError(f"{name}(): argument {i} ({kind}) is {_described(value)}, not {what}; pass {fix}")
    np = sys.modules.get("numpy")       # (an array is checked first: a 0-d one converts to its value)
    if np is not None and isinstance(value, np.ndarray):
        fix = "the int x.ctypes.data (its address; keep x alive during the call)" if kind == "ptr" else "int(x)"
        raise TypeError(f"{name}(): argument {i} ({kind}) is a NumPy array, not {what}; pass {fix}")
    try:
        return operator.index(value)
    except TypeError:
        pass
    if hasattr(value, "data_ptr"):
        fix = "the int t.data_ptr() (its address; keep t alive during the call)"
    elif kind == "ptr":
        fix = "an int address, such as x.ctypes.data of a NumPy array x"
    else:
        fix = f"an int, e.g. int({value!r})" if isinstance(value, (str, float)) else "an int"
    raise TypeError(f"{name}(): argument {i} ({kind}) is {_described(value)}, not {what}; pass {fix}")


_CTYPES_POINTERS = (ctypes.c_void_p, ctypes.c_char_p, ctypes._Pointer, ctypes.Array)


def _is_bool(value):
    return isinstance(value, bool) or type(value).__name__ in ("bool_", "bool") and hasattr(value, "dtype")


def _described(value):
    if value is None or isinstance(value, (bool, str, bytes, int, float)):
        return repr(value)
    return f"a {type(value).__module__}.{type(value).__qualname__}".replace("a builtins.", "a ")


PAGE = 4096
PROBE_UNROLL = 16      # pages probed by straight code; a larger frame probes in a loop (counting in rax)


def _reserve(pro, frame):
    """``sub rsp, frame``; a frame past a page is reserved a page at a time, each page touched (a
    stack probe, as gcc's -fstack-clash-protection), so that a thread short of stack faults on its
    guard page (4 KiB under glibc's thread stacks) instead of writing into whatever lies below it.
    rax is free at entry (it carries no argument in the System V ABI but a varargs count)."""
    pages, rest = divmod(frame, PAGE) if frame > PAGE else (0, frame)
    if pages > PROBE_UNROLL:
        pro.mov(rax, pages)
        top = pro.label()
        pro.bind(top)
    for _ in range(1 if pages > PROBE_UNROLL else pages):
        pro.sub(rsp, PAGE)
        pro.or_(qword[rsp], 0)
    if pages > PROBE_UNROLL:
        pro.dec(rax)
        pro.jnz(top)
    if rest:
        pro.sub(rsp, rest)


class Function:
    """Build one System V function: emit the body with ``fn.asm``, then :meth:`finalize`.

    ``args`` are type names: i64, u64, i32, u32, ptr, object (a PyObject*), f32, f64.
    ``fn.args`` gives the register holding each argument at entry (xmm registers for floats).
    ``fn.stack(nbytes)`` reserves an aligned scratch area at ``[rsp]`` inside the body.

    >>> from isa.x86 import Function, rax
    >>> fn = Function("twice", ["i64"], returns="i64")
    >>> (x,) = fn.args; fn.asm.lea(rax, [x + x])          # x: rdi, the first integer argument
    >>> f = fn.finalize(); print(f.disassemble())
    0000  488d043f              lea rax,[rdi+rdi]
    0004  c3                    ret
    >>> f(21)
    42
    """

    def __init__(self, name, args=(), returns=None):
        for t in list(args) + [returns]:
            if t not in CTYPES:
                raise TypeError(f"argument type {t!r} is not one of {sorted(k for k in CTYPES if k)}")
        self.name, self.argtypes, self.returns = name, list(args), returns
        self.asm = Assembler()
        self._epilogue = self.asm.label("epilogue")
        self._stack = 0
        ints = [t for t in args if t not in ("f32", "f64")]
        if len(ints) > len(INT_ARGS) + len(STACK_ARGS):
            raise TypeError(f"{name}: at most {len(INT_ARGS) + len(STACK_ARGS)} integer arguments are "
                            "supported; pass a pointer to an argument table instead")
        if len(args) - len(ints) > 8:
            raise TypeError(f"{name}: at most 8 floating-point arguments are supported")
        regs, n_int, n_float = [], 0, 0
        for t in args:
            if t in ("f32", "f64"):
                regs.append(REGISTERS[f"xmm{n_float}"])
                n_float += 1
            else:
                regs.append((INT_ARGS + STACK_ARGS)[n_int])
                n_int += 1
        self.args = regs

    def stack(self, nbytes):
        """Reserve ``nbytes`` of scratch at [rsp] (16-byte aligned) for the body."""
        if type(nbytes) is not int or not 0 <= nbytes < 1 << 31:
            raise ValueError(f"Function.stack({nbytes!r}): expected an int from 0 to 2**31 - 1 bytes (the frame is "
                             "reserved by a sub rsp with a 32-bit immediate); keep large buffers in arrays")
        self._stack = max(self._stack, (nbytes + 15) // 16 * 16)
        return rsp

    def ret(self):
        """Return from anywhere in the body (the result is what the body left in rax/xmm0)."""
        self.asm.jmp(self._epilogue)

    def finalize(self) -> JitFunction:
        """Add prologue and epilogue, encode, load into executable memory (once: the body has them then)."""
        if self._epilogue.bound_at is not None:
            raise ValueError(f"{self.name}: finalize() was called already, and the body holds its prologue and "
                             "epilogue now; keep the JitFunction it returned, or build a new Function")
        body = self.asm
        used64 = {gpr(r.num) for r in body.used if r.kind in ("r64", "r32", "r16", "r8")}
        saved = [r for r in CALLEE_SAVED if r in used64]
        uses_avx = any(r.kind in ("ymm", "zmm") or (r.kind == "xmm" and r.num >= 16) for r in body.used)
        n_stack_args = max(0, sum(t not in ("f32", "f64") for t in self.argtypes) - len(INT_ARGS))
        pro = Assembler()
        for i in range(n_stack_args):                      # before any push: [rsp] is the return address
            pro.mov(STACK_ARGS[i], [rsp + 8 * (i + 1)])
        for r in saved:
            pro.push(r)
        frame = self._stack + (8 if len(saved) % 2 == 0 else 0) if self._stack else 0  # rsp = 16k+8 at entry
        _reserve(pro, frame)
        body.prepend(pro)
        body.bind(self._epilogue)
        if frame:
            body.add(rsp, frame)
        for r in reversed(saved):
            body.pop(r)
        if uses_avx:
            body.vzeroupper()
        body.ret()
        return JitFunction(self.name, body.encode(), self.argtypes, self.returns)
