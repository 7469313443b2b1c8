"""Block-sparse x dense matrix products in the loop DSL, against dense torch and torch.sparse.

``python -m bench spmm [--size 1024] [--blocks 4,8,16,32] [--sparsities 0,0.1,...,0.99]
[--dtypes f32,bf16] [--threads N] [--quick] [--clock wall|cpu] [--json FILE]``

C (M x N) = A (M x K, block-sparse: ``b x b`` blocks zero with probability = sparsity, stored as
block CSR) @ B (K x N dense), M = N = K = ``--size`` (the paper used 2048). :class:`SpmmNest`
is the loop-DSL SpMM: loop a over A's block rows, loop b over column panels of B and C, one
``tppasm.block_spmm`` call per (block row, panel). Per dtype and block size the panel width and
the spec are tuned once (at sparsity 0.5); every point is checked against NumPy and timed
against torch's dense matmul (rounds alternating with ours, :func:`bench.versus.versus`), and,
where torch implements them on this dtype (fp32 only in torch 2.13 CPU), torch's CSR and BSR
(``b x b`` blocks) sparse-dense products.

GFLOP/s are dense-equivalent (2*M*N*K / time, as the paper plots them); % peak counts the flops
actually done (the stored blocks') against the peak of the threads used: 0 where no block is
stored (sparsity 1); the table marks a % over 100 with "!". A record's ``peak_gflops`` is that
peak (done flops / time / fraction) and ``peak_unit`` its unit (:func:`bench.peaks.peak_unit`).
The crossover is the lowest sparsity of the sweep from which on ours beats the dense product.
"""
import argparse
import warnings

import numpy as np

import tppasm as tpp
from bench.common import Report, write_json
from bench.options import MAX_SIDE, check_memory, checked, count, counts, dtypes_option, items, once, real, summary
from bench.peaks import peak_legend, peak_unit
from bench.versus import add_arguments, parse as parse_options, peak_loop, quick_seconds, setup, versus
from loops import Loop, kernel
from tppasm.operand import as_ndarray, mark_written
from tppasm.spmm import bcsr, check_bcsr, random_block_sparse

SPARSITIES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
SPECS = ("BA", "AB", "Ba", "aB")
PANEL = 64                  # the narrowest panel of B tune() tries: --size must be a multiple
BYTES_PER_ELEMENT = 64      # what a point holds per element of A (f64 reference, torch's copies; 46 measured)


