"""ResNet-50 v1.5 forward convolutions as BRGEMMs in the loop DSL, against torch in the same run.

``python -m bench conv [--batch 1,8] [--dtypes f32,bf16] [--threads N] [--layers a,b,...] [--quick]
[--fresh] [--clock wall|cpu] [--json FILE]``

Every distinct convolution of ResNet-50 v1.5 (the 7x7/2 stem, the 1x1 and 3x3 bottleneck layers,
the strided 3x3 and 1x1 downsampling ones: 23 shapes) runs as :class:`bench.conv_nest.ConvNest`,
the paper's 7-loop nest over blocked layouts with the input pre-padded. Per layer, batch and dtype
the blocking knobs are enumerated by hand (channel block ``bk``, the BRGEMM batch axis, output
pixels per BRGEMM, the filter columns in k or not), each timed with a default spec; the three
fastest go to the loop kernel's tuner (``lk.tune``) with the candidate specs of
:func:`spec_candidates`, and the best (blocking, spec) of the finalists, timed again, is kept
(:func:`tune_layer`). Each layer's choice is remembered in tppasm's cache
(:mod:`bench.conv_remembered`) and the next run times it in its final round again, so repeated
runs keep the best pick (columns "choice": first, kept or new, and "runs": how many runs it sums
up; ``--fresh`` neither reads nor writes). The result is checked against
``torch.nn.functional.conv2d`` (fp32; for bf16 against fp32 torch on the same bf16-rounded
operands) and timed against torch's fastest of NCHW and channels-last (oneDNN in torch 2.13 CPU),
the two alternating round by round (:func:`bench.versus.versus`). bf16 runs take bf16 activations and VNNI-packed bf16 weights and
write bf16 outputs, as torch does (see :mod:`bench.conv_nest` for the fp32 partial sums).

Columns: ms per call (medians of the alternating rounds), our GFLOP/s and % of the measured peak of
the threads used (fp32 FMA loop; bf16 ``vdpbf16ps`` loop), and ours/torch as the median of the
per-round ratios (> 1: ours is faster). The summary gives each (dtype, batch)'s geometric mean over
the layers and the ratio for the whole network (each layer weighted by how often ResNet-50 runs it).
% of peak is the median per-round fraction with the peak loop timed in the same rounds (on 2+
threads: of the peak loop running on as many threads, see :func:`bench.peaks.peak_loop_on`).
GFLOP/s and % of peak count the nominal flops (2NKCRSPQ: every filter tap, the padding's too),
while the nest skips the edge rows' padded taps (:mod:`bench.conv_nest`): a padded layer can read
over 100% (a 7x7 3x3 layer does 9.5% fewer taps than it is credited); the table marks a % of peak
over 100 with "!". A record's ``peak_gflops`` is the peak its % is of (GFLOP/s / fraction) and
``peak_unit`` that peak's unit and instruction (:func:`bench.peaks.peak_unit`).
"""
import argparse
import itertools
import time
import zlib
from dataclasses import replace

import numpy as np

import tppasm as tpp
from isa.cpu import host
from bench import conv_remembered
from bench.common import Report, write_json
from bench.options import MAX_BATCH, counts, dtypes_option, names, summary
from bench.peaks import peak_legend, peak_unit
from bench.conv_nest import Blocking, Conv, ConvNest
from bench.gemm import n_block
from bench.versus import add_arguments, fastest, geomean, peak_loop, quick_seconds, ranked, setup, versus
from bench.versus import parse as parse_options
from tppasm.conv_layout import block_activations, block_weights, unblock_activations

