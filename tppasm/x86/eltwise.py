"""x86 generators for the element-wise TPPs (AVX2 and AVX-512), written once against VectorISA.

One engine (:func:`walk_rows`) walks the rows of every operand: per row, a loop over blocks of U full
vectors (a column index register addresses every operand), the remaining full vectors, then one
tail vector whose lanes past n are masked (AVX-512 opmask; AVX2 ``vmaskmovps`` for fp32, one
``vpinsrw``/``vpextrw`` per element for bf16, which touches exactly the operand's bytes). Inputs
are widened to fp32 on load and outputs rounded on store (bf16: round to nearest even, NaN kept
quiet). What happens between load and store comes from the op tables below: op name ->
``(scratch registers, emitter(a, v, dst, srcs, tmp, c) -> result register)``.

>>> import numpy as np, tppasm
>>> k = tppasm.binary("add", 2, 3, bcast_b="row")
>>> out = np.empty((2, 3), np.float32); k(np.ones((2, 3), np.float32), np.arange(3, dtype=np.float32), out); out.tolist()
[[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]
"""
from isa.x86 import Function, K, al, ax, byte, eax, ptr, r10, r11, rbx, vec, word

from . import math as xm
from ..backends import register
from .stream import Stream, Tail, broadcast_element, load, make_tail, store, stream
from .vector import VectorISA

BITS_LANES = (1, 2, 4, 8, 16, 32, 64, 128)


def _math(name):
    return xm.NTMP[name], lambda a, v, d, s, t, c: (xm.EMITTERS[name](a, v, d, s[0], t, c), d)[1]


def _relu(a, v, d, s, t, c):
    a.vmaxps(d, c.into(a, d, 0.0), s[0])            # constant first: NaN propagates
    return d


def _vop(name, first=0):
    def emit(a, v, d, s, t, c):
        getattr(a, name)(d, s[first], s[1 - first])
        return d
    return emit


def _sqrt(a, v, d, s, t, c):
    a.vsqrtps(d, s[0])
    return d


def _square(a, v, d, s, t, c):
    a.vmulps(d, s[0], s[0])
    return d


def _negate(a, v, d, s, t, c):
    xm.vxor(a, v, d, s[0], c.i(xm.SIGN))
    return d


def _zero(a, v, d, s, t, c):
    a.vxorps(d, d, d) if d.num < 16 else a.vpxord(d, d, d)
    return d


UNARY = {
    "copy": (0, lambda a, v, d, s, t, c: s[0]),
    "identity": (0, lambda a, v, d, s, t, c: s[0]),
    "zero": (0, _zero),
    "relu": (0, _relu),
    "negate": (0, _negate),
    "square": (0, _square),
    "sqrt": (0, _sqrt),
    "reciprocal": _math("reciprocal"),
    "rsqrt": _math("rsqrt"),
    "exp": _math("exp"),
    "tanh": _math("tanh"),
    "sigmoid": _math("sigmoid"),
    "gelu": _math("gelu_tanh"),
    "gelu_erf": _math("gelu_erf"),
    "gelu_erf_fast": _math("gelu_erf_fast"),
}
# a bf16 output is rounded to 2^-9 right after: these take the forms accurate to 2^-16 (xm.ACCURACY_BF16)
UNARY_BF16_OUT = {"exp": _math("exp_bf16"), "gelu_erf": _math("gelu_erf_bf16")}


def _unary_form(op, out_dtype):
    """(temporaries, emitter) of unary ``op`` for an output of ``out_dtype``."""
    return (UNARY_BF16_OUT if out_dtype == "bf16" and op in UNARY_BF16_OUT else UNARY)[op]


def _grad(name):
    n, emit = _math(name)

    def body(a, v, d, s, t, c):                     # s = (dy, x)
        emit(a, v, d, s[1:], t, c)
        a.vmulps(d, d, s[0])
        return d
    return n, body


