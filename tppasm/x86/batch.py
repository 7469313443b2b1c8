"""General-register steps the x86 BRGEMM generators (AVX in :mod:`.brgemm`, AMX in :mod:`.amx`) share."""


def add_imm(a, reg, value, tmp):
    """``reg += value``; a value beyond int32 goes through ``tmp``, and 0 emits nothing.

    >>> from isa.x86 import Assembler, disassemble, rax, rcx
    >>> a = Assembler()
    >>> add_imm(a, rcx, 0, rax); add_imm(a, rcx, 8, rax); add_imm(a, rcx, 1 << 32, rax)
    >>> print(disassemble(a.encode()))
    0000  4883c108              add rcx,8
    0004  48b80000000001000000  mov rax,100000000h
    000e  4803c8                add rcx,rax
    """
    if not value:
        return
    if -2**31 <= value < 2**31:
        a.add(reg, value)
    else:
        a.mov(tmp, value)
        a.add(reg, tmp)


def mem_imm(a, op, mem, value, tmp):
    """``op`` (an assembler method name: "mov", "add", ...) of the qword ``mem`` with ``value``; a
    value beyond int32 goes through ``tmp``.

    >>> from isa.x86 import Assembler, disassemble, qword, rax, rsp
    >>> a = Assembler()
    >>> mem_imm(a, "mov", qword[rsp + 8], 5, rax); mem_imm(a, "add", qword[rsp + 8], 1 << 32, rax)
    >>> print(disassemble(a.encode()))
    0000  48c744240805000000    mov qword ptr [rsp+8],5
    0009  48b80000000001000000  mov rax,100000000h
    0013  4801442408            add [rsp+8],rax
    """
    if -2 ** 31 <= value < 2 ** 31:
        getattr(a, op)(mem, value)
    else:
        a.mov(tmp, value)
        getattr(a, op)(mem, tmp)


def next_batch(a, desc, p, q, es_a, es_b, tmp):
    """Step the batch pointers to the next (A, B) pair: by the strides (``p``, ``q`` are A and B),
    past one (off_a, off_b) int64 pair (``p``), or past one pointer in each list (``p``, ``q``).

    >>> from isa.x86 import Assembler, disassemble, rax, rsi, rdi
    >>> from tppasm.brgemm import Brgemm
    >>> a = Assembler()
    >>> next_batch(a, Brgemm(m=4, n=4, k=4, batch="stride", stride_a=16, stride_b=16), rdi, rsi, 4, 4, rax)
    >>> print(disassemble(a.encode()))
    0000  4883c740              add rdi,40h
    0004  4883c640              add rsi,40h
    """
    if desc.batch == "stride":
        add_imm(a, p, desc.stride_a * es_a, tmp)
        add_imm(a, q, desc.stride_b * es_b, tmp)
    elif desc.batch == "offset":
        a.add(p, 16)
    else:
        a.add(p, 8)
        a.add(q, 8)
