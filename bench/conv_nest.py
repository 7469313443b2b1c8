"""A forward convolution as BRGEMMs in the loop DSL: the paper's 7-loop nest over blocked layouts.

Activations are ``(N, C/bc, Hp, Wp, bc)`` with the zero padding already in place, weights
``(K/bk, C/bc, R, S, bc, bk)`` (bf16: VNNI2 blocks), outputs ``(N, K/bk, P, Q, bk)``
(:mod:`tppasm.conv_layout` makes them). The logical loops are the paper's: a = image, b = input
channel block, c = output channel block, d = output row, e = output column block, f = filter row
r, g = filter column s. Every iteration is one BRGEMM: ``bw`` output pixels of one row (rows
``stride*bc`` elements apart in the input: stride addressing, no copy) times ``bk`` output
channels, reducing over a batch of ``bc``-deep blocks. The batch runs along one reduction axis
with a constant stride (``Blocking.batch``):

- ``"c"``: ``cstep`` input channel blocks (input stride Hp*Wp*bc, weight stride R*S*bc*bk), r and
  s in the nest (the paper's stride-batched variant);
- ``"r"``: the R filter rows (input stride Wp*bc, weights S*bc*bk); channel blocks and s in the nest;
- ``"s"``: the S filter columns (input stride bc, weights bc*bk; the input is passed as a read-only
  view with an s axis over the same memory); channel blocks and r in the nest.

``fold=True`` (with ``"c"`` or ``"r"``) moves the filter columns into the BRGEMM's k instead:
in the blocked layout the S*bc input values under an output pixel's filter row are contiguous,
and so are the matching weights (S, bc, bk), so each A row is S*bc long and consecutive pixels'
rows overlap (lda = stride*bc < k), read through a view of the input; the g loop runs once.
Such nests also take the weights in ``block_weights(..., fold=True)``'s layout, the one bf16
needs for an odd ``bc``: its VNNI2 pairs run over a filter row's S*bc values, so the stem's 3
input channels need no zero fourth (a quarter of its products; measured on Zen 4, bf16 conv1 at
batch 8 on 1 thread: 66% -> 85% of the peak in nominal FLOPs).

The first step of each output tile's reduction runs a ``beta=0`` kernel, the others ``beta=1``.
Outputs have the inputs' dtype, as in torch. A bf16 convolution whose reduction is one BRGEMM
call per output tile (a 1x1 layer with all channel blocks in the batch, say) rounds its fp32
sums to bf16 in that call; otherwise the partial sums go to an fp32 scratch output the nest owns,
and the last reduction step of each tile converts it into the bf16 output (the tile is still in
L1). Every tile's reduction runs on one thread (only a, c, d, e may be parallel), in loop order,
so its first and last steps are those with every reduction index at its first and last value.
A 1x1, stride-1, unpadded convolution is a GEMM over all pixels of an image: its rows are
flattened (P = 1, Q = H*W), so ``bw`` may span several output rows (the paper's ``h_in_gemm``).

``rows > 1`` (stride 1, not flat, whole rows, ``batch="c"`` or ``"r"``) runs each BRGEMM through
that many output rows over the padded width: output pixel (oh, ow) reads the input at
(oh + r) * Wp + ow + s, so consecutive "pixels" of the padded grid are consecutive A rows across
row ends, and one BRGEMM of m = (rows - 1) * Wp + Q rows covers the block; the Wp - Q columns
between its rows are computed and thrown away. The output then keeps the padded width,
``(N, K/bk, P, Wp, bk)`` (:meth:`ConvNest.result` is the ``(N, K/bk, P, Q, bk)`` view). This is for
AMX, whose tiles hold 16 rows: a 7- or 14-pixel row fills 7 or 14 of them and loads its B tiles
for few products. Modelled on Sapphire Rapids (``bench.amx_model``; bf16 BRGEMMs of k 64 x 8
blocks, n 32 and 64; useful products only, ooo / renamed readings): a 7x7 layer's row 16 / 24%
of the AMX peak, its 7 rows 40-41 / 52%; a 14x14 layer's row 31 / 47%, 2 rows 49-51 / 59-70%;
at 28 pixels and more a row fills its tiles and more rows gain nothing. On AVX-512 the
thrown-away columns only cost (Zen 5, bf16 batch 1: res4b_branch2b 0.30 -> 0.32-0.33 ms).
Edge rows keep all their taps (the padding rows hold zeros).

``gather=True`` (a strided, unpadded 1x1 layer: ResNet-50's downsampling shortcuts) first copies
the pixels the layer reads into an ``(N, C/bc, P, Q, bc)`` scratch (:meth:`ConvNest.run`: a copy
TPP per output row in a nest of its own), then runs the flat 1x1 nest on it, whose BRGEMMs may
span output rows: res5a_branch1's 7-pixel rows become BRGEMMs of up to 49 rows. That is for
AMX, where a 7-row BRGEMM fills 7 of a tile's 16 rows; MODELLED (``python -m bench amx-static
--conv``, bf16 BRGEMMs of k 64 x 8 blocks, renamed reading), % of the AMX peak:
res5a_branch1 24 -> 55 (m 7 -> 49), res4a_branch1 47 -> 57-66 (m 14 -> 98, 196); at 28 pixels a
row fills its tiles. On AVX-512 the copy (a quarter of the input) about pays for itself: Zen 4,
batch 8, 2 threads, each knob's best spec, interleaved, ms without -> with: res5a_branch1 bf16
3.83 -> 3.76, f32 7.36 -> 7.46; res4a_branch1 bf16 3.92 -> 3.84, f32 7.87 -> 7.71;
res3a_branch1 bf16 4.62 -> 4.23, f32 8.66 -> 8.29.

An output row whose filter rows reach into the top or bottom zero padding takes only the
filter rows over the image (:attr:`ConvNest.edge_rows`): with ``batch="r"`` a shorter batch
from the first of them, with ``"c"`` and ``"s"`` no call for the others; those products are
zeros. This saves 2 of 3P row taps of a 3x3, stride-1 layer (9.5% of the multiply-adds on a
7x7 image, 4.8% on 14x14), as oneDNN's direct convolutions do; measured on Zen 4, 1 thread,
fp32 batch 8: res5b_branch2b 112-114 -> 122-126 GFLOP/s, res4b_branch2b 115 -> 120,
res3b_branch2b 113 -> 116. The padding columns are still multiplied (skipping them would cut
a BRGEMM's rows in three). FLOP counts stay the nominal ones (every tap), as for torch.

When one BRGEMM call per output tile is the whole reduction and the output is larger than a
quarter of the last-level cache (``stream_out=None``; True / False force it; True on a layer
whose reduction takes several calls per tile has no effect and warns), the kernel
stores it around the caches (``tppasm.brgemm(..., stream_c=True)``): beside the input and the
weights it would mostly be evicted before its reader runs anyway, and the stores skip reading
each line first. Measured on Zen 4 (32 MiB L3), fp32 at batch 8, GFLOP/s: res2a_branch1
(25.7 MB out) 81-90 -> 101-108 on 1 thread, 172-200 -> 198-210 on 2; res3a_branch1 (12.8 MB)
100-101 -> 106-107 and 192-205 -> 208-214; bf16 res2a_branch1 (12.8 MB) 437-440 either way on
2 threads.

>>> import numpy as np
>>> from tppasm.conv_layout import block_activations, block_weights, conv2d_reference, unblock_activations
>>> shape = Conv(n=1, c=4, k=8, h=5, w=5, r=3, s=3, stride=1, pad=1)
>>> conv = ConvNest(shape, "f32", Blocking(bc=4, bk=8, bw=5))
>>> x = np.random.rand(1, 4, 5, 5).astype(np.float32); w = np.random.rand(8, 4, 3, 3).astype(np.float32)
>>> y = conv.output(); conv(block_activations(x, 4, pad=1), block_weights(w, 4, 8), y)
>>> bool(np.allclose(unblock_activations(y), conv2d_reference(x, w, 1, 1), rtol=1e-4))
True
"""
import warnings
from dataclasses import dataclass, replace