def _relu_bwd(a, v, d, s, t, c):
    a.vmovaps(d, s[0])
    xm.keep_if(a, v, d, s[1], c.f(0.0), xm.NLE, t[0])      # dy unless x <= 0: a NaN x passes it, as in torch
    return d


GRAD = {"relu_bwd": (1, _relu_bwd), "gelu_bwd": _grad("gelu_tanh_grad"), "gelu_erf_bwd": _grad("gelu_erf_grad")}


def _nan_vop(name):
    """max/min as np.maximum/np.minimum: NaN where either input is NaN (see xm.max_nan)."""
    def emit(a, v, d, s, t, c):
        xm.max_nan(a, v, d, s[1], s[0], t[0], op=name, k=c.k)      # (c.k: its chain's own opmask)
        return d
    return emit


BINARY = {"add": (0, _vop("vaddps")), "sub": (0, _vop("vsubps")), "mul": (0, _vop("vmulps")),
          "div": (0, _vop("vdivps")), "max": (1, _nan_vop("vmaxps")), "min": (1, _nan_vop("vminps"))}


def _muladd(a, v, d, s, t, c):                      # s = (a, b, c)
    a.vmovaps(d, s[2])
    a.vfmadd231ps(d, s[0], s[1])
    return d


TERNARY = {"muladd": (0, _muladd)}


# -- the row/column walk ------------------------------------------------------------------------
IDX, ROWS, BITS = r11, r10, rbx
MATH_TMP = 3                    # bodies with this many scratch registers are transcendentals:
MATH_UNROLL = 4                 # up to this many vectors' chains interleaved (xm.interleave)
NT_MIN_BYTES = 1 << 25          # contiguous outputs this large go to DRAM anyway: non-temporal stores