# ResNet-50 v1.5 (stride in the 3x3 of each stage's first block): name, C, K, H=W, R=S, stride,
# pad, how many times the network runs the shape
LAYERS = [
    ("conv1", 3, 64, 224, 7, 2, 3, 1),
    ("res2a_branch1", 64, 256, 56, 1, 1, 0, 4),        # = every res2 branch2c
    ("res2a_branch2a", 64, 64, 56, 1, 1, 0, 1),
    ("res2a_branch2b", 64, 64, 56, 3, 1, 1, 3),
    ("res2b_branch2a", 256, 64, 56, 1, 1, 0, 2),
    ("res3a_branch1", 256, 512, 56, 1, 2, 0, 1),
    ("res3a_branch2a", 256, 128, 56, 1, 1, 0, 1),
    ("res3a_branch2b", 128, 128, 56, 3, 2, 1, 1),
    ("res3a_branch2c", 128, 512, 28, 1, 1, 0, 4),
    ("res3b_branch2a", 512, 128, 28, 1, 1, 0, 3),
    ("res3b_branch2b", 128, 128, 28, 3, 1, 1, 3),
    ("res4a_branch1", 512, 1024, 28, 1, 2, 0, 1),
    ("res4a_branch2a", 512, 256, 28, 1, 1, 0, 1),
    ("res4a_branch2b", 256, 256, 28, 3, 2, 1, 1),
    ("res4a_branch2c", 256, 1024, 14, 1, 1, 0, 6),
    ("res4b_branch2a", 1024, 256, 14, 1, 1, 0, 5),
    ("res4b_branch2b", 256, 256, 14, 3, 1, 1, 5),
    ("res5a_branch1", 1024, 2048, 14, 1, 2, 0, 1),
    ("res5a_branch2a", 1024, 512, 14, 1, 1, 0, 1),
    ("res5a_branch2b", 512, 512, 14, 3, 2, 1, 1),
    ("res5a_branch2c", 512, 2048, 7, 1, 1, 0, 3),
    ("res5b_branch2a", 2048, 512, 7, 1, 1, 0, 2),
    ("res5b_branch2b", 512, 512, 7, 3, 1, 1, 2),
]


FRESH = False       # --fresh: neither time nor update the choices earlier runs remembered


def layer(name, n):
    """The :class:`Conv` of ResNet-50 layer ``name`` at batch ``n``.

    >>> str(layer("res3a_branch2b", 8))
    '128->128 3x3/2 pad 1 on 56x56 N=8'
    """
    for nm, c, k, h, r, st, pad, _ in LAYERS:
        if nm == name:
            return Conv(n=n, c=c, k=k, h=h, w=h, r=r, s=r, stride=st, pad=pad)
    raise ValueError(f"no layer {name!r}; the layers are {', '.join(x[0] for x in LAYERS)}")


