"""A fully connected layer from TPPs, forward and backward, on NumPy arrays.

The layout is ``torch.nn.Linear``'s: x is (N, K) rows, the weight w is (M, K) (out_features,
in_features), the bias b has M values, and

    z = x @ w.T + b,  y = act(z),  act in None, "relu", "gelu" (tanh form), "gelu_erf",
    "gelu_erf_fast" (gelu_erf to an absolute 2^-22 max(1, |z|), torch's own GELU's class; its
    backward is gelu_erf's).

The forward transposes w (and packs it to VNNI2 for bf16) in panels of 64 of its rows, each used
at once by BRGEMMs over runs of x's rows with bias + relu fused in their epilogue
(:class:`PanelGemm`; one panel where w fits in a core's L2; :mod:`tppasm.fc_panels`). Where x has fewer elements than w
and few rows (:func:`transposed`), it computes ``(w @ x.T).T`` and moves x and y instead of w; for up to
:data:`DOT_ROWS` rows (:func:`dots`: a decoder's next token) it takes the dot products of x's rows
with w's as stored (:mod:`tppasm.fc_dots`, :func:`tppasm.gemm_nt`), streaming w once at the speed of
memory (on Zen 4, 1 thread, 8 rows against a 4096 x 4096 weight: 4.5 ms in fp32 against 7.7 for
panels and 12.1 transposed; 1 row: 3.0 against 5.8 and 14.6), and so it does for few out features
(:func:`few_columns`: 512 x 1024 -> 3 fp32 0.039 ms against 0.38 for panels), and for mid-size fp32 weights
that are not packed (:func:`mid_dots`: 64 x 256 -> 64 23 us against 28). The gelus run as a unary TPP on z,
which the backward needs (or, with ``pre=False``, fused as relu is). The backward is
``dz = dy * act'(z)`` (the relu_bwd / gelu_bwd TPPs), ``dx = dz @ w`` and ``dw = dz.T @ x``
(panel GEMMs again, over columns of w and x, copied or VNNI2-packed a panel at a time; for a few
bf16 rows dx packs w a strip of whole rows at a time instead, :class:`StripGemm`; dz transposed by
the transpose TPP), ``db = sum of dz over rows`` (a reduce TPP, fp32). Arrays are float32 or ml_dtypes.bfloat16
(the bias float32 or x's dtype); bf16 products accumulate in fp32 (denormals may count as zero, as in BRGEMM).

>>> import numpy as np
>>> x = np.array([[1, 2]], np.float32); w = np.array([[1, 1], [1, -1]], np.float32)
>>> y, z = forward(x, w, np.array([0.5, 0.5], np.float32), "relu"); y.tolist()
[[3.5, 0.0]]
>>> dx, dw, db = backward(np.ones((1, 2), np.float32), x, w, "relu", y); dx.tolist(), db.tolist()
([[1.0, 1.0]], [1.0, 0.0])
"""
import functools

import numpy as np

from isa.cpu import caches

from .brgemm import brgemm
from .dtypes import dtype as numpy_dtype
from .eltwise import GRAD_OPS, UNARY_OPS, binary, reduce, transform, unary
from .fc_args import DTYPES  # noqa: F401  (fc.DTYPES: the dtypes a layer takes)
from .fc_args import (DTYPE_NAMES, GRADIENT_CHOICES, bias_of, dense_rows, describe, dtype_of, fail, output,
                      refuse_overlap, thread_count)
from .fc_dots import (DOT_ROWS, DotGemm, dot_kernels, dots, few_columns, forward_dots,  # noqa: F401  (fc.dots)
                      mid_dots)
from .fc_operands import PackedWeight, TransposedB, k_blocks
from .fc_parallel import parallel_kernels as _parallel_kernels
from .fc_calls import Replays
from .fc_panels import (PANEL, PANEL_K, RowGemm, batch_depth, block_runs, packed_panel, packed_stride,
                        panel_stride)
from .fc_parallel import COLUMN_SPLIT_ROWS, panel_shares, part_flops, row_blocks, split
from .fc_strips import StripGemm
from .layout import empty

ACTS = (None, "relu", "gelu", "gelu_erf", "gelu_erf_fast")
GELUS = ("gelu", "gelu_erf", "gelu_erf_fast")            # the activations whose backward reads z
GRADIENTS = {None: None, "relu": "relu_bwd", "gelu": "gelu_bwd", "gelu_erf": "gelu_erf_bwd",
             "gelu_erf_fast": "gelu_erf_bwd"}            # act -> the unary TPP of dz = dy * act'(z)