class SpmmNest:
    """C = A @ B for a BCSR A (``m x k`` in ``bm x bk`` blocks) and a dense B (``k x n``; bf16:
    VNNI2-packed): a loop nest over A's block rows (a) and ``bn``-wide column panels (b).

    >>> rng = np.random.default_rng(0)
    >>> a = random_block_sparse(8, 8, 4, 4, 0.5, rng); b = rng.standard_normal((8, 32)).astype(np.float32)
    >>> nest = SpmmNest(8, 8, 32, 4, 4, bn=16)
    >>> c = np.empty((8, 32), np.float32); nest(*bcsr(a, 4, 4), b, c)
    >>> bool(np.allclose(c, a @ b, atol=1e-5))
    True
    """

    def __init__(self, m, k, n, bm, bk, dtype="f32", bn=64, spec="BA", pool=None):
        sizes = {"m": m, "k": k, "n": n, "bm": bm, "bk": bk, "bn": bn}
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"SpmmNest: {name}={value!r}; expected a positive int, e.g. "
                                 "SpmmNest(256, 256, 256, 8, 8, bn=64)")
        m, k, n, bm, bk, bn = (int(v) for v in sizes.values())
        for name, whole, part in (("bm", "m", bm), ("bk", "k", bk), ("bn", "n", bn)):
            if sizes[whole] % part:
                raise ValueError(f"SpmmNest: {name}={part} must divide {whole}={sizes[whole]}")
        self.m, self.k, self.n, self.bm, self.bk, self.bn, self.dtype = m, k, n, bm, bk, bn, dtype
        self.mb, self.kb = m // bm, k // bk
        self.spmm = spmm = tpp.block_spmm(bm, bk, bn, self.kb, dtype, ldb=n, ldc=n)

        def body(i, j, rowptr, colidx, values, B, C):
            spmm(rowptr[i:i + 2], colidx, values, B[:, j:j + bn], C[i, :, j:j + bn], count=colidx.shape[0])

        self.lk = kernel(spec, Loop(0, self.mb), Loop(0, n, bn), pool=pool)(body)

    def arrays(self, rowptr, colidx, values, b, c):
        """The nest's arguments after checking the BCSR structure, B's shape and C's (C as block
        rows, a NumPy view of it); a BCSR with no stored block at all gets one unused block."""
        if len(rowptr) != self.mb + 1:
            raise ValueError(f"SpmmNest: rowptr has {len(rowptr)} entries; A has {self.mb} block rows, so {self.mb + 1}")
        check_bcsr(rowptr, colidx, len(colidx), self.kb)
        if len(colidx) == 0:        # (rowptr all 0, checked) the kernel needs a block to point at
            dt = tpp.dtypes.dtype(self.spmm.desc.dtype)
            colidx, values = np.zeros(1, np.int32), np.zeros((1, self.bm, self.bk), dt)
        f = self.spmm.desc.vnni
        want, bv = (self.k // f, self.n) + ((f,) if f > 1 else ()), as_ndarray(b, "b", "SpmmNest")
        if bv.shape != want:
            raise ValueError(f"SpmmNest: b has shape {bv.shape}; expected {want} (B is k x n = {self.k} x {self.n}"
                             + (", VNNI2-packed: pass tppasm.vnni_pack(B, 2))" if f > 1 else ")"))
        if not bv.flags.c_contiguous:
            raise ValueError("SpmmNest: b is not C-contiguous (the nest reads its rows n apart): pass "
                             "np.ascontiguousarray(b) (a torch tensor: b.contiguous())")
        cv = as_ndarray(c, "c", "SpmmNest", writes=True)
        if cv.shape != (self.m, self.n) or not cv.flags.c_contiguous:
            raise ValueError(f"SpmmNest: c must be a C-contiguous ({self.m}, {self.n}) float32 array, got one of "
                             f"shape {cv.shape}, strides {cv.strides} (the nest writes C in place: allocate it so, "
                             f"e.g. np.empty(({self.m}, {self.n}), np.float32))")
        return rowptr, colidx, values, b, cv.reshape(self.mb, self.bm, self.n)

    def __call__(self, rowptr, colidx, values, b, c):
        self.lk(*self.arrays(rowptr, colidx, values, b, c))
        mark_written([c])


def crossover(sparsities, ratios):
    """The lowest sparsity from which on (sparsities in increasing order, given in any) ours beats
    the dense product: ``ratios`` (dense time / ours) above 1 there and at every higher sparsity;
    NaN where it never does.

    >>> crossover([0.9, 0.1, 0.5], [3.0, 0.5, 1.5])
    0.5
    """
    pairs = sorted(zip(sparsities, ratios))
    over = [s for i, (s, _) in enumerate(pairs) if all(r > 1 for _, r in pairs[i:])]
    return over[0] if over else float("nan")


def operands(size, block, sparsity, dtype, rng):
    """(A dense as float64 of the rounded values, BCSR triple, B for the kernel, B as float64)."""
    dt = tpp.dtypes.dtype(dtype)
    a = random_block_sparse(size, size, block, block, sparsity, rng).astype(dt)
    b = rng.standard_normal((size, size), np.float32).astype(dt)
    bk = tpp.vnni_pack(b, 2) if dtype == "bf16" else tpp.aligned(b)
    return a, bcsr(a, block, block), bk, b


def tune(size, block, dtype, pool, rng, quick):
    """(bn, spec) fastest at sparsity 0.5 for this block size."""
    _, (rowptr, colidx, values), bk, _ = operands(size, block, 0.5, dtype, rng)
    c = tpp.empty((size, size))
    best = None
    for bn in ([PANEL] if quick else [PANEL, 2 * PANEL, 4 * PANEL]):
        if size % bn:
            continue
        nest = SpmmNest(size, size, size, block, block, dtype, bn, pool=pool)
        args = nest.arrays(rowptr, colidx, values, bk, c)
        for spec in SPECS:
            lk = nest.lk.with_spec(spec)
            t = quick_seconds(lambda: lk(*args), 0.02)
            if best is None or t < best[0]:
                best = (t, bn, spec)
    return best[1], best[2]


def torch_sparse(torch, a, b, block, dtype):
    """{name: callable} of torch's sparse-dense products that exist for this dtype."""
    out = {}
    if dtype != "f32":
        return out
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
    for name, make in (("csr", lambda: ta.to_sparse_csr()), ("bsr", lambda: ta.to_sparse_bsr((block, block)))):
        try:
            s = make()
            s @ tb
        except (RuntimeError, NotImplementedError):
            continue
        out[name] = lambda s=s: s @ tb
    return out


def bench_point(rep, size, block, sparsity, dtype, nest, torch, threads, rng, rounds):
    a, (rowptr, colidx, values), bk, b = operands(size, block, sparsity, dtype, rng)
    c = tpp.empty((size, size))
    c[...] = np.nan
    args = nest.arrays(rowptr, colidx, values, bk, c)
    nest.lk(*args)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err = float(np.abs(c - ref).max() / max(np.abs(ref).max(), 1.0))
    if not err <= 1e-5:
        raise AssertionError(f"spmm {dtype} {block}x{block} sparsity {sparsity}: relative error {err:.2e}")
    nnzb = int(rowptr[-1])
    done = 2.0 * nnzb * block * block * size
    dense_flops = 2.0 * size ** 3
    td = torch.float32 if dtype == "f32" else torch.bfloat16
    ta, tb = torch.from_numpy(a.astype(np.float32)).to(td), torch.from_numpy(b.astype(np.float32)).to(td)
    run = lambda: nest.lk(*args)   # noqa: E731
    # no stored block (sparsity 1): no flops done, 0% of the peak, and no peak loop to time
    t_ours, t_dense, ratio, *frac = versus(run, lambda: ta @ tb, rounds=rounds,
                                           peak_loop=peak_loop(dtype, done, threads) if done else None)
    frac = frac[0] if frac else 0.0
    sparse = {name: quick_seconds(fn, 0.05) for name, fn in torch_sparse(torch, a.astype(np.float32), b.astype(np.float32),
                                                                    block, dtype).items()}
    nan = float("nan")
    rep.add(dtype, f"{block}x{block}", sparsity, nnzb, t_ours * 1e3, t_dense * 1e3, sparse.get("csr", nan) * 1e3,
            sparse.get("bsr", nan) * 1e3, dense_flops / t_ours / 1e9, 100 * frac, ratio,
            size=size, threads=threads, err=err, bn=nest.bn, spec=nest.lk.spec.text,
            x=f"{dtype} {block}x{block} s={sparsity}", gflops=dense_flops / t_ours / 1e9,       # what --plot draws
            dense_torch_gflops=dense_flops / t_dense / 1e9,
            **{f"torch_{k}_gflops": dense_flops / t / 1e9 for k, t in sparse.items() if t},
            peak_gflops=done / t_ours / 1e9 / frac if frac else None, peak_unit=peak_unit(dtype))
    return ratio


def check_blocks(parser, size, blocks, dtypes):
    """Refuse (argparse's error) a ``--size`` not a multiple of :data:`PANEL` (the panels of B
    :func:`tune` tries), or a block size that does not divide it (or is odd, for bf16's VNNI pairs)."""
    if size % PANEL:
        parser.error(f"argument --size: {size} is not a multiple of {PANEL} (B's column panels), e.g. --size 1024")
    for b in blocks:
        why = f"does not divide --size {size}" if size % b else "is odd (bf16 blocks pair their rows for VNNI)" \
            if "bf16" in dtypes and b % 2 else ""
        if why:
            parser.error(f"argument --blocks: block size {b} {why}, e.g. --blocks 4,8,16,32")


def parse(argv=None):
    """The options of ``python -m bench spmm``, checked (a bad one: argparse's error); no work done."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m bench spmm", description=summary(__doc__))
    p.add_argument("--size", type=count("rows and columns", "--size 1024", limit=MAX_SIDE), default=1024,
                   help=f"M = N = K, a multiple of {PANEL} (default 1024; the paper: 2048)")
    p.add_argument("--blocks", type=counts("block rows and columns", "--blocks 4,8,16,32"), default="4,8,16,32",
                   help="comma list of block sizes b (b x b blocks), each dividing --size, even for bf16")
    p.add_argument("--sparsities", type=checked(lambda text: once([real(s, most=1.0) for s in items(text)]),
                                                "sparsities from 0 to 1, comma separated, each once",
                                                "--sparsities 0,0.5,0.9"),
                   default=",".join(map(str, SPARSITIES)), metavar="S,...",
                   help="comma list of the fractions of zero blocks, 0 to 1 (default "
                        f"{','.join(map(str, SPARSITIES))})")
    dtypes_option(p, ("f32", "bf16"))
    p.add_argument("--quick", action="store_true", help="no panel-width tuning, fewer rounds")
    add_arguments(p)
    args = parse_options(p, argv)
    check_blocks(p, args.size, args.blocks, args.dtypes)
    check_memory(p, "--size", args.size, BYTES_PER_ELEMENT * args.size ** 2, "--size 1024")
    return args


def points_report(size, threads, dtypes):
    """The table :func:`bench_point` fills: a row per (dtype, block, sparsity)."""
    return Report(f"Block-sparse ({size}x{size} in bxb blocks) x dense ({size}x{size}), "
                  f"{threads} thread(s): loops.kernel + tppasm.block_spmm vs torch",
                  ["dtype", "block", "sparsity", "stored blocks", "ms ours", "ms torch dense", "ms torch csr",
                   "ms torch bsr", "GFLOP/s (dense-equiv.)", "% peak", "ours/dense"],
                  marked=["% peak"], legend=peak_legend(dtypes))


def main(argv=None):
    args = parse(argv)
    torch, threads, pool = setup(args)
    sparsities = args.sparsities
    rep = points_report(args.size, threads, args.dtypes)
    rng = np.random.default_rng(0)
    crossings = []
    for dtype in args.dtypes:
        for block in args.blocks:
            bn, spec = tune(args.size, block, dtype, pool, rng, args.quick)
            nest = SpmmNest(args.size, args.size, args.size, block, block, dtype, bn, spec, pool)
            ratios = [bench_point(rep, args.size, block, s, dtype, nest, torch, threads, rng,
                                  5 if args.quick else 9) for s in sparsities]
            crossings.append((dtype, f"{block}x{block}", f"bn={bn} {spec}", crossover(sparsities, ratios)))
    summary = Report("Crossover: the lowest sparsity from which on the block-sparse product beats torch's dense "
                     "matmul (NaN: never in the sweep)", ["dtype", "block", "tuned", "crossover sparsity"])
    for row in crossings:
        summary.add(*row)
    write_json(args.json, [rep, summary])
    return 0


if __name__ == "__main__":
    main()