def blockings(shape, dtype, quick=False, isa=None):
    """The hand-enumerated knobs tried for ``shape``: channel blocks of 64 (the stem: its C, made
    even for bf16's VNNI pairs, and with the filter columns folded also its odd C, the pairs then
    running over a filter row: no zero channel; bf16 3x3 layers also 128: half the partial-sum
    passes through the fp32 scratch, k twice as long: +4-9% on res3b/4b/5b_branch2b at batch 8
    on Zen 4, where fp32 gained under 1%), output-channel blocks of 32 and 64 (and 16 on AVX2: see
    below; those that divide K, else K's largest divisor up to 64), every BRGEMM batch axis the
    filter has, with and without the filter columns folded into k, and a whole or half output row
    per BRGEMM (a flat 1x1 convolution: one row, up to eight rows or the whole image; long GEMMs
    stream the input better when it comes from L3). A strided 1x1 layer also tries its pixels
    gathered into a flat GEMM (``Blocking.gather``; ``quick`` takes only that where an output row
    is shorter than an AMX tile's 16 rows, and only the row elsewhere). On AMX hosts
    (``isa``: the host's by default) bf16 layers also try BRGEMMs through several output rows
    (:func:`row_spans`). On AVX2 hosts output-channel blocks of 16 too (:func:`bench.gemm.n_block`):
    a 6 x 2 register tile's B row is then one cache line; on Zen 4 running AVX2 (an AVX2-only
    host's kernels, torch capped at AVX2 likewise), fp32, 2 threads, the geomean over the layers
    went from 1.08x to 1.14x torch at batch 8 (the least layer 0.84x -> 1.03x) and from 1.19x to
    1.24x at batch 1, 16 the winner's block in 30 of the 46 layers.

    >>> [str(b) for b in blockings(layer("res2a_branch2a", 1), "f32", quick=True)]
    ['bc=64 bk=64 bw=448 batch=c cstep=0']
    >>> [str(b) for b in blockings(layer("res5a_branch1", 8), "bf16", quick=True)]
    ['bc=64 bk=64 bw=49 batch=c cstep=0 gather']
    >>> [str(b) for b in blockings(layer("res3a_branch1", 8), "bf16", quick=True)]
    ['bc=64 bk=64 bw=28 batch=c cstep=0']
    >>> len(blockings(layer("conv1", 1), "bf16", isa="avx512")), len(blockings(layer("conv1", 1), "f32", isa="avx512"))
    (28, 20)
    >>> sorted({b.bk for b in blockings(layer("res5b_branch2a", 8), "f32", isa="avx2")})
    [16, 32, 64]
    >>> sorted({b.bc for b in blockings(layer("res3b_branch2b", 8), "bf16")})
    [64, 128]
    """
    isa = host().isa if isa is None else isa
    bc = 64 if shape.c >= 64 else shape.c + (shape.c % 2 if dtype == "bf16" else 0)
    bcs = [bc] + ([128] if dtype == "bf16" and shape.r > 1 and shape.c % 128 == 0 and not quick else [])
    bks = [64] if quick else sorted({n_block(isa), 32, 64})
    # a layer whose K they do not divide (not ResNet-50's): those that do, else K's largest divisor up to 64
    bks = [b for b in bks if shape.k % b == 0] or [max(d for d in range(1, 65) if shape.k % d == 0)]
    if shape.r == 1:
        axes = [("c", False)]
    else:
        axes = [("r", True)] if quick else [("c", False), ("c", True), ("r", False), ("r", True), ("s", False)]
    q, p = shape.q, shape.p
    spans = pixel_spans(shape, quick)
    gathered = shape.gatherable
    short = gathered and q < 16              # output rows shorter than a tile's 16 rows
    if shape.flat:               # a flat convolution's GEMM rows may span output rows, up to the image
        widths = spans
    else:
        widths = [] if short and quick else [q] + ([q // 2] if q >= 56 and q % 2 == 0 and not quick else [])
    out = [Blocking(bc=c, bk=bk, bw=bw, batch=ax, fold=fold)
           for c, bk, (ax, fold), bw in itertools.product(bcs, bks, axes, widths)]
    if gathered and (short or not quick):    # a strided 1x1 layer's pixels copied together: a flat GEMM
        out += [Blocking(bc=c, bk=bk, bw=bw, gather=True) for c, bk, bw in itertools.product(bcs, bks, spans)]
    if bc != shape.c and shape.c < 64 and not quick:   # bf16, odd C: folded pairs need no zero channel
        out += [replace(b, bc=shape.c) for b in out if b.fold and b.bc == bc]
    if isa == "amx" and dtype == "bf16" and not quick:
        out += [replace(b, rows=rows) for b in out if b.batch != "s" and b.bw == q for rows in row_spans(shape)]
    return out


def pixel_spans(shape, quick=False):
    """Output pixels per BRGEMM for a flat GEMM over output rows (a flat 1x1 layer, or a strided
    1x1 one's gathered pixels): one row, up to eight rows, the whole image (``quick``: up to eight).

    >>> pixel_spans(layer("res5a_branch1", 1)), pixel_spans(layer("res2a_branch1", 1), quick=True)
    ([7, 49], [448])
    """
    p, q = shape.p, shape.q
    rows = max(d for d in range(1, 9) if p % d == 0)
    return [rows * q] if quick else sorted({q, rows * q, p * q})


def row_spans(shape):
    """Output rows per BRGEMM worth trying on AMX (``Blocking.rows``): for a stride-1 3x3 layer whose
    output row is under 16 pixels (a tile's rows): the fewest rows above one and the most that
    stay under 128 BRGEMM rows (rows must divide P).

    >>> row_spans(layer("res5b_branch2b", 1)), row_spans(layer("res4b_branch2b", 1)), row_spans(layer("res3b_branch2b", 1))
    ([7], [2, 7], [])
    """
    if shape.stride != 1 or shape.flat or shape.q >= 16:
        return []
    spans = [d for d in range(2, shape.p + 1) if shape.p % d == 0 and shape.spanned(d) <= 128]
    return sorted({spans[0], spans[-1]}) if spans else []


def spec_candidates(shape, threads):
    """Loop orders (letters: a image, b input-channel block, c output-channel block, d output row,
    e output-column block, f filter row, g filter column), with images parallel, or images and the
    outermost output loop collapsed into one parallel loop (so a batch of 1 still spreads); for
    batches, two with the output-channel blocks outermost (a block's weights serve every image).
    ``decbfg`` puts the output-channel blocks inside the pixels: a pixel block's input serves them all.

    Images alone in parallel only when there are at least as many as threads (else a thread idles).
    On several threads also :func:`spread_spec`, which shares output-channel blocks and output rows
    (a flat layer's pixel blocks) among them.

    >>> spec_candidates(layer("conv1", 1), 2)[:3], spec_candidates(layer("conv1", 1), 1)[:2]
    (['ACdebfg', 'ADcebfg', 'ADecbfg'], ['Acdebfg', 'ACdebfg'])
    >>> spec_candidates(layer("conv1", 1), 2)[-1], spec_candidates(layer("res2a_branch2a", 8), 16)[-1]
    ('ACDebfg', 'ACEdbfg')
    """
    orders = ["cdebfg", "dcebfg", "decbfg", "cfgbde", "fgbcde", "cdefgb", "dfgbce"]
    out = []
    for order in orders:
        if shape.n >= threads:
            out.append("A" + order)
        if (threads > 1 or shape.n == 1) and order[0] not in "bfg":    # (reduction loops stay serial)
            out.append("A" + order[0].upper() + order[1:])
    if shape.n > 1:             # output-channel blocks outside the images: weights reused across them
        out += ["CAdebfg", "CAfgbde"]
    if threads > 1:
        out.append(spread_spec(shape))
    return out


def spread_spec(shape):
    """Images, output-channel blocks and output rows in one parallel loop (a flat layer has one
    output row: its pixel blocks instead), so that a batch of 1 keeps many threads busy where the
    channel blocks alone are fewer than the threads (a layer of 64 output channels in blocks of
    64: one; on 2 threads, Zen 4, bf16 res2b_branch2a at batch 1 ran 0.47 ms with ``ACdebfg``,
    0.27 with ``ACEdbfg``; conv1 in fp32 2.36 ms with ``ACdebfg``, 1.10 with ``ACDebfg``).

    >>> spread_spec(layer("res3b_branch2b", 1)), spread_spec(layer("res3b_branch2a", 1))
    ('ACDebfg', 'ACEdbfg')
    """
    return "ACEdbfg" if shape.flat else "ACDebfg"


def default_spec(shape, threads):
    """The spec knobs are compared with: images in parallel when there are enough of them, else
    :func:`spread_spec`."""
    return "Acdebfg" if shape.n >= 2 * threads or threads == 1 else spread_spec(shape)


def unprefetched(knobs, dtype, amx=None):
    """``knobs`` again without their BRGEMMs' software prefetches (``Blocking.prefetch=False``)
    where ``dtype`` runs on AMX tiles (``amx``: the host's ISA is amx by default), else []. On an
    Emerald Rapids Xeon, AMX BRGEMMs whose blocks sit in L2 (as a layer's weights and input rows
    do) ran 1.2-1.4x faster without them, and nests that read A or C from L3 10-28% slower, so
    :func:`tune_layer` times its finalists both ways.

    >>> [str(b) for b in unprefetched([Blocking()], "bf16", amx=True)], unprefetched([Blocking()], "f32", amx=True)
    (['bc=64 bk=64 bw=0 batch=c cstep=0 no-prefetch'], [])
    """
    amx = host().isa == "amx" if amx is None else amx
    return [replace(b, prefetch=False) for b in knobs] if amx and dtype == "bf16" else []


def tune_layer(shape, dtype, x, w, pool, threads, quick=False, prior=None):
    """The fastest (ConvNest, spec, views) for ``shape`` on NCHW operands ``x``, ``w``: every
    :func:`blockings` knob set timed with :func:`default_spec` in interleaved rounds
    (:func:`bench.versus.ranked`; timed one after another, a call each, they let a slow phase of
    the host decide which went on); the loop kernel's tuner (``lk.tune``) over
    :func:`spec_candidates` for the three fastest (on Zen 4 the second or third under the default
    spec is often the fastest after spec tuning: fp32 res4a_branch2b at batch 8, 2 threads, the
    third, folded with ``batch="r"``, took 8.6 ms with ``Acfgbde``, the first 9.3); then the two best
    specs of each timed again in interleaved rounds with the bench's clock
    (:func:`bench.versus.fastest`: the tuner's single calls on the wall clock rank close candidates
    by chance on a busy machine), each in a fresh nest (a tuned loop kernel runs its remembered
    best whatever spec it is given), on AMX hosts each also without prefetches (:func:`unprefetched`).
    ``prior``, an earlier run's choice
    (:class:`bench.conv_remembered.Choice`), joins that final round when its result matches the
    first finalist's."""
    def build(bl, spec):
        nest = ConvNest(shape, dtype, bl, spec=spec, pool=pool)
        return nest, nest.views(block_activations(x, bl.bc, shape.pad, dtype),
                                block_weights(w, bl.bc, bl.bk, dtype, fold=bl.fold), nest.output())

    knobs = blockings(shape, dtype, quick)
    built = [build(bl, default_spec(shape, threads)) for bl in knobs]
    order = ranked([lambda n=n, v=v: n.run(*v) for n, v in built], rounds=3, seconds=0.01)
    del built                                       # (their operands: up to ~30 MB each at N=8)
    finalists = []
    for bl in [knobs[i] for i in order[:1 if quick else 3]]:
        nest, views = build(bl, default_spec(shape, threads))
        nest.lk.tune(*views, specs=spec_candidates(shape, threads), reps=3, progress=False)
        by_time = sorted((t, sp) for sp, t, _ in nest.lk.last_tuning if t is not None)
        finalists += [(bl, sp) for _, sp in by_time[:1 if quick else 2]]
    finalists += [(bl, sp) for (_, sp), bl in zip(finalists, unprefetched([bl for bl, _ in finalists], dtype))]
    built = [(*build(bl, sp), sp) for bl, sp in finalists]          # (nest, views, spec)
    if prior is not None and (prior.blocking, prior.spec) not in finalists:
        candidate = (*build(prior.blocking, prior.spec), prior.spec)
        if same_result(built[0], candidate, dtype):
            built.append(candidate)
    nest, views, spec = built[fastest([lambda n=n, v=v: n.run(*v) for n, v, _ in built])]
    return nest, spec, views


def tolerance(dtype):
    """Largest accepted max |difference| / max |reference| of a layer's output.

    >>> tolerance("f32"), tolerance("bf16")
    (0.0001, 0.004)
    """
    return 1e-4 if dtype == "f32" else 4e-3            # bf16 outputs: rounded to 8 bits


def result(nest, views):
    """The output (NCHW, fp32) of ``nest`` run on ``views``, its output poisoned first."""
    y = views[2]
    y[...] = np.nan
    nest.run(*views)
    return unblock_activations(nest.result(y.reshape(nest.output().shape))).astype(np.float32)


def same_result(a, b, dtype):
    """Whether two (nest, views, spec) of one layer compute the same output (within
    :func:`tolerance`; NaN, an element not written, never matches)."""
    ya, yb = result(*a[:2]), result(*b[:2])
    return bool(np.abs(ya - yb).max() <= tolerance(dtype) * np.abs(ya).max())


def check(shape, nest, views, x, w, torch):
    """Max |ours - torch| / max |torch| after ``nest`` ran on ``views`` (torch in fp32 on the
    operands as rounded to our dtype)."""
    tx = torch.from_numpy(x.astype(np.float32))
    tw = torch.from_numpy(w.astype(np.float32))
    with torch.no_grad():
        ref = torch.nn.functional.conv2d(tx, tw, stride=shape.stride, padding=shape.pad).numpy()
    return float(np.abs(result(nest, views) - ref).max() / np.abs(ref).max())


def torch_conv(shape, dtype, x, w, torch):
    """(callable, format name) of torch's faster layout for this convolution: NCHW or channels-last."""
    td = torch.float32 if dtype == "f32" else torch.bfloat16
    tx = torch.from_numpy(x.astype(np.float32)).to(td)
    tw = torch.from_numpy(w.astype(np.float32)).to(td)
    best = None
    for fmt, mf in (("nchw", torch.contiguous_format), ("nhwc", torch.channels_last)):
        a, b = tx.contiguous(memory_format=mf), tw.contiguous(memory_format=mf)

        def run(a=a, b=b):
            with torch.no_grad():
                torch.nn.functional.conv2d(a, b, stride=shape.stride, padding=shape.pad)
        t = quick_seconds(run)
        if best is None or t < best[0]:
            best = (t, run, fmt)
    return best[1], best[2]


def bench_layer(rep, name, shape, dtype, pool, threads, torch, quick, rounds):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    dt = tpp.dtypes.dtype(dtype)
    x = rng.standard_normal((shape.n, shape.c, shape.h, shape.w), np.float32).astype(dt)
    w = (rng.standard_normal((shape.k, shape.c, shape.r, shape.s), np.float32) / np.sqrt(shape.c * shape.r)).astype(dt)
    knobs, specs = blockings(shape, dtype, quick), spec_candidates(shape, threads)
    knobs += unprefetched(knobs, dtype)                 # what a remembered choice may be
    key = conv_remembered.layer_key(shape, dtype, threads, knobs, specs)
    prior = None if FRESH else conv_remembered.load(key, knobs, specs)
    t0 = time.perf_counter()
    nest, spec, views = tune_layer(shape, dtype, x, w, pool, threads, quick, prior)
    tune_s = time.perf_counter() - t0
    err = check(shape, nest, views, x, w, torch)
    if not err <= tolerance(dtype):
        raise AssertionError(f"conv {name} {shape} {dtype} {nest.blocking} {spec}: relative error {err:.2e} > "
                             f"{tolerance(dtype)}")
    ours = lambda: nest.run(*views)   # noqa: E731
    theirs, fmt = torch_conv(shape, dtype, x, w, torch)
    t_ours, t_theirs, ratio, frac = versus(ours, theirs, rounds=rounds, peak_loop=peak_loop(dtype, shape.flops, threads))
    how, runs = ("fresh", 1) if FRESH else conv_remembered.update(
        key, ["conv", name, f"N={shape.n}", dtype, threads] + (["quick"] if quick else []), prior, nest.blocking,
        spec, t_ours, tune_s)
    gf = shape.flops / t_ours / 1e9
    pct = 100 * frac
    chosen = f"{nest.blocking}{' stream' if nest.stream_out else ''} {spec}"
    rep.add(name, f"{shape.c}->{shape.k} {shape.r}x{shape.s}/{shape.stride} {shape.h}x{shape.w}", shape.n, dtype,
            chosen, how, runs, t_ours * 1e3, t_theirs * 1e3, fmt, gf, pct, ratio,
            layer=name, blocking=str(nest.blocking), spec=spec, err=err, tune_seconds=tune_s, threads=threads,
            flops=shape.flops, x=f"{name} N{shape.n} {dtype}", gflops=gf, torch_gflops=shape.flops / t_theirs / 1e9,
            peak_gflops=gf / frac if frac else None, peak_unit=peak_unit(dtype))     # x, *gflops: what --plot draws
    return ratio, t_ours, t_theirs


def parse(argv=None):
    """The options of ``python -m bench conv``, checked (a bad one: argparse's error); no work done."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m bench conv", description=summary(__doc__))
    p.add_argument("--batch", type=counts("batch sizes", "--batch 1,8", limit=MAX_BATCH), default="1,8",
                   help="comma list of batch sizes (default 1,8)")
    dtypes_option(p, ("f32", "bf16"))
    p.add_argument("--layers", type=names("layer names", [x[0] for x in LAYERS], "--layers conv1,res2a_branch1"),
                   default=None, help="comma list of layer names (default: all 23)")
    p.add_argument("--quick", action="store_true", help="one blocking per layer, fewer rounds")
    p.add_argument("--fresh", action="store_true",
                   help="tune from nothing: do not time (or update) the choices earlier runs remembered in "
                        "tppasm's cache")
    add_arguments(p)
    return parse_options(p, argv)


def layers_report(threads, dtypes=("f32", "bf16")):
    """The per-layer table (:func:`bench_layer` fills its rows): GFLOP/s and % peak of the nominal flops."""
    return Report(f"ResNet-50 v1.5 forward convolutions, {threads} thread(s): loops.kernel + tppasm.brgemm vs "
                  "torch.nn.functional.conv2d; GFLOP/s and % peak of the nominal flops (every tap, the padding's "
                  "too: the nest skips padded taps, so a padded layer can read over 100%)",
                  ["layer", "C->K RxS/stride HxW", "N", "dtype", "blocking, spec", "choice", "runs", "ms ours",
                   "ms torch", "torch fmt", "GFLOP/s", "% peak", "ours/torch"],
                  marked=["% peak"], legend=peak_legend(dtypes))


def main(argv=None):
    global FRESH
    args = parse(argv)
    FRESH = args.fresh
    torch, threads, pool = setup(args)
    layers = args.layers or [x[0] for x in LAYERS]
    weight = {x[0]: x[7] for x in LAYERS}
    rep = layers_report(threads, args.dtypes)
    rounds = 5 if args.quick else 11
    rows = []
    for dtype in args.dtypes:
        for n in args.batch:
            results = {}
            for nm in layers:
                results[nm] = bench_layer(rep, nm, layer(nm, n), dtype, pool, threads, torch, args.quick, rounds)
            ratios = [r for r, _, _ in results.values()]
            net_ours = sum(weight[nm] * t for nm, (_, t, _) in results.items())
            net_torch = sum(weight[nm] * t for nm, (_, _, t) in results.items())
            rows.append((dtype, n, len(results), geomean(ratios), min(ratios), net_ours * 1e3, net_torch * 1e3,
                         net_torch / net_ours))
    summary = Report("Summary: geometric mean of ours/torch over the layers, and the whole network's "
                     "convolution time (layers weighted by their count in ResNet-50)",
                     ["dtype", "N", "layers", "geomean ours/torch", "min", "network ms ours", "network ms torch",
                      "network ours/torch"])
    for row in rows:
        summary.add(*row)
    write_json(args.json, [rep, summary])
    return 0


if __name__ == "__main__":
    main()
