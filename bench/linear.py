"""``python -m bench linear``: :func:`tppasm.torch.linear` (:mod:`tppasm.torch`, the layer of
:mod:`tppasm.fc`) against ``torch.nn.functional.linear`` on the same tensors, forward
(``inference_mode``) and, with ``--backward``, forward + backward, per shape n x k -> m (rows, in
features, out features) and dtype, timed in interleaved rounds (:func:`bench.versus.versus`). A
forward row also times :class:`tppasm.torch.Linear` with its weight packed once
(``freeze()``) against torch (``torch/frozen``).

Besides the ratio (torch's time / ours: > 1 means ours is faster) and GFLOP/s against the measured
peak (% peak: the median per-round fraction, the dtype's peak loop run on as many threads in the
same rounds and on the same clock as ours, :func:`bench.versus.versus`; the record's
``peak_gflops`` is that peak, GFLOP/s / fraction, ``peak_unit`` its unit, :func:`bench.peaks.peak_unit`;
a % over 100 is marked "!"), each row gives the path :func:`tppasm.fc.forward`
takes (``dots``: :func:`tppasm.gemm_nt` for a few rows or few out features; ``transposed``;
``panels``) and how fast the weight was read (GB/s), which for a few rows (a decoder's next token)
is the figure that matters: the last table measures the host's read bandwidth with the same
threads (:func:`bench.llm.read_sweep`) to compare it with.
Every output is checked against torch's first: y and, with ``--backward``, the gradients x.grad,
w.grad and b.grad (each relative to its own largest magnitude: 1e-4 fp32, 2e-2 bf16).
"""
import argparse

from bench import options
from bench.common import Report, write_json
from bench.llm import read_sweep
from bench.peaks import peak_legend, peak_unit
from bench.versus import add_arguments, parse as parse_options, peak_loop, quick_seconds, setup, versus

FEW_ROWS = "1x4096x4096,8x4096x4096,16x4096x4096,1x4096x11008,4x768x3072,1x1024x1024,8x1024x1024"
GEMMS = "64x4096x4096,1024x1024x1024,4096x768x3072,1000x300x700,127x65x1000,2048x768x10"
TOLERANCE = {"f32": 1e-4, "bf16": 2e-2}


def shapes(text):
    """``"NxKxM,..."`` as (n, k, m) triples (``--shapes``' type: argparse's error for anything else).

    >>> shapes("1x4096x4096,8x64x32")
    [(1, 4096, 4096), (8, 64, 32)]
    """
    return _SHAPES(text)


_SHAPES = options.shapes("rows x in x out triples", "--shapes 8x4096x4096,1x768x3072", 3)


def path_of(n, k, m, dtype="f32"):
    """The forward path :mod:`tppasm.fc` takes for this shape.

    >>> path_of(1, 4096, 4096), path_of(1024, 1024, 1024)
    ('dots', 'panels')
    """
    from tppasm import fc
    return "dots" if fc.dots(n, m, k) else "transposed" if fc.transposed(n, m, k, dtype) else "panels"


def bench_shape(rep, torch, threads, n, k, m, dtype, backward, rounds):
    """One row: ours vs torch for x (n, k), w (m, k), b (m), forward or forward + backward."""
    from tppasm.torch.ops import linear
    F = torch.nn.functional
    tdt = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    g = torch.Generator().manual_seed(n * k + m)
    x = torch.randn(n, k, generator=g).mul_(k ** -0.5).to(tdt).requires_grad_(backward)
    w = torch.randn(m, k, generator=g).to(tdt).requires_grad_(backward)
    b = torch.randn(m, generator=g).to(tdt).requires_grad_(backward)
    dy = torch.randn(n, m, generator=g).to(tdt)

    def step(fn):
        if not backward:
            with torch.inference_mode():
                return fn(x, w, b)
        x.grad = w.grad = b.grad = None
        y = fn(x, w, b)
        y.backward(dy)
        return y

    def outputs(fn):
        y = step(fn)
        return {"y": y} if not backward else {"y": y, "x.grad": x.grad, "w.grad": w.grad, "b.grad": b.grad}
    err = max_difference(outputs(linear), outputs(F.linear), TOLERANCE[dtype], f"linear {n}x{k}->{m} {dtype}")
    flops = 2 * n * k * m * (3 if backward else 1)
    t_ours, t_torch, ratio, frac = versus(lambda: step(linear), lambda: step(F.linear), rounds=rounds,
                                          peak_loop=peak_loop(dtype, flops, threads))
    frozen = float("nan")
    if not backward:
        from tppasm.torch import Linear
        layer = Linear(k, m, dtype=tdt)
        with torch.no_grad():
            layer.weight.copy_(w), layer.bias.copy_(b)
        layer.freeze()
        frozen = versus(lambda: step(lambda x, w, b: layer(x)), lambda: step(F.linear), rounds=rounds)[2]
    gflops = flops / t_ours / 1e9
    wbytes = m * k * w.element_size()
    rep.add(dtype, f"{n}x{k}->{m}", path_of(n, k, m, dtype), t_ours * 1e3, t_torch * 1e3, ratio, frozen, gflops,
            100 * frac, wbytes / t_ours / 1e9, err,
            x=f"{dtype} {n}x{k}x{m}", gflops=gflops, torch_gflops=flops / t_torch / 1e9,
            peak_gflops=gflops / frac if frac else None, peak_unit=peak_unit(dtype))
    return ratio


