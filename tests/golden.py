"""Golden hashes of generated machine code: a fixed set of TPP descriptors per ISA and of loop nests,
so that a refactor that changes the code any generator emits fails until the hashes are renewed on
purpose (``python -m tests.golden --update``, then review the diff of ``tests/golden_hashes.json``).

Generation is made independent of the host: BRGEMM code for an ISA the host runs natively would
otherwise use the host's optional features (AVX-512 BF16/VNNI, AVX-VNNI), so every case is
generated for fixed feature sets (:data:`FEATURES`), and nests for a fixed 2-thread pool.
"""
import hashlib
import json
import os
import pathlib
import sys

import numpy as np

HASHES = pathlib.Path(__file__).with_name("golden_hashes.json")
FEATURES = {"avx2": frozenset({"avx2", "fma", "f16c", "bmi2"}),
            "avx512": frozenset({"avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512vl", "avx512dq",
                                 "avx512_bf16", "avx512_vnni"})}
FEATURES["amx"] = FEATURES["avx512"] | {"amx_tile", "amx_bf16", "amx_int8"}
ISAS = ("avx2", "avx512", "amx", "sve")
SPECS = ("aBC", "aCb", "aBCb", "bcaBCb", "BC|a", "aB{R:2}C{C:1}", "aBC@schedule(dynamic,1)", "bcab")


def descriptors():
    """The fixed TPP cases: every kind, dtype, broadcast, batch and epilogue family, with tails."""
    from tppasm.brgemm import Brgemm
    from tppasm.eltwise import BINARY_OPS, GRAD_OPS, REDUCE_OPS, TRANSFORMS, UNARY_OPS, Binary, Reduce, Ternary, \
        Transform, Unary
    from tppasm.gemm_nt import GemmNT
    from tppasm.glu import SwiGLU
    from tppasm.norm import LayerNorm, RMSNorm, Softmax
    from tppasm.quant import Dequant, Quantize
    from tppasm.rotary import Rotary
    from tppasm.spmm import BlockSpmm
    out = [Brgemm(32, 32, 32), Brgemm(13, 17, 19, beta=1), Brgemm(64, 32, 64, bias=True, act="gelu"),
           Brgemm(7, 40, 9, lda=11, ldb=48, ldc=41, act="relu"), Brgemm(16, 16, 16, batch="offset"),
           Brgemm(16, 16, 16, batch="address"), Brgemm(32, 32, 32, dtype="bf16"),
           Brgemm(20, 24, 33, dtype="bf16", c_dtype="bf16", bias=True, act="tanh"),
           Brgemm(24, 48, 40, dtype="bf16", c_dtype="bf16", bias=True, act="gelu_erf"),   # gelu_erf_bf16
           Brgemm(32, 32, 64, dtype="i8"), Brgemm(9, 17, 13, dtype="i8", signs="ss", beta=1, act="relu"),
           Brgemm(64, 64, 64, dtype="bf16", c_dtype="bf16", beta=1),      # AMX: batch chunks
           Brgemm(448, 64, 64),                                            # x86: A streams
           Brgemm(28, 64, 64, lda=128, bias=True, act="relu", stream_c=True),  # x86: C streams
           Brgemm(28, 64, 64, dtype="bf16", c_dtype="bf16", stream_c=True),
           Brgemm(1, 64, 256, dtype="i8", pace=8),                                   # x86: the pace chain
           Brgemm(32, 32, 64, dtype="bf16", lda=2048),                     # AMX: A's rows crowd L1, no A prefetch
           Brgemm(64, 64, 128, dtype="bf16", prefetch=False),              # no software prefetch
           Brgemm(30, 40, 66, dtype="i8", a_bits=7, beta=1)]               # AVX2: vpmaddubsw, a k tail
    out += [Unary(op, 5, 37) for op in UNARY_OPS] + [Unary(op, 3, 20) for op in GRAD_OPS]
    out += [Unary("relu", 4, 33, bitmask=True), Unary("copy", 6, 19, out_dtype="bf16"),
            Unary("gelu_erf", 3, 50, dtype="bf16", out_dtype="bf16")]
    out += [Binary(op, 4, 21, bcast_b="row") for op in BINARY_OPS]
    out += [Binary("add", 7, 9, bcast_a="col", bcast_b="scalar", post="relu"), Ternary("muladd", 5, 30),
            Binary("add", 3, 40, dtype="f32", out_dtype="bf16", bcast_b="row", post="gelu_erf")]    # gelu_erf_bf16
    out += [Reduce(op, 6, 27, over) for op in REDUCE_OPS for over in ("rows", "cols")]
    out += [Transform(op, 12, 10, dtype="bf16" if "vnni2" in op else "i8" if "vnni4" in op else "f32")
            for op in TRANSFORMS] + [Transform("transpose", 12, 10, dtype="bf16")]          # 8x8 word blocks
    out += [Transform("transpose", 12, 10, dtype="i8"), Transform("transpose", 12, 10, dtype="i64")]  # byte, qword
    out += [Softmax(5, 37), Softmax(3, 200, dtype="bf16", out_dtype="bf16", scale=0.125, mask="row"),
            Softmax(4, 20, mask="full", ldm=24), LayerNorm(6, 45), RMSNorm(3, 70, dtype="bf16"),
            Rotary(4, 24, 8), SwiGLU(5, 33), Quantize(4, 50), Quantize(3, 37, ldo=40, dtype="bf16", bits=7),
            Dequant(3, 40, beta=1),
            BlockSpmm(8, 8, 40, 5), BlockSpmm(16, 32, 64, 4, dtype="bf16", beta=1), BlockSpmm(5, 3, 17, 2),
            GemmNT(5, 13, 37), GemmNT(3, 9, 70, lda=72, dtype="bf16", c_dtype="bf16")]
    return out