def forward(x, w, bias=None, act=None, out=None, pre=None, threads=1):
    """``(y, z)``: ``y = act(x @ w.T + bias)`` and, for the gelus, ``z`` the pre-activation the
    backward needs (None otherwise). ``out`` / ``pre`` receive y / z when given (else allocated):
    writable C-contiguous arrays of y's shape and x's dtype (``pre`` only with a gelu), sharing no
    memory with the inputs or each other (else :class:`tppasm.operand.OperandError`); ``w`` may be
    its :func:`pack` instead.
    ``pre=False`` (inference: no backward will read z) fuses a gelu into the GEMM's epilogue, or into
    the bias add, instead of writing z and running the activation as a pass of its own; z is then
    None, and a bf16 y is rounded once, from the fp32 sums (``pre=True``: None's; NumPy's bools too). ``threads``
    (an int >= 1): up to this many parts of the GEMM (see :class:`RowGemm`), run on the process's
    native pool (:func:`isa.pool.get_pool`: ``TPPASM_NUM_THREADS`` threads, the caller included).

    >>> import numpy as np
    >>> y, z = forward(np.ones((2, 3), np.float32), np.ones((4, 3), np.float32), act="gelu")
    >>> y.shape, z.shape
    ((2, 4), (2, 4))
    >>> y2, z2 = forward(np.ones((2, 3), np.float32), np.ones((4, 3), np.float32), act="gelu", pre=False)
    >>> bool(np.allclose(y2, y, rtol=1e-6)), z2
    (True, None)
    """
    packed = w if isinstance(w, PackedWeight) else None
    x, w = dense_rows("forward", "x", x), w.w if packed else dense_rows("forward", "w", w)
    dtype_of("forward", ("w",) if packed else (), x=x, w=w)
    (n, k), m = x.shape, w.shape[0]
    if w.shape != (m, k):
        fail("forward", f"w has shape {w.shape}; expected (out_features, {k}) for x of shape {x.shape}")
    bias = bias_of("forward", bias, m, x)
    if act not in ACTS:
        fail("forward", f"act={act!r}; expected one of {ACTS}")
    if type(threads) is not int or threads < 1:
        threads = thread_count("forward", threads)
    y = empty((n, m), x.dtype) if out is None else output("forward", "out", out, (n, m), x.dtype)
    pre = bool(pre) if isinstance(pre, np.bool_) else pre
    keep = pre is not False and act in GELUS
    if not keep and pre is not None and pre is not False:
        fail("forward", f"pre is given with act={act!r}, which has no pre-activation to write (only the gelus "
                        "keep z for the backward); pass pre=None")
    into = pre if keep and pre is not True else None                 # an array to write z into
    z = (empty((n, m), x.dtype) if into is None else output("forward", "pre", into, (n, m), x.dtype)) if keep else None
    given = [(name, a) for name, a in (("out", out), ("pre", into)) if a is not None]
    if given:
        refuse_overlap("forward", given, (("x", x), ("w", w), ("bias", bias)))
    return forward_arrays(x, packed or w, bias, act, y, z, threads)


def forward_arrays(x, w, bias, act, y, z, threads):
    """``(y, z)`` of :func:`forward`, written into ``y`` and ``z`` (None: the gelu, if any, fused),
    for arguments it has checked: x (n, k) and w (m, k) (or its :class:`PackedWeight`) C-contiguous
    in one of :data:`DTYPES`, ``bias`` a float32 (m,) array or None, ``y`` and ``z`` writable
    C-contiguous (n, m) arrays of x's dtype sharing no memory with the others, ``threads`` an int
    >= 1. The torch layer, which checks its tensors itself, calls this (a checked call of a small
    layer costs several microseconds more).

    >>> import numpy as np
    >>> y = np.empty((1, 2), np.float32)
    >>> forward_arrays(np.ones((1, 3), np.float32), np.ones((2, 3), np.float32), None, "relu", y, None, 1)[0]
    array([[3., 3.]], dtype=float32)
    """
    packed, raw = (w, w.w) if isinstance(w, PackedWeight) else (None, w)
    (n, k), m = x.shape, y.shape[1]
    if min(n, m, k) == 0:
        acc = np.zeros((n, m), np.float64) + (0 if bias is None else bias.astype(np.float64))
        if z is not None:
            z[...] = acc.astype(np.float32).astype(x.dtype)
        y[...] = _act_ref(act, acc).astype(np.float32).astype(x.dtype)
        return y, z
    plan = _forward_plan(n, m, k, DTYPE_NAMES[x.dtype], bias is not None, act, threads, z is not None,
                         packed is not None)
    if plan.path == "dots":
        forward_dots(plan, x, raw, bias, y if z is None else z)
    elif plan.path == "transposed":
        _forward_transposed(plan, x, raw, bias, y if z is None else z)
    else:
        plan.gemm(x, w, y if z is None else z, bias)
    if z is not None:
        plan.act(z, y)
    return y, z