def max_difference(ours, theirs, tolerance, what):
    """The largest relative difference between the tensors of ``ours`` and ``theirs`` (dicts by
    name, e.g. y and the gradients), each relative to the largest magnitude of torch's; an
    AssertionError naming the output when one is missing or past ``tolerance``.

    >>> import torch
    >>> max_difference({"y": torch.ones(2)}, {"y": torch.full((2,), 2.0)}, 0.6, "demo")
    0.5
    """
    worst = 0.0
    for name, want in theirs.items():
        got = ours.get(name)
        if got is None or want is None:
            raise AssertionError(f"{what}: {name} is missing ({'ours' if got is None else 'torch'})")
        got, want = got.detach().float(), want.detach().float()
        err = float((got - want).abs().max() / max(float(want.abs().max()), 1e-30))
        if not err <= tolerance:
            raise AssertionError(f"{what}: {name} differs from torch's by {err:.3g} (relative), over {tolerance:g}")
        worst = max(worst, err)
    return worst


def parse(argv=None):
    """The options of ``python -m bench linear``, checked (a bad one: argparse's error); no work done."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m bench linear", description=options.summary(__doc__))
    p.add_argument("--shapes", type=shapes, default=shapes(FEW_ROWS + "," + GEMMS),
                   help=f"rows x in x out triples (default: {FEW_ROWS},{GEMMS})")
    options.dtypes_option(p, tuple(TOLERANCE))
    p.add_argument("--backward", action="store_true", help="time forward + backward (y.backward(dy))")
    p.add_argument("--rounds", type=options.count("rounds", "--rounds 9"), default=9,
                   help="timed rounds per row; the figures are their median (default 9)")
    p.add_argument("--sweep-mib", type=options.count("MiB", "--sweep-mib 512"), default=512,
                   help="MiB read by the bandwidth sweep (default 512)")
    add_arguments(p)
    args = parse_options(p, argv)
    n, k, m = max(args.shapes, key=lambda shape: linear_bytes(*shape))
    options.check_memory(p, "--shapes", f"{n}x{k}x{m}", linear_bytes(n, k, m), "--shapes 8x4096x4096")
    options.check_memory(p, "--sweep-mib", args.sweep_mib, args.sweep_mib << 20, "--sweep-mib 512")
    return args


def linear_bytes(n, k, m):
    """Bytes a row of shape n x k -> m allocates at least: x, the weight, y and dy in fp32.

    >>> linear_bytes(1024, 1024, 1024) / 2 ** 20
    16.0
    """
    return 4 * (n * k + m * k + 2 * n * m)


def shapes_report(backward, threads, dtypes):
    """The table :func:`bench_shape` fills: a row per (dtype, shape)."""
    what = "forward + backward" if backward else "forward (inference_mode)"
    return Report(f"tppasm.torch.linear vs torch.nn.functional.linear, {what}, {threads} thread(s)",
                  ["dtype", "n x k -> m", "path", "ms ours", "ms torch", "torch/ours", "torch/frozen", "GFLOP/s",
                   "% peak", "weight GB/s", "max rel. diff"], marked=["% peak"], legend=peak_legend(dtypes))


def main(argv=None):
    args = parse(argv)
    torch, threads, pool = setup(args)
    rep = shapes_report(args.backward, threads, args.dtypes)
    for dtype in args.dtypes:
        for n, k, m in args.shapes:
            bench_shape(rep, torch, threads, n, k, m, dtype, args.backward, args.rounds)
    sweep, nbytes = read_sweep(pool, args.sweep_mib)
    bw = Report(f"Read bandwidth of the host on {threads} thread(s) (a {args.sweep_mib} MiB row-sum sweep): the ceiling of "
                "a weight read once", ["GB/s"])
    bw.add(nbytes / quick_seconds(sweep, seconds=0.5) / 1e9)
    write_json(args.json, [rep, bw])
    return 0


if __name__ == "__main__":
    main()
