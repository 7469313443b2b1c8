"""The code that puts an AMX tile configuration on the stack and loads it, shared by the AMX BRGEMM
(:mod:`tppasm.x86.amx`), the AMX block SpMM (:mod:`tppasm.x86.spmm`) and the nest hooks
(:mod:`tppasm.x86.amx_config`).

>>> from isa.x86 import Function
>>> fn = Function("configure", [])
>>> _ = fn.stack(128)
>>> configure(fn.asm, bytes([1]) + bytes(63), base=0, now=64, written=False)
>>> text = fn.finalize().disassemble()
>>> [text.count(op) for op in ("sttilecfg", "ldtilecfg")]
[1, 1]
"""
from isa.x86 import dword, rsp


def write_config(a, offset, cfg):
    """Store the 64 bytes of ``cfg`` at ``[rsp + offset]``, a dword at a time (no 64-bit immediates:
    cacheable code holds no absolute values).

    >>> from isa.x86 import Function
    >>> fn = Function("write", [])
    >>> _ = fn.stack(64)
    >>> write_config(fn.asm, 0, bytes(64))
    >>> fn.finalize().disassemble().count("mov")
    16
    """
    for off in range(0, 64, 4):
        a.mov(dword[rsp + offset + off], int.from_bytes(cfg[off:off + 4], "little", signed=True))


def configure(a, cfg, base, now, written):
    """Load ``cfg`` unless it is the configuration loaded now (``sttilecfg`` to ``[rsp + now]`` and a
    compare: ~20 cycles where ``ldtilecfg`` takes ~200). ``cfg`` is loaded from ``[rsp + base]``,
    written there first unless ``written``. The tiles stay configured on return, as after a nest's
    ``tileconfig()``; tile data is never assumed, only the shapes.

    >>> from isa.x86 import Function
    >>> fn = Function("configure", [])
    >>> _ = fn.stack(128)
    >>> configure(fn.asm, bytes([1]) + bytes(63), base=0, now=64, written=True)
    >>> fn.finalize().disassemble().count("mov dword")
    0
    """
    load, done = a.label(), a.label()
    a.sttilecfg([rsp + now])
    for off in range(0, 64, 4):
        a.cmp(dword[rsp + now + off], int.from_bytes(cfg[off:off + 4], "little", signed=True))
        a.jne(load)
    a.jmp(done)
    a.bind(load)
    if not written:
        write_config(a, base, cfg)
    a.ldtilecfg([rsp + base])
    a.bind(done)