def pack(w):
    """``w`` (m, k), a float32 or bfloat16 array, packed once for :func:`forward` (a
    :class:`PackedWeight`), which then skips the per-call packing (or the transposes that avoid it):
    on Zen 4, 1 thread, bf16 64 x 512 -> 512 and 127 x 384 -> 1536 1.18-1.2x, fp32 1.05-1.1x. A few
    rows (:data:`PACKED_DOT_ROWS`, or :data:`DOT_ROWS` against more than :data:`PACKED_DOTS_BYTES`)
    still stream w as stored, so w must not change while its packing is in use (pack it again).

    >>> import numpy as np
    >>> w = np.ones((4, 3), np.float32); p = pack(w)
    >>> (forward(np.ones((2, 3), np.float32), p)[0] == forward(np.ones((2, 3), np.float32), w)[0]).all()
    np.True_
    """
    w = dense_rows("pack", "w", w)
    dt, panels = dtype_of("pack", w=w), {}
    if min(w.shape):                                # (an empty product never reads panels)
        gemm = PanelGemm(1, *w.shape, dt, panel=packed_panel_width(*w.shape, dt))
        for c0, c1 in gemm.panels:
            rooms = {}                                  # each panel into room of its own, kept whole
            _parallel_kernels([gemm._pack_calls(w, c0, c1, rooms)[0]])
            panels[c0, c1] = gemm.packs[c1 - c0].room(rooms[c1 - c0])
    return PackedWeight(w, dt, panels)


# Zen 4, 1 thread, dots / packed: 1024^2 bf16 8, 16, 32 rows 0.88, 0.97, 1.05; 4096^2 1, 8, 32 rows 0.83, 0.67, 0.93
PACKED_DOT_ROWS, PACKED_DOTS_BYTES = 16, 8 << 20