def walk_rows(fn, v, m, n, ins, outs, body, ntmp, bits=None):
    """Emit ``for each row: for each vector: outs = body(ins)``. ``bits``: (stream, "in"|"out")."""
    a = fn.asm
    lanes = v.lanes(4)
    streams = list(dict.fromkeys(ins + outs))
    fulls = [s for s in streams if s.kind == "full"]
    if (bits is None and m > 1 and all(s.kind == "full" and s.ld == n for s in streams)):
        m, n = 1, m * n                             # contiguous: one long row
    nfull, tail_n = divmod(n, lanes)
    bf16_out = any(s.dtype == "bf16" for s in outs)
    streaming = m == 1 and not bits and n * 4 >= NT_MIN_BYTES and not bf16_out
    math = ntmp >= MATH_TMP and not bits
    ntmp = max(ntmp, 3 if bf16_out else 0, 1 if bits or streaming else 0)
    nin = sum(s.kind in ("full", "row") for s in ins)
    regs = list(range(v.nregs))
    tail = make_tail(fn, v, tail_n, regs, any(s.dtype == "f32" and s.kind in ("full", "row") for s in streams))
    c_reserve = 0 if math else 2                    # a transcendental's constants: memory operands
    per = 1 + nin + ntmp
    for unroll in (range(MATH_UNROLL, 0, -1) if math else (4, 2, 1)):
        if unroll * per + sum(s.kind in ("col", "scalar") for s in ins) + c_reserve <= len(regs):
            break
    for s in ins:
        if s.kind in ("col", "scalar"):
            s.bcast = v.reg(regs.pop())
    work = [regs[u * per:(u + 1) * per] for u in range(unroll)]
    consts = xm.Consts(v, [v.reg(r) for r in regs[unroll * per:]])
    for s in ins:
        if s.kind == "scalar":
            broadcast_element(a, s, s.bcast)

    def vector(u, col, idx, count, nt=False, a=a, consts=consts):
        t = Tail(count, tail.k, tail.ymask) if count < lanes else None
        w = [v.reg(r) for r in work[u]]
        dst, srcs, tmp = w[0], w[1:1 + nin], w[1 + nin:]

        def at(s):
            def mem_at(i, es, size=None):
                disp = (col + i) * s.es
                expr = s.reg + disp if idx is None else s.reg + idx * s.es + disp
                return word[expr] if size == 2 else ptr(expr)
            return mem_at
        loaded, it = [], iter(srcs)
        for s in ins:
            loaded.append(load(a, v, next(it) if s.kind in ("full", "row") else None, s, at(s), t))
        if bits and bits[1] == "in":
            _load_bits(a, v, tmp[0], bits[0], col, count, consts)
            loaded.append(tmp[0])
        result = body(a, v, dst, loaded, tmp, consts)
        if bits and bits[1] == "out":
            _store_bits(a, v, loaded[0], bits[0], col, count, tmp[0], consts)
        spare = next(r for r in w if r != result) if nt else None
        for s in outs:
            store(a, v, s, result, at(s), t, tmp, consts, spare)

    if m > 1:
        a.mov(ROWS, m)
        top = a.label()
        a.bind(top)
    for s in ins:
        if s.kind == "col":
            broadcast_element(a, s, s.bcast)
    if bits:
        a.mov(BITS, bits[0].reg)
    def walk(nt=False):
        done, idx = 0, None
        if nfull >= 3 * unroll:
            blocks = nfull // unroll
            a.xor(IDX, IDX)
            loop = a.label()
            a.bind(loop)
            group([(u, u * lanes, IDX, lanes, nt) for u in range(unroll)])
            a.add(IDX, unroll * lanes)
            if bits:
                a.add(BITS, unroll * lanes // 8)
            a.cmp(IDX, blocks * unroll * lanes)
            a.jb(loop)
            done, idx = blocks * unroll, IDX
        rest = [(j - done) * lanes for j in range(done, nfull)] + ([(nfull - done) * lanes] if tail_n else [])
        calls = [(u % unroll, col, idx, min(lanes, n - done * lanes - col), nt) for u, col in enumerate(rest)]
        for i in range(0, len(calls), unroll):
            group(calls[i:i + unroll])

    def group(calls):
        """vector() for each of ``calls`` (distinct u); a transcendental's interleaved."""
        if not math:
            for call in calls:
                vector(*call)
            return
        xm.interleave(a, consts, [lambda a, c, call=call: vector(*call, a=a, consts=c) for call in calls])

    if streaming:
        # DRAM-sized output: streaming stores skip the read-for-ownership (16-byte aligned outputs)
        plain, end = a.label(), a.label()
        for s in outs:
            a.test(s.reg, 15)
            a.jnz(plain)
        walk(nt=True)
        a.sfence()
        a.jmp(end)
        a.bind(plain)
        walk()
        a.bind(end)
    else:
        walk()
    if m > 1:
        for s in dict.fromkeys(fulls):
            a.add(s.reg, s.ld * s.es)
        for s in ins:
            if s.kind == "col":
                a.add(s.reg, s.es)
        if bits:
            a.add(bits[0].reg, bits[0].ld)
        a.dec(ROWS)
        a.jnz(top)
    consts.finish(fn, scratch=v.reg(work[0][0]))


def _bits_mem(s, col, size):
    return {1: byte, 2: word}[size][BITS + col // 8]


def _store_bits(a, v, x, s, col, count, tmp, c):
    """Mask bits (not x <= 0: x > 0 or NaN) of this vector's lanes to ceil(count/8) bytes."""
    nbytes = -(-count // 8)
    if v.avx512:
        a.vcmpps(K[2], x, c.f(0.0), xm.NLE)
        a.kmovw(eax, K[2])
    else:
        a.vcmpps(tmp, x, c.f(0.0), xm.NLE)
        a.vmovmskps(eax, tmp)
    if nbytes == 1:
        a.mov(_bits_mem(s, col, 1), al)
    else:
        a.mov(_bits_mem(s, col, 2), ax)


def _load_bits(a, v, dst, s, col, count, c):
    """dst = per-lane keep mask from this vector's bits (all-ones lanes on AVX2; an opmask k2
    applied by the relu_bwd body on AVX-512, which then gets the register zeroed/kept)."""
    nbytes = -(-count // 8)
    a.movzx(eax, _bits_mem(s, col, 1 if nbytes == 1 else 2))
    if v.avx512:
        a.kmovw(K[2], eax)
        a.vpternlogd(dst.mask(K[2], zero=True), dst, dst, 0xFF)
    else:
        x = vec(128, dst.num)
        a.vmovd(x, eax)
        a.vpbroadcastd(dst, x)
        a.vpand(dst, dst, c.lanes(BITS_LANES))
        a.vpcmpeqd(dst, dst, c.lanes(BITS_LANES))


def _relu_bwd_bits(a, v, d, s, t, c):               # s = (dy, keep mask)
    xm.vand(a, v, d, s[0], s[1])
    return d


# -- generators ---------------------------------------------------------------------------------
@register("x86", "unary")
def generate_unary(desc, isa):
    v = VectorISA(isa)
    ops = desc.operands()
    fn = Function(f"unary_{desc.op}", ["ptr"] * len(ops))
    regs = list(fn.args)
    out = Stream(regs[len(ops) - 1 if not (desc.bitmask and desc.op == "relu") else 1], "full",
                 desc.out_dtype, desc.ldo)
    if desc.op == "zero":
        ins, ntmp, body, bits = [], *UNARY["zero"], None
    elif desc.op in GRAD:
        dy = Stream(regs[0], "full", desc.dtype, desc.ldi)
        if desc.bitmask:
            ins, ntmp, body = [dy], 1, _relu_bwd_bits
            bits = (Stream(regs[1], "bits", "u8", desc.mask_bytes), "in")
        else:
            ins, (ntmp, body), bits = [dy, Stream(regs[1], "full", desc.dtype, desc.ldi)], GRAD[desc.op], None
    else:
        ins = [Stream(regs[0], "full", desc.dtype, desc.ldi)]
        ntmp, body = _unary_form(desc.op, desc.out_dtype)
        bits = (Stream(regs[2], "bits", "u8", desc.mask_bytes), "out") if desc.bitmask else None
    walk_rows(fn, v, desc.m, desc.n, ins, [out], body, ntmp, bits)
    return fn.finalize()


@register("x86", "binary")
def generate_binary(desc, isa):
    v = VectorISA(isa)
    fn = Function(f"binary_{desc.op}", ["ptr"] * 3)
    ra, rb, ro = list(fn.args)
    ins = [stream(ra, desc.bcast_a, desc.dtype, desc.lda), stream(rb, desc.bcast_b, desc.dtype, desc.ldb)]
    ntmp, body = BINARY[desc.op]
    if desc.post:                                   # op into a scratch, then post into dst
        pt, post = _unary_form(desc.post, desc.out_dtype)
        first, ntmp = body, max(pt, ntmp) + 1       # the op's scratch: t[-1], its own: before it

        def body(a, v, d, s, t, c):
            return post(a, v, d, [first(a, v, t[-1], s, t[:-1], c)], t[:-1], c)
    walk_rows(fn, v, desc.m, desc.n, ins, [Stream(ro, "full", desc.out_dtype, desc.ldo)], body, ntmp)
    return fn.finalize()


@register("x86", "ternary")
def generate_ternary(desc, isa):
    v = VectorISA(isa)
    fn = Function(f"ternary_{desc.op}", ["ptr"] * 3)
    ra, rb, rc = list(fn.args)
    c = Stream(rc, "full", desc.out_dtype, desc.ldc)
    ins = [stream(ra, desc.bcast_a, desc.dtype, desc.lda), stream(rb, desc.bcast_b, desc.dtype, desc.ldb), c]
    walk_rows(fn, v, desc.m, desc.n, ins, [c], TERNARY[desc.op][1], TERNARY[desc.op][0])
    return fn.finalize()