def generated(isa):
    """The golden descriptors that ``isa``'s backend has a generator for."""
    from tppasm import backends
    have = set(backends.registered())
    return [d for d in descriptors() if (backends.family(isa), d.kind) in have]


def _tpp_hashes():
    from tppasm import backends
    from tppasm.x86 import brgemm as x86_brgemm
    saved, chunks = x86_brgemm.target_features, os.environ.get("TPPASM_AMX_CHUNKS")
    far = os.environ.get("TPPASM_FAR_PREFETCH")
    os.environ["TPPASM_AMX_CHUNKS"] = "0"             # not the host's verdict (tppasm.x86.amx_probe)
    os.environ["TPPASM_FAR_PREFETCH"] = "1"           # not the vendor's default (tppasm.x86.far_prefetch)
    out = {}
    try:
        for isa in ISAS:
            if isa in FEATURES:
                x86_brgemm.target_features = lambda _isa, f=FEATURES[isa]: f
            for desc in generated(isa):
                code = backends.generate(desc, isa).code
                out[f"{isa} {desc!r}"] = hashlib.sha256(code).hexdigest()[:20]
        os.environ["TPPASM_AMX_CHUNKS"] = "1"         # the batch chunks of the AMX BRGEMM
        for desc in generated("amx"):
            if desc.kind == "brgemm" and desc.dtype in ("bf16", "i8"):
                code = backends.generate(desc, "amx").code
                if hashlib.sha256(code).hexdigest()[:20] != out[f"amx {desc!r}"]:
                    out[f"amx chunks {desc!r}"] = hashlib.sha256(code).hexdigest()[:20]
    finally:
        x86_brgemm.target_features = saved
        for name, value in (("TPPASM_AMX_CHUNKS", chunks), ("TPPASM_FAR_PREFETCH", far)):
            os.environ.pop(name)
            if value is not None:
                os.environ[name] = value
    return out


def _nest_hashes():
    import tppasm as tpp
    from loops import Loop, kernel
    from loops.aarch64.nest import build_aarch64
    from isa.pool import Pool
    from loops.signature import signature
    from loops.x86.nest import build as build_x86
    brgemm, zero = tpp.brgemm(m=8, n=8, k=8), tpp.zero(m=8, n=8)

    def body(ik, im, jn, A, B, C):
        if ik == 0:
            zero(C[im, jn])
        brgemm(A[im, ik:], B[jn, ik:], C[im, jn], count=2)
    A, B = np.zeros((4, 4, 8, 8), np.float32), np.zeros((4, 4, 8, 8), np.float32)
    C = np.zeros((4, 4, 8, 8), np.float32)
    arrays = (A, B, C)
    pool = Pool(2, spin_us=0)
    out = {}
    for spec in SPECS:
        # races="allow": the dynamic spec races (its K steps go to any thread); only its code is hashed here
        lk = kernel(spec, Loop(0, 4, 2), Loop(0, 4, blocks=[2, 1]), Loop(0, 4, blocks=[2]), pool=pool,
                    races="allow")(body)
        inst = lk._bind(arrays, signature(arrays))
        args = (lk.spec, lk.resolved, inst.body, inst.init, inst.fini, inst.layout, [a.itemsize for a in arrays])
        out[f"nest x86 {spec}"] = hashlib.sha256(build_x86(*args, inst.kernels).code).hexdigest()[:20]
        out[f"nest aarch64 {spec}"] = hashlib.sha256(build_aarch64(*args, inst.kernels)).hexdigest()[:20]
    return out


def compute():
    """{case name: first 20 hex digits of the SHA-256 of its machine code}."""
    return {**_tpp_hashes(), **_nest_hashes()}


def main(argv):
    if argv != ["--update"]:
        print(__doc__)
        return 2
    HASHES.write_text(json.dumps(compute(), indent=0, sort_keys=True) + "\n")
    print(f"wrote {HASHES}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