import numpy as np

import tppasm as tpp
from isa.cpu import caches
from loops import Loop, kernel
from tppasm.conv_layout import out_size
from tppasm.operand import as_ndarray, mark_written

BATCH_AXES = ("c", "r", "s")


def _is_int(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _ints(obj, knobs):
    """Check ``obj``'s int fields ``knobs`` ({name: (least, what it is, an example)}) and store them
    as Python ints: ValueError naming the knob, its range and an example."""
    who = type(obj).__name__
    for name, (least, what, example) in knobs.items():
        v = getattr(obj, name)
        _need(_is_int(v) and v >= least, f"{who}: {name}={v!r}; expected an int >= {least} ({what}), "
                                          f"e.g. {who}(..., {name}={example})")
        object.__setattr__(obj, name, int(v))


def _bools(obj, *names):
    """Check ``obj``'s bool fields ``names``: True or False, not a truthy stand-in such as 'no' or 1."""
    for name in names:
        v = getattr(obj, name)
        _need(isinstance(v, (bool, np.bool_)), f"{type(obj).__name__}: {name}={v!r}; expected True or False, e.g. "
                                                f"{type(obj).__name__}(..., {name}=True)")
        object.__setattr__(obj, name, bool(v))


@dataclass(frozen=True)
class Conv:
    """A 2-D forward convolution: N images of C x H x W, K filters of C x R x S, square stride and padding."""

    n: int
    c: int
    k: int
    h: int
    w: int
    r: int = 1
    s: int = 1
    stride: int = 1
    pad: int = 0

    def __post_init__(self):
        _ints(self, {"n": (1, "images", 8), "c": (1, "input channels", 64), "k": (1, "output channels", 64),
                     "h": (1, "input rows", 56), "w": (1, "input columns", 56), "r": (1, "filter rows", 3),
                     "s": (1, "filter columns", 3), "stride": (1, "the step along both axes", 2),
                     "pad": (0, "zero pixels around the image on each side", 1)})

    @property
    def p(self):
        return out_size(self.h, self.r, self.stride, self.pad)

    @property
    def q(self):
        return out_size(self.w, self.s, self.stride, self.pad)

    @property
    def wp(self):
        """The padded input width."""
        return self.w + 2 * self.pad

    def spanned(self, rows):
        """BRGEMM rows of ``rows`` output rows through the padded width (``Blocking.rows``).

        >>> Conv(n=1, c=4, k=4, h=7, w=7, r=3, s=3, pad=1).spanned(7)
        61
        """
        return (rows - 1) * self.wp + self.q

    @property
    def flops(self):
        return 2 * self.n * self.k * self.c * self.r * self.s * self.p * self.q

    @property
    def flat(self):
        """True when the convolution is one GEMM per image over its H*W pixels (1x1, stride 1, no padding)."""
        return self.r == self.s == self.stride == 1 and self.pad == 0

    @property
    def gatherable(self):
        """True for a strided, unpadded 1x1 convolution: a flat one over the pixels it reads
        (``Blocking.gather``).

        >>> Conv(n=1, c=4, k=4, h=8, w=8, stride=2).gatherable, Conv(n=1, c=4, k=4, h=8, w=8, r=3, s=3, stride=2).gatherable
        (True, False)
        """
        return self.r == self.s == 1 and self.pad == 0 and self.stride > 1

    def __str__(self):
        return (f"{self.c}->{self.k} {self.r}x{self.s}/{self.stride} pad {self.pad} on {self.h}x{self.w}"
                f" N={self.n}")


@dataclass(frozen=True)
class Blocking:
    """The knobs of one convolution nest.

    ``bc``/``bk``: channel blocks; ``bw``: output pixels per BRGEMM (0: a whole output row, or for
    a flat convolution one output row too); ``batch``: the reduction axis of the BRGEMM batch
    ("c", "r", "s"); ``cstep``: channel blocks per batch with ``batch="c"`` (0: all);
    ``kblock``/``hblock``: block sizes of the output-channel and output-row loops, for specs
    that write c or d twice; ``fold``: the filter columns in k; ``rows``: output rows per BRGEMM
    through the padded width; ``gather``: a strided 1x1 layer's pixels copied together first (see
    the module docstring); ``prefetch``: the BRGEMMs' software prefetches (``tppasm.brgemm``'s
    ``prefetch``; False: none). ``cstep`` counts only with ``batch="c"``, and ``kblock``/``hblock``
    only in specs that write c or d twice (``lk.tune`` may pick one); every knob is checked here
    (ValueError naming it), what depends on the layer by :class:`ConvNest`.

    >>> Blocking(bc=0)
    Traceback (most recent call last):
    ...
    ValueError: Blocking: bc=0; expected an int >= 1 (input channels per block), e.g. Blocking(..., bc=64)
    """

    bc: int = 64
    bk: int = 64
    bw: int = 0
    batch: str = "c"
    cstep: int = 0
    kblock: int = 1
    hblock: int = 1
    fold: bool = False
    rows: int = 1
    gather: bool = False
    prefetch: bool = True

    def __post_init__(self):
        _need(self.batch in BATCH_AXES, f"Blocking: batch={self.batch!r}; expected one of {BATCH_AXES}, e.g. "
                                        "Blocking(..., batch='c')")
        _ints(self, {"bc": (1, "input channels per block", 64), "bk": (1, "output channels per block", 64),
                     "bw": (0, "output pixels per BRGEMM; 0: a whole output row", 0),
                     "cstep": (0, "channel blocks per batch with batch='c'; 0: all", 0),
                     "kblock": (1, "output-channel blocks per block of the c loop; 1: none", 2),
                     "hblock": (1, "output rows per block of the d loop; 1: none", 2),
                     "rows": (1, "output rows per BRGEMM", 1)})
        _bools(self, "fold", "gather", "prefetch")

    def __str__(self):
        parts = [f"bc={self.bc}", f"bk={self.bk}", f"bw={self.bw}", f"batch={self.batch}"]
        if self.batch == "c":
            parts.append(f"cstep={self.cstep}")
        if self.fold:
            parts.append("fold")
        if self.rows > 1:
            parts.append(f"rows={self.rows}")
        if self.gather:
            parts.append("gather")
        if not self.prefetch:
            parts.append("no-prefetch")
        return " ".join(parts)


def _need(ok, message):
    if not ok:
        raise ValueError(message)


def _dtype_name(dtype):
    """tppasm's short name of any spelling of a dtype (np.float32, "float32", "bfloat16"), else ``dtype``
    as given, for the refusal to show."""
    try:
        return tpp.dtypes.name_of(dtype)
    except TypeError:
        return dtype


class ConvNest:
    """The loop-DSL convolution for ``shape``, ``dtype`` ("f32" or "bf16") and ``blocking``.

    Call it on the blocked input, weights and output (``output()`` allocates one), or ``run`` it on
    the arrays ``views`` made of them (what the bench times); ``lk`` is the :class:`loops.LoopKernel`
    (tune it with ``tune(...)``, inspect it with ``explain(...)``).
    """

    def __init__(self, shape, dtype="f32", blocking=Blocking(), spec="Acdebfg", pool=None, stream_out=None):
        sh, bl = shape, blocking
        _need(isinstance(sh, Conv), f"ConvNest: shape={sh!r}; expected a Conv, e.g. Conv(n=1, c=64, k=64, h=56, w=56)")
        _need(isinstance(bl, Blocking), f"ConvNest: blocking={bl!r}; expected a Blocking, e.g. Blocking(bc=64, bk=64)")
        dtype = _dtype_name(dtype)
        _need(dtype in ("f32", "bf16"), f"ConvNest: dtype={dtype!r}; expected 'f32' or 'bf16' (or np.float32, "
              "'float32', 'bfloat16')")
        _need(stream_out is None or isinstance(stream_out, (bool, np.bool_)),
              f"ConvNest: stream_out={stream_out!r}; expected None (stream large outputs), True or False, e.g. "
              "ConvNest(..., stream_out=True)")
        _need(sh.k % bl.bk == 0, f"bk={bl.bk} must divide K={sh.k}")
        _need(dtype == "f32" or bl.bc % 2 == 0 or bl.fold,
              f"bf16 pairs channels (VNNI2): bc={bl.bc} must be even" + (" (gather=True takes no fold)" if bl.gather
                                                                         else ", or fold=True (pairs over the S*bc "
                                                                         "values of a filter row)"))
        _need(not (bl.fold and bl.batch == "s"), "fold=True puts the filter columns in k: use batch='c' or 'r'")
        self.source_shape = sh
        if bl.gather:
            _need(sh.gatherable,
                  f"gather=True copies the pixels a strided 1x1 layer reads together; {sh} is not one: use "
                  "gather=False")
            _need(bl.batch == "c" and not bl.fold and bl.rows == 1,
                  "gather=True runs the gathered pixels as a flat 1x1 layer: use batch='c', fold=False, rows=1")
            sh = replace(sh, h=sh.p, w=sh.q, stride=1)
        self.shape, self.dtype, self.blocking = sh, dtype, bl
        self.cb, self.kb = -(-sh.c // bl.bc), sh.k // bl.bk
        self.hp, self.wp = sh.h + 2 * sh.pad, sh.wp
        # the GEMM geometry: a flat convolution's pixels form one row per image
        self.gp, self.gq = (1, sh.p * sh.q) if sh.flat else (sh.p, sh.q)
        self.gwp = sh.h * sh.w if sh.flat else self.wp
        bw = bl.bw or sh.q
        _need(self.gq % bw == 0, f"bw={bw} must divide the {self.gq} output pixels of a GEMM row")
        self.bw = bw
        self._check_rows()
        self.m = sh.spanned(bl.rows) if bl.rows > 1 else bw                # BRGEMM rows
        self.out_q = self.wp if bl.rows > 1 else sh.q                     # output columns kept
        cstep = (bl.cstep or self.cb) if bl.batch == "c" else 1
        _need(self.cb % cstep == 0, f"cstep={cstep} must divide the {self.cb} channel blocks")
        self.cstep = cstep
        self.count = {"c": cstep, "r": sh.r, "s": sh.s}[bl.batch]
        # reduction steps per output tile: channel-block, filter-row and filter-column iterations
        trips = (self.cb // cstep, 1 if bl.batch == "r" else sh.r, 1 if bl.batch == "s" or bl.fold else sh.s)
        self.single = trips == (1, 1, 1)
        self.needs_scratch = dtype == "bf16" and not self.single
        out_bytes = sh.n * sh.k * sh.p * sh.q * tpp.dtypes.dtype(dtype).itemsize
        big = out_bytes > caches()[-1].size // 4
        self.stream_out = self.single and (big if stream_out is None else bool(stream_out))
        if stream_out and not self.single:
            warnings.warn(f"ConvNest: stream_out=True has no effect on {sh} with {bl}: its reduction takes several "
                          "calls per output tile, which read their partial sums back, so the output is stored "
                          "through the caches (nest.stream_out is False)", UserWarning, stacklevel=2)
        self.edge_rows = self._edge_rows()
        self.scratch = None                               # allocated by the first views()
        self.gathered = self.source = None                # with gather: bound by views()
        self.gather = self._gather_nest(pool) if bl.gather else None
        self.lk = self._nest(spec, pool)

    def _check_rows(self):
        sh, bl = self.shape, self.blocking
        if bl.rows == 1:
            return
        what = f"rows={bl.rows} (output rows per BRGEMM through the padded width)"
        _need(sh.stride == 1 and not sh.flat, f"{what} needs stride 1 and a convolution that is not a flat 1x1 "
              "(a flat one spans output rows with bw instead); use rows=1")
        _need(bl.batch in ("c", "r"), f"{what} takes batch='c' or 'r', not {bl.batch!r}")
        _need(bl.bw in (0, sh.q), f"{what} takes whole output rows: bw=0, not {bl.bw}")
        _need(sh.p % bl.rows == 0, f"{what} must divide the {sh.p} output rows")
        _need(bl.hblock == 1 or bl.hblock % bl.rows == 0, f"hblock={bl.hblock} must be a multiple of rows={bl.rows}")

    def _edge_rows(self):
        """(output row, first, end) of the filter rows on the image, for the rows whose taps reach
        into the zero padding (rows with no tap on the image keep them all: they sum zeros); none
        with ``rows > 1``, whose BRGEMMs span several output rows."""
        sh = self.shape
        if self.blocking.rows > 1:
            return ()
        out = []
        for oh in range(sh.p):
            first = max(0, sh.pad - oh * sh.stride)
            end = min(sh.r, sh.pad + sh.h - oh * sh.stride)
            if (first, end) != (0, sh.r) and end > first:
                out.append((oh, first, end))
        return tuple(out)

    # -- arrays -------------------------------------------------------------------------------
    def input_shape(self):
        src = self.source_shape
        return (src.n, self.cb, src.h + 2 * src.pad, src.w + 2 * src.pad, self.blocking.bc)

    def weight_shape(self, folded=None):
        """The weights' blocked shape (:func:`tppasm.conv_layout.block_weights`); ``folded``: the
        filter columns merged into the channels, ``fold=True``'s layout, which an odd bf16 ``bc``
        needs (its VNNI2 pairs run over a filter row's S*bc values)."""
        sh, bl = self.shape, self.blocking
        if folded is None:
            folded = self.dtype == "bf16" and bl.bc % 2 == 1
        if folded:
            rows = sh.s * bl.bc
            if self.dtype == "bf16":
                return (self.kb, self.cb, sh.r, -(-rows // 2), bl.bk, 2)
            return (self.kb, self.cb, sh.r, rows, bl.bk)
        if self.dtype == "bf16":
            return (self.kb, self.cb, sh.r, sh.s, bl.bc // 2, bl.bk, 2)
        return (self.kb, self.cb, sh.r, sh.s, bl.bc, bl.bk)

    def output(self, dtype=None):
        """A new output array ``(N, K/bk, P, Q, bk)`` of the convolution's dtype (uninitialized,
        aligned); with ``rows > 1`` ``(N, K/bk, P, Wp, bk)``, whose last Wp - Q columns are scratch."""
        sh = self.shape
        return tpp.empty((sh.n, self.kb, sh.p, self.out_q, self.blocking.bk), dtype or self.dtype)

    def result(self, y):
        """The ``(N, K/bk, P, Q, bk)`` convolution in an output array ``y`` of :meth:`output`'s shape
        (a view without the scratch columns of ``rows > 1``).

        >>> nest = ConvNest(Conv(n=1, c=4, k=8, h=4, w=4, r=3, s=3, pad=1), "f32", Blocking(bc=4, bk=8, rows=2))
        >>> nest.output().shape, nest.result(nest.output()).shape
        ((1, 1, 4, 6, 8), (1, 1, 4, 4, 8))
        """
        return y[:, :, :, :self.shape.q]

    def views(self, x, w, y):
        """The arrays the nest reads: flat convolutions as one pixel row; ``batch="s"`` reads the
        input through a read-only view with an (s, column) pair of axes over the same memory;
        with ``gather``, the nest's copy of the pixels read (copied here, and again by each
        :meth:`run`); the fp32 scratch output last, when there is one."""
        sh, bl = self.shape, self.blocking
        if not type(x) is type(w) is type(y) is np.ndarray:       # torch tensors, DLPack objects: zero-copy views
            x, w, y = (as_ndarray(a, name, "conv", writes=name == "output")
                       for a, name in ((x, "input"), (w, "weights"), (y, "output")))
        w_shapes = {self.weight_shape()} | ({self.weight_shape(folded=True)} if bl.fold else set())
        for name, arr, want in (("input", x, {self.input_shape()}), ("weights", w, w_shapes),
                                ("output", y, {(sh.n, self.kb, sh.p, self.out_q, bl.bk)})):
            shapes = " or ".join(map(str, sorted(want)))
            if arr.shape not in want:
                raise ValueError(f"conv: {name} must be a C-contiguous array of shape {shapes}, got {arr.shape}")
            if not arr.flags.c_contiguous:
                raise ValueError(f"conv: {name} of shape {arr.shape} is not C-contiguous; pass np.ascontiguousarray"
                                 "(...) (a torch tensor: .contiguous()), or make it with tppasm.conv_layout")
        if self.needs_scratch and self.scratch is None:
            self.scratch = self.output("f32")
        if self.gather is not None:
            if self.gathered is None:
                self.gathered = tpp.empty((sh.n, self.cb, sh.h, sh.w, bl.bc), self.dtype)
            self.source = x
            self.gather(x, self.gathered)
            x = self.gathered
        acc = (self.scratch,) if self.needs_scratch else ()
        if sh.flat:
            x = x.reshape(sh.n, self.cb, 1, sh.h * sh.w, bl.bc)
            y = y.reshape(sh.n, self.kb, 1, sh.p * sh.q, bl.bk)
            acc = tuple(a.reshape(y.shape) for a in acc)
        st = x.strides
        if bl.rows > 1:          # (n, cb, r, padded pixel, k): pixel p of filter row r at p + r*Wp
            k = (sh.s if bl.fold else 1) * bl.bc
            pixels = sh.p * self.wp - (sh.s - 1 if bl.fold else 0)
            x = np.lib.stride_tricks.as_strided(x, (sh.n, self.cb, sh.r, pixels, k), st, writeable=False)
            w = w.reshape(self.weight_shape(folded=True)) if bl.fold else w
            y = y.reshape(sh.n, self.kb, sh.p * self.wp, bl.bk)
            acc = tuple(a.reshape(y.shape) for a in acc)
        elif bl.batch == "s":
            x = np.lib.stride_tricks.as_strided(
                x, (sh.n, self.cb, x.shape[2], sh.s, self.gwp - sh.s + 1, bl.bc),
                (st[0], st[1], st[2], st[3], st[3], st[4]), writeable=False)
        elif bl.fold:
            x = np.lib.stride_tricks.as_strided(
                x, (sh.n, self.cb, x.shape[2], self.gwp - sh.s + 1, sh.s * bl.bc), st, writeable=False)
            w = w.reshape(self.weight_shape(folded=True))
        return (x, w, y) + acc

    def __call__(self, x, w, y):
        """The convolution of blocked ``x`` and ``w`` into ``y``: NumPy arrays, or torch tensors (bf16
        too) and DLPack objects, read and written in place through zero-copy views."""
        self.lk(*self.views(x, w, y))
        if type(y) is not np.ndarray:
            mark_written([y])

    def run(self, *views):
        """The convolution on :meth:`views`' arrays; with ``gather``, the pixels are copied again
        from the input that ``views`` was given (the loop kernel ``lk`` alone reads the copy)."""
        if self.gather is not None:
            self.gather(self.source, self.gathered)
        self.lk(*views)

    def _gather_nest(self, pool):
        """The nest that copies the pixels a strided 1x1 layer reads, ``(N, C/bc, H, W, bc)`` ->
        ``(N, C/bc, P, Q, bc)``: one copy TPP per output row (Q pixels ``stride*bc`` apart)."""
        st, q, bc = self.source_shape.stride, self.shape.w, self.blocking.bc
        copy = tpp.copy(q, bc, ldx=st * bc, dtype=self.dtype, out_dtype=self.dtype)

        def gather(n, cb, oh, X, G):
            copy(X[n, cb, oh * st, 0:(q - 1) * st + 1:st], G[n, cb, oh])
        return kernel("ABc", Loop(0, self.shape.n), Loop(0, self.cb), Loop(0, self.shape.h), pool=pool)(gather)

    # -- the nest -----------------------------------------------------------------------------
    def _nest(self, spec, pool):
        sh, bl, dt = self.shape, self.blocking, self.dtype
        bw, st, count, cs = self.bw, sh.stride, self.count, self.cstep
        span = (bw - 1) * st + 1                          # input columns under bw output pixels
        fold, rows, m, wp = bl.fold, bl.rows, self.m, self.wp
        args = dict(m=m, n=bl.bk, k=bl.bc * (sh.s if fold else 1), dtype=dt, lda=st * bl.bc, ldb=bl.bk, ldc=bl.bk,
                    prefetch=bl.prefetch)
        w_row = int(np.prod(self.weight_shape(folded=True)[3:]))       # a filter row's weights (VNNI-padded)
        strides = {"c": (self.hp * self.wp * bl.bc, sh.r * w_row),
                   "r": (self.gwp * bl.bc, w_row),
                   "s": (bl.bc, bl.bc * bl.bk)}[bl.batch]
        out = dt if self.single else "f32"
        first = tpp.brgemm(**args, stride_a=strides[0], stride_b=strides[1], beta=0, c_dtype=out,
                           stream_c=self.stream_out)
        more = tpp.brgemm(**args, stride_a=strides[0], stride_b=strides[1], beta=1)
        to_bf16 = tpp.copy(m, bl.bk, out_dtype="bf16") if self.needs_scratch else None
        batch = bl.batch
        steps = {"c": (cs, 1, sh.s if fold else 1), "r": (1, sh.r, sh.s if fold else 1), "s": (1, 1, sh.s)}[batch]
        last = (self.cb - cs, sh.r - steps[1], sh.s - steps[2])

        edges, single = self.edge_rows, self.single
        r_last = last[1] if batch == "r" else None

        def taps(oh):
            """(first, end) of the filter rows over the image for output row ``oh``."""
            for row, first_r, end_r in edges:           # a traced branch per edge row
                if oh == row:
                    return first_r, end_r
            return 0, sh.r

        def operands(n, cb, kb, oh, ow, r, s, lo, hi, X, W):
            """(A blocks, B blocks, count) of one BRGEMM."""
            if rows > 1:                                # X: (n, cb, r, padded pixel, k)
                p = oh * wp + s
                if batch == "c":
                    return X[n, cb:cb + cs, r, p:p + m], W[kb, cb:cb + cs, r] if fold else W[kb, cb:cb + cs, r, s], count
                return X[n, cb, lo:hi, p:p + m], W[kb, cb, lo:hi] if fold else W[kb, cb, lo:hi, s], hi - lo
            if batch == "c":
                a = X[n, cb:cb + cs, oh * st + r, ow * st + s:ow * st + s + span:st]
                b = W[kb, cb:cb + cs, r] if fold else W[kb, cb:cb + cs, r, s]
                return a, b, count
            if batch == "r":
                a = X[n, cb, oh * st + lo:oh * st + hi, ow * st + s:ow * st + s + span:st]
                b = W[kb, cb, lo:hi] if fold else W[kb, cb, lo:hi, s]
                return a, b, hi - lo
            a = X[n, cb, oh * st + r, 0:sh.s, ow * st:ow * st + span:st]
            b = W[kb, cb, r, 0:sh.s]
            return a, b, count

        def step(n, cb, kb, oh, ow, r, s, X, W, C):
            """One reduction step into C, and the filter row of the tile's last step; None where
            filter row r lies on the padding (no call). A tile's first and last steps are at the
            first and last filter rows over the image (with batch="r" its batch covers them)."""
            lo, hi = taps(oh)
            r_first = 0 if batch == "r" else lo
            if batch != "r" and (r < lo or r >= hi):
                return None
            a, b, n_blocks = operands(n, cb, kb, oh, ow, r, s, lo, hi, X, W)
            if single or (cb == 0 and r == r_first and s == 0):
                first(a, b, C, count=n_blocks)
            else:
                more(a, b, C, count=n_blocks)
            return hi - 1 if r_last is None else r_last

        def tile(Y, n, kb, oh, ow):
            """The output tile of one BRGEMM (Y flat over the padded pixels with rows > 1)."""
            return Y[n, kb, oh * wp:oh * wp + m] if rows > 1 else Y[n, kb, oh, ow:ow + bw]

        def conv(n, cb, kb, oh, ow, r, s, X, W, Y):
            step(n, cb, kb, oh, ow, r, s, X, W, tile(Y, n, kb, oh, ow))

        def conv_bf16(n, cb, kb, oh, ow, r, s, X, W, Y, Acc):
            r_end = step(n, cb, kb, oh, ow, r, s, X, W, tile(Acc, n, kb, oh, ow))
            if r_end is not None and cb == last[0] and r == r_end and s == last[2]:
                to_bf16(tile(Acc, n, kb, oh, ow), tile(Y, n, kb, oh, ow))

        loops = (Loop(0, sh.n),
                 Loop(0, self.cb, steps[0], parallel=False),
                 Loop(0, self.kb, blocks=[bl.kblock] if bl.kblock > 1 else []),
                 Loop(0, self.gp, rows, blocks=[bl.hblock] if bl.hblock > 1 else []),
                 Loop(0, self.gq, bw),
                 Loop(0, sh.r, steps[1], parallel=False),
                 Loop(0, sh.s, steps[2], parallel=False))
        return kernel(spec, *loops, pool=pool)(conv if to_bf16 is None else conv_bf16)