def packed_panel_width(m, k, dtype):
    """Columns of y per panel of a :func:`pack`: as :func:`panel_width`, but where that cuts w into
    panels, as many multiples of :data:`PANEL` as keep a panel within :data:`PACKED_PANEL_BYTES`
    (fewer kernel calls; nothing to pack per call). Zen 4, us, packed panels of 64 / 128 / 256 columns:
    bf16 127 x 384 -> 1536 1 thread 700 / 679 / 668, 2 threads 548 / 444 / 394; bf16 64 x 1024 -> 4096
    2 threads 1865 / 1567 / 1430; fp32 1024^3 1 thread 18973 / 20740 / 20588 (a 256 KiB panel at 64).

    >>> packed_panel_width(1536, 384, "bf16"), packed_panel_width(1024, 1024, "f32"), packed_panel_width(64, 64, "f32")
    (320, 64, 64)
    """
    width = panel_width(m, k, dtype)
    if width == m:
        return m
    return max(PANEL, PACKED_PANEL_BYTES // (k * (2 if dtype == "bf16" else 4)) // PANEL * PANEL)


PACKED_PANEL_BYTES = 256 << 10


def transposed(n, m, k, dtype="f32"):
    """Whether :func:`forward` computes ``(w @ x.T).T`` rather than ``x @ w.T``: when x and y (n rows)
    hold fewer elements than w, so that moving them costs less than transposing (and for bf16
    packing) the weight on every call. A few rows against a large weight (a decoder's next token)
    then stream w once, as the BRGEMM's A, instead of copying it first. Not from
    :data:`TRANSPOSED_ROWS` rows on, nor for an x of more than :data:`TRANSPOSED_X_BYTES` (its
    packing is the BRGEMM's B, read again for each block of w's rows), where the panels are faster.

    >>> transposed(8, 4096, 4096), transposed(1024, 1024, 1024), transposed(256, 4096, 4096)
    (True, False, False)
    """
    return (n * (k + m) < m * k and n < TRANSPOSED_ROWS
            and n * k * (2 if dtype == "bf16" else 4) <= TRANSPOSED_X_BYTES)


# Zen 4, 1 thread, ms of the transposed forward / the panels (P/T): fp32 256 x 4096 -> 4096 111 / 80, bf16
# 48 / 39; 256 x 768 -> 3072 13.4 / 11.4 (bf16 6.1 / 5.8); 256 x 2048 -> 8192 98 / 79; 256 x 1024 -> 1024
# 5.04 / 4.92; 128 x 4096 -> 4096 (x 2 MiB) 46.8 / 42.5; against 64 x 4096 -> 4096 (x 1 MiB) 19.6 / 23.5,
# 96 x 4096 -> 4096 32.0 / 33.4, 127 x 384 -> 1536 1.46 / 2.09, 96 x 768 -> 3072 4.3 / 4.8; from 160 to
# 192 rows the two are within 4% either way.
TRANSPOSED_ROWS = 192
TRANSPOSED_X_BYTES = 3 << 19


def _forward_transposed(plan, x, w, bias, out):
    """``out = x @ w.T + bias`` (then relu, where fused) as the transpose of ``w @ x.T``: x.T (for
    bf16 its VNNI2 packing, which is the transpose of x's bf16 pairs read as 32-bit words) is B,
    w itself A; the fp32 product is transposed back, and the bias add rounds it once to out. Each
    thread does all three for its block of w's rows (out's columns), or for a small out the caller
    does the last two after the threads' products (:data:`SHARED_POST`)."""
    (n, m), bias = out.shape, plan.zero_bias if bias is None else bias
    yt, y32, xt = empty((m, n), np.float32), empty((n, m), np.float32), plan.pack_x(x)

    def jobs():
        jobs = []
        for products, (lo, hi) in zip(plan.gemm.calls(w, xt, yt), plan.gemm.blocks):
            back = functools.partial(plan.transpose_y[hi - lo], yt[lo:hi], y32[:, lo:hi])
            add = functools.partial(plan.add_bias[hi - lo], y32[:, lo:hi], bias[lo:hi], out[:, lo:hi])
            jobs.append(products + [back, add])
        return jobs
    operands = (w, xt, yt, y32, bias, out)          # (the calls replayed: fc_calls)
    if n * m <= SHARED_POST:
        plan.replays[0].run(operands, lambda: [job[:-2] for job in jobs()])
        plan.replays[1].run(operands, lambda: [[call for job in jobs() for call in job[-2:]]])
    else:
        plan.replays[0].run(operands, jobs)


# Up to this many elements of out, the caller transposes back and adds the bias after the products
# (Zen 4, 2 threads, time against each thread doing its own: 64 x 512 -> 512 0.88-0.92 fp32, 0.85-0.89
# bf16; 64 x 1024 -> 1024 0.93-0.95; but 127 x 384 -> 1536 1.02-1.04, 200 x 1024 -> 4096 1.05-1.09).
SHARED_POST = 1 << 16


def backward(dy, x, w, act=None, saved=None, dx=True, dw=True, db=True, threads=1):
    """``(dx, dw, db)`` of :func:`forward` for the output gradient ``dy`` (N, M); ``saved`` is y
    for relu, z for the gelus, None without an activation. Each of ``dx``/``dw``/``db`` is True
    (compute it), False (skip it: None is returned; NumPy's bools too) or a writable C-contiguous array to write it
    into (dx and dw in x's dtype, db float32), sharing no memory with the inputs or each other
    (else :class:`tppasm.operand.OperandError`).
    ``threads`` as for :func:`forward`; ``w`` may be its :func:`pack` (its weight as stored is read).

    >>> import numpy as np
    >>> x = np.ones((3, 2), np.float32); w = np.ones((4, 2), np.float32)
    >>> dx, dw, db = backward(np.ones((3, 4), np.float32), x, w, dx=False)
    >>> dx, dw.tolist()[0], db.tolist()
    (None, [3.0, 3.0], [3.0, 3.0, 3.0, 3.0])
    """
    w = w.w if isinstance(w, PackedWeight) else w
    dy, x, w = dense_rows("backward", "dy", dy), dense_rows("backward", "x", x), dense_rows("backward", "w", w)
    dt = dtype_of("backward", dy=dy, x=x, w=w)
    (n, k), m = x.shape, w.shape[0]
    if w.shape != (m, k):
        fail("backward", f"w has shape {w.shape}; expected (out_features, {k}) for x of shape {x.shape}")
    if dy.shape != (n, m):
        fail("backward", f"dy has shape {dy.shape}; expected {(n, m)}")
    if act not in ACTS:
        fail("backward", f"act={act!r}; expected one of {ACTS}")
    if saved is not None:
        saved = dense_rows("backward", "saved", saved)
    if (saved is None) != (act is None) or (saved is not None and saved.shape != (n, m)):
        fail("backward", f"saved must be y (relu) or z (gelu) of shape {(n, m)}, or None when act is None; got "
                         f"{describe(saved)} with act={act!r}")
    if saved is not None and saved.dtype != x.dtype:
        fail("backward", f"saved has dtype {saved.dtype}, x {x.dtype}; pass the y or z the forward returned, or "
                         "saved.astype(x.dtype)")
    if type(threads) is not int or threads < 1:
        threads = thread_count("backward", threads)
    wanted = {"dx": ((n, k), dt), "dw": ((m, k), dt), "db": ((m,), "f32")}      # shape and dtype of each
    outs = {name: bool(out) if isinstance(out, (bool, np.bool_))
            else output("backward", name, out, *wanted[name], GRADIENT_CHOICES)
            for name, out in (("dx", dx), ("dw", dw), ("db", db))}
    given = [(name, a) for name, a in outs.items() if a is not True and a is not False]
    if given:
        refuse_overlap("backward", given, (("dy", dy), ("x", x), ("w", w), ("saved", saved)))
    return backward_arrays(dy, x, w, act, saved, *outs.values(), threads)


def backward_arrays(dy, x, w, act, saved, dx, dw, db, threads):
    """``(dx, dw, db)`` of :func:`backward` for arguments it has checked: dy (n, m), x (n, k), w
    (m, k) and ``saved`` (n, m) (None without an activation) C-contiguous in one of :data:`DTYPES`;
    ``dx``, ``dw``, ``db`` each True (allocated), False (None) or an array to write (as
    :func:`backward` takes them), ``threads`` an int >= 1. For callers that check their operands
    themselves, as :func:`forward_arrays`.

    >>> import numpy as np
    >>> g = backward_arrays(np.ones((1, 2), np.float32), np.ones((1, 3), np.float32), np.ones((2, 3), np.float32),
    ...                     None, None, True, False, True, 1)
    >>> g[0].tolist(), g[1], g[2].tolist()
    ([[2.0, 2.0, 2.0]], None, [1.0, 1.0])
    """
    (n, k), m, dt = x.shape, w.shape[0], DTYPE_NAMES[x.dtype]
    dx, dw, db = (empty(shape, dtype) if a is True else None if a is False else a
                  for a, shape, dtype in ((dx, (n, k), dt), (dw, (m, k), dt), (db, (m,), "f32")))
    if min(n, m, k) == 0:                     # nothing to multiply: NumPy does the rest
        dz = dy.astype(np.float64)
        if act is not None:
            dz = dz * GRAD_OPS[GRADIENTS[act]](saved.astype(np.float64))
        for out, value in ((dx, 0), (dw, 0), (db, dz.sum(0))):
            if out is not None:
                out[...] = np.asarray(value).astype(np.float32).astype(out.dtype)
        return dx, dw, db
    plan = _backward_plan(n, m, k, dt, act, threads)
    dz = dy
    if act is not None:
        dz = empty((n, m), dt)
        plan.act_grad(dy, saved, dz)
    if dx is not None:
        plan.dx(dz, w, dx)
    if dw is not None:
        dzt = empty((m, n), dt)
        plan.transpose_dz(dz, dzt)
        plan.dw(dzt, x, dw)
    if db is not None:
        plan.db(dz, db)
    return dx, dw, db


class PanelGemm:
    """``C = A @ W.T`` (+ bias, activation) for A (rows, k) and a weight W (m, k) in
    ``torch.nn.Linear``'s layout, or with ``b_layout="km"`` ``C = A @ B`` for B (k, m). B is
    packed in panels of ``panel`` of its columns (default :func:`panel_width`) into contiguous
    (k x panel) blocks (for bf16 VNNI2: from W, the transpose of its bf16 pairs read as 32-bit
    words; from B, the vnni2 transform) whose rows lie :func:`~tppasm.fc_panels.panel_stride` apart,
    each used at once by BRGEMMs over A's rows (in runs, :func:`~tppasm.fc_panels.panel_rows`), over k
    in batch blocks of :data:`PANEL_K` where they divide k. Threads (up to
    ``threads``, each at least ``min_flops`` of work as in :func:`row_blocks`) take runs of panels,
    each packing its own; a weight of one panel is cut into a panel per thread for up to
    :data:`COLUMN_SPLIT_ROWS` rows of A, else packed first and its rows shared instead. On Zen
    4, 1 thread, packing included: 1024^3 fp32 110 GFLOP/s against 101 for one BRGEMM over the
    whole transposed W, 4096 x 768 -> 3072 111 against 82; bf16 220 / 224 against 163 / 177.

    >>> import numpy as np
    >>> g = PanelGemm(3, 70, 5, panel=64)
    >>> [hi - lo for lo, hi in g.panels]
    [64, 6]
    >>> c = np.empty((3, 70), np.float32); g(np.ones((3, 5), np.float32), np.ones((70, 5), np.float32), c)
    >>> float(c.min()), float(c.max())
    (5.0, 5.0)
    """

    def __init__(self, rows, m, k, dtype="f32", threads=1, min_flops=None, panel=None, b_layout="w", **options):
        self.rows, self.m, self.k, self.dtype, self.b_layout = rows, m, k, dtype, b_layout
        self.pairs, self.np_dtype = dtype == "bf16", numpy_dtype(dtype)
        self.words = -(-k // 2) if self.pairs else k
        min_flops = part_flops(dtype) if min_flops is None else min_flops
        # fp32 B (k, m) for a few rows: read in place, its columns split among the threads; a panel
        # copy would be used by those rows only
        self.in_place = b_layout == "km" and not self.pairs and rows <= DOT_ROWS
        if self.in_place:
            panel = -(-m // len(split(m, 2 * rows * m * k, threads, min_flops)))
        if not panel and b_layout == "w" and panel_width(m, k, dtype) == m and rows <= COLUMN_SPLIT_ROWS:
            # one panel for several threads: each packs and multiplies its own columns
            parts = len(row_blocks(rows, m, k, threads, min_flops))
            panel = -(-m // parts // 16) * 16 if parts > 1 else None
        panel = panel or panel_width(m, k, dtype)
        self.panels = [(lo, min(lo + panel, m)) for lo in range(0, m, panel)]
        self.bk = batch_depth(k)
        if len(self.panels) > 1:                          # threads take runs of panels, all rows
            groups = split(len(self.panels), 2 * rows * m * k, threads, min_flops)
            self.groups, self.blocks = panel_shares(self.panels, rows, len(groups)), [(0, rows)]
        else:                                             # one panel, packed first; threads take rows
            self.groups, self.blocks = None, row_blocks(rows, m, k, threads, min_flops)
        widths = {hi - lo for lo, hi in self.panels}
        # the packed panels' row strides (32-bit words): :func:`panel_stride`'s, but B's bf16 vnni2 packing
        # is contiguous
        self.lds = {w: m if self.in_place else packed_stride(w, k, dtype) if b_layout == "w"
                    else w if self.pairs else panel_stride(w) for w in widths}
        if self.in_place:
            self.packs = None
        elif b_layout == "w":
            self.packs = {w: TransposedB(w, k, dtype, self.lds[w]) for w in widths}
        elif self.pairs:
            self.packs = {w: transform("vnni2", k, w, ldx=m, dtype=dtype) for w in widths}
        else:
            self.packs = {w: unary("copy", k, w, ldx=m, ldo=self.lds[w], dtype=dtype) for w in widths}
        # each block's rows, call by call: in runs where k comes in several batch blocks
        self.runs = block_runs(self.blocks, self.k > self.bk)
        # (threads' shares of panels: their pieces' rows in runs likewise)
        self.piece_runs = {(lo, hi): block_runs([(lo, hi)], self.k > self.bk)[0]
                           for lo, hi in {piece[2:] for group in self.groups or () for piece in group}}
        heights = {hi - lo for run in self.runs + list(self.piece_runs.values()) for lo, hi in run}
        self.kernels = {(h, w): brgemm(h, w, self.bk, dtype, c_dtype=dtype, lda=k, ldb=self.lds[w], ldc=m,
                                       stride_a=self.bk, **options) for h in heights for w in widths}
        self.replays = Replays()

    def _pack_calls(self, b, c0, c1, buffers):
        """(calls, panel): the kernel calls that pack columns c0..c1 of B into a (k, width) panel,
        (ceil(k/2), width, 2) for bf16, and that panel. ``b``: W (its rows c0..c1 are transposed),
        W's :class:`PackedWeight` (no calls), or B itself; ``buffers`` (a dict by width) keeps the
        room a panel of each width takes."""
        width = c1 - c0
        if isinstance(b, PackedWeight):
            return [], packed_panel(b, c0, c1)
        if self.in_place:
            return [], b[:, c0:c1]
        if width not in buffers:
            buffers[width] = self._room(width)
        room = buffers[width]
        if self.b_layout == "w":
            return self.packs[width].calls(b[c0:c1], room), self.packs[width].packed(room)
        panel = room if self.pairs else room[:, :width]
        return [functools.partial(self.packs[width], b[:, c0:c1], panel)], panel

    def _room(self, width):
        """New room for a packed panel ``width`` columns wide (with W: the arrays TransposedB takes)."""
        if self.b_layout == "w":
            return self.packs[width].buffers()
        return empty((self.words, width, 2) if self.pairs else (self.k, self.lds[width]), self.np_dtype)

    def _rooms(self, b, group):
        """The rooms a thread packs its panels ``group`` of ``b`` into (a dict by width, as
        :meth:`_pack_calls` takes it), and their arrays: none for a PackedWeight, or B read in place."""
        if isinstance(b, PackedWeight) or self.in_place:
            return {}, ()
        rooms = {w: self._room(w) for w in {piece[1] - piece[0] for piece in group}}
        return rooms, tuple(a for room in rooms.values() for a in (room if type(room) is tuple else (room,))
                            if a is not None)

    def _batch(self, a, lo, hi):
        """Rows lo..hi of A as the BRGEMM's batch of k blocks."""
        return k_blocks(a[lo:hi], self.bk, self.k // self.bk)

    def _call(self, batch, panel, c, bias, lo, hi, c0, c1):
        """The BRGEMM of rows lo..hi and columns c0..c1 as a call of no arguments."""
        extra = () if bias is None else (bias[c0:c1],)
        return functools.partial(self.kernels[hi - lo, c1 - c0], batch,
                                 panel.reshape((len(batch), -1) + panel.shape[1:]), c[lo:hi, c0:c1], *extra,
                                 count=len(batch))

    def _group_calls(self, a, b, c, bias, group, buffers):
        """The kernel calls of one thread's share of panels (pieces (c0, c1, lo, hi):
        :func:`~tppasm.fc_parallel.panel_shares`): each panel packed (into ``buffers``, the
        thread's own rooms: :meth:`_rooms`), then multiplied over the piece's rows in runs."""
        calls = []
        for c0, c1, *rows in group:
            packing, panel = self._pack_calls(b, c0, c1, buffers)
            calls += packing + [self._call(self._batch(a, lo, hi), panel, c, bias, lo, hi, c0, c1)
                                for lo, hi in self.piece_runs[tuple(rows)]]
        return calls

    def __call__(self, a, b, c, bias=None):
        """C from A (rows, k) and W (m, k) or, with ``b_layout="km"``, B (k, m)."""
        extra = () if bias is None else (bias,)
        if self.groups:             # (the calls replayed, their operands: a, B's arrays, c, bias, the rooms)
            rooms = [self._rooms(b, group) for group in self.groups]
            b_arrays = [packed_panel(b, *p) for p in self.panels] if isinstance(b, PackedWeight) else [b]
            return self.replays.run((a, *b_arrays, c, *extra, *(r for _, arrays in rooms for r in arrays)), lambda: [
                self._group_calls(a, b, c, bias, group, buffers) for group, (buffers, _) in zip(self.groups, rooms)])
        packing, panel = self._pack_calls(b, 0, self.m, {})     # once, here: every thread's rows use it
        _parallel_kernels([packing])
        if len(self.runs[0]) == 1 and len(self.blocks) == 1:      # (a small layer's call: no call objects, ~1 us less)
            batch = self._batch(a, 0, self.rows)
            return self.kernels[self.rows, self.m](batch, panel.reshape((len(batch), -1) + panel.shape[1:]), c,
                                                   *extra, count=len(batch))
        self.replays.run((a, panel, c, *extra), lambda: [
            [self._call(self._batch(a, lo, hi), panel, c, bias, lo, hi, 0, self.m) for lo, hi in run]
            for run in self.runs])


STRIP_BYTES = 2 << 20     # of a packed strip: on Zen 4 (1 MiB L2) 2 MiB strips beat 0.5 and 1 MiB ones by 8-17%
# rows up to which the backward's bf16 dx takes a StripGemm: on Zen 4, 1 thread, against a 4096 x 4096
# weight, ms strips / column panels: 16 rows 5.2 / 8.8, 32 rows 8.3 / 11.5, 64 rows 14.3 / 16.5, 128
# rows 27.7 / 26.5
STRIP_ROWS = 64


def panel_width(m, k, dtype):
    """Columns of C per BRGEMM call: :data:`PANEL` where W outgrows :data:`PANEL_BYTES` (a core's
    L2), else all m: one call, whose B rows (a row of W.T each) stay in the cache between row
    tiles anyway. On Zen 4 (1 MiB L2), 1 thread, GFLOP/s with panels of 64 / one call: fp32
    1024^3 105 / 89, 1000 x 300 -> 700 105 / 107, 127 x 65 -> 1000 46 / 91; bf16 1024^3 213 / 201,
    512^3 210 / 215. On Zen 3 (512 KiB), fp32 forward, one call / panels: 1 thread 500 x 700 -> 300
    79 / 85-87, 1000 x 300 -> 700 82-85 / 90-91, 512^3 87-89 / 92; 2 threads 148 / 154-159, 161-163 / 174.

    >>> panel_width(1024, 1024, "f32"), panel_width(70, 300, "f32")
    (64, 70)
    """
    return PANEL if m * k * (2 if dtype == "bf16" else 4) > PANEL_BYTES else m


PANEL_BYTES = next((c.size for c in caches() if c.level == 2), 1 << 20)


class _Plan:
    """The kernels of one shape, dtype and activation (JIT'd once, then looked up per call)."""

    def __init__(self, **kernels):
        self.__dict__.update(kernels)


@functools.lru_cache(maxsize=256)
def _forward_plan(n, m, k, dt, bias, act, threads, keep=False, packed=False):
    """The kernels of a forward; ``keep``: a gelu writes z, then runs as a pass of its own;
    ``packed``: w is a :class:`PackedWeight`, read in its panels but where its dots stream it."""
    fused = None if keep else act
    stream = (not packed or n <= PACKED_DOT_ROWS or m * k * (2 if dt == "bf16" else 4) > PACKED_DOTS_BYTES
              or few_columns(n, m, k))
    path = ("dots" if dots(n, m, k) and stream or not packed and mid_dots(n, m, k, dt) else
            "transposed" if transposed(n, m, k, dt) and not packed else "panels")
    kernels = {"path": path}
    if path == "dots":
        kernels.update(dot_kernels(n, m, k, dt, bias, fused, threads))
    elif path == "transposed":
        # x.T's rows padded, whole k in one call up to 1 MiB of x.T (Zen 3, 1 thread, fp32 GFLOP/s of
        # w @ x.T, whole / in runs: x 160 x 1024 96 / 92, 160 x 1536 98 / 94, 48 x 2048 90 / 86; 96 x 3072
        # (1.1 MiB) 91 / 94, 96 x 4096 82 / 92)
        pack_x = TransposedB(n, k, dt, packed_stride(n, k, dt))
        runs = n * k * (2 if dt == "bf16" else 4) > 1 << 20
        kernels.update(pack_x=pack_x, gemm=RowGemm(m, n, k, dt, threads, c_dtype="f32", ldb=pack_x.ld, runs=runs),
                       zero_bias=np.zeros(m, np.float32), replays=(Replays(), Replays()))
        widths = {hi - lo for lo, hi in kernels["gemm"].blocks}     # of out's columns, one block per thread
        kernels.update(transpose_y={w: transform("transpose", w, n, ldo=m, dtype="f32") for w in widths},
                       add_bias={w: binary("add", n, w, lda=m, ldo=m, dtype="f32", out_dtype=dt, bcast_b="row",
                                           post=fused) for w in widths})
    else:
        panel = packed_panel_width(m, k, dt) if packed else None
        kernels.update(gemm=PanelGemm(n, m, k, dt, threads, panel=panel, bias=bias, act=fused))
    if keep:
        kernels["act"] = unary(act, n, m, dtype=dt)
    return _Plan(**kernels)


@functools.lru_cache(maxsize=256)
def _backward_plan(n, m, k, dt, act, threads):
    few_bf16 = dt == "bf16" and n <= STRIP_ROWS
    kernels = dict(dx=StripGemm(n, k, m, dt, threads, strip_bytes=STRIP_BYTES) if few_bf16
                   else PanelGemm(n, k, m, dt, threads, b_layout="km"),
                   dw=PanelGemm(m, k, n, dt, threads, b_layout="km"),
                   transpose_dz=transform("transpose", n, m, dtype=dt),
                   db=reduce("add", n, m, over="rows", dtype=dt, out_dtype="f32"))
    if act is not None:
        kernels["act_grad"] = unary(GRADIENTS[act], n, m, dtype=dt)
    return _Plan(**kernels)


def _act_ref(act, z):
    return z if act is None else UNARY_OPS[act](z)
