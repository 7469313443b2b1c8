"""NumPy helpers for BRGEMM convolutions: the blocked layouts they read and a reference convolution.

A convolution's tensors in the layouts of the paper's convolutions (all C-contiguous, cache-line
aligned):

- activations ``(N, C/bc, H + 2*pad, W + 2*pad, bc)``: channels in blocks of ``bc``, the image
  pre-padded with zeros (:func:`block_activations`); channels past C (when ``bc`` does not divide
  it) are zero too;
- weights ``(K/bk, C/bc, R, S, bc, bk)`` (:func:`block_weights`), for bf16 with each (bc, bk)
  block in the VNNI2 layout ``(bc/2, bk, 2)`` that ``tpp.brgemm(dtype="bf16")`` reads;
- outputs ``(N, K/bk, P, Q, bk)`` (:func:`unblock_activations` turns them back into NCHW).

The helpers take NumPy arrays, torch tensors (bf16 included) and DLPack objects of real numbers
(floats, bf16 included, or integers); anything else, a masked array, or a size past the host's
memory is refused with an error naming the argument.

For output pixel row ``p`` and columns ``q..q+m`` the input rows are ``p*stride + r`` and columns
``q*stride + s`` (step ``stride``) of the padded image: every (r, s, channel block) contributes one
(m x bc) @ (bc x bk) product, a BRGEMM block.

>>> import numpy as np
>>> x = np.arange(2 * 3 * 2 * 2, dtype=np.float32).reshape(2, 3, 2, 2)      # N C H W
>>> xb = block_activations(x, bc=2, pad=1)
>>> xb.shape, float(xb[0, 1, 1, 1, 1])                                      # channel 3 is padding
((2, 2, 4, 4, 2), 0.0)
>>> bool((unblock_activations(xb, channels=3, pad=1) == x).all())
True
"""
import math
import os

import numpy as np

from .dtypes import DtypeError, dtype as to_dtype
from .layout import aligned, as_array, empty, new_aligned, vnni_pack


def out_size(size, kernel, stride=1, pad=0):
    """Output pixels along an axis of ``size`` input pixels: ``(size + 2*pad - kernel) // stride + 1``.

    >>> out_size(224, 7, 2, 3), out_size(56, 3, 1, 1), out_size(56, 1, 2, 0)
    (112, 56, 28)
    """
    for name, v, least in (("size", size, 1), ("kernel", kernel, 1), ("stride", stride, 1), ("pad", pad, 0)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < least:
            raise ValueError(f"out_size: {name}={v!r}; expected an int >= {least}")
    if size + 2 * pad < kernel:
        raise ValueError(f"out_size: a {kernel}-pixel kernel does not fit {size} pixels padded by {pad}; "
                         f"pad by at least {-(-(kernel - size) // 2)}")
    return (size + 2 * pad - kernel) // stride + 1


def block_activations(x, bc, pad=0, dtype=None):
    """NCHW ``x`` as ``(N, ceil(C/bc), H + 2*pad, W + 2*pad, bc)``: zero rim, zero channels past C.

    ``dtype`` converts (e.g. "bf16"); the default keeps ``x``'s. N may be 0 (an empty batch); C, H
    and W of 0 are refused (nothing :func:`unblock_activations` or a convolution takes back).

    >>> block_activations(np.ones((1, 3, 2, 2), np.float32), bc=4, pad=1).shape
    (1, 1, 4, 4, 4)
    """
    if isinstance(x, (list, tuple)) and not len(x):
        raise ValueError(f"block_activations: x is an empty {type(x).__name__}, which has no C, H or W; an empty "
                         "batch is an array of shape (0, C, H, W): np.empty((0, C, H, W), np.float32)")
    x = _real(as_array(x, "block_activations"), "block_activations", "x")
    if x.ndim != 4:
        raise ValueError(f"block_activations: x must be NCHW (4-D), got shape {x.shape}")
    if 0 in x.shape[1:]:          # (unblock_activations and Conv could not take the result back)
        empty_axes = ", ".join(f"{a}=0" for a, d in zip("CHW", x.shape[1:]) if d == 0)
        raise ValueError(f"block_activations: x of shape {x.shape} has {empty_axes}; a convolution's input needs C, H "
                         "and W >= 1 (N may be 0, an empty batch): leave out the call or pass the non-empty image")
    _positive("block_activations", bc=bc)
    _positive("block_activations", pad=pad, least=0)
    bc, pad = int(bc), int(pad)
    n, c, h, w = x.shape
    cb = -(-c // bc)
    dt = x.dtype if dtype is None else to_dtype(dtype)
    _fits("block_activations", (n, cb, h + 2 * pad, w + 2 * pad, bc), dt, f"bc={bc} and pad={pad}")
    out = empty((n, cb, h + 2 * pad, w + 2 * pad, bc), dt)
    out[...] = 0
    padded = np.zeros((n, cb * bc, h, w), dt)
    padded[:, :c] = x
    out[:, :, pad:pad + h, pad:pad + w, :] = padded.reshape(n, cb, bc, h, w).transpose(0, 1, 3, 4, 2)
    return out


def unblock_activations(xb, channels=None, pad=0):
    """The inverse of :func:`block_activations` (and the NCHW form of a blocked output), a new
    array: the first ``channels`` channels (default all), the ``pad`` rim cut off.

    >>> unblock_activations(np.zeros((1, 2, 3, 3, 4), np.float32)).shape
    (1, 8, 3, 3)
    """
    xb = _real(as_array(xb, "unblock_activations", "xb"), "unblock_activations", "xb")
    if xb.ndim != 5:
        raise ValueError(f"unblock_activations: expected (N, C/bc, H, W, bc), got shape {xb.shape}")
    n, cb, hp, wp, bc = xb.shape
    channels = cb * bc if channels is None else channels
    _positive("unblock_activations", channels=channels)
    _positive("unblock_activations", pad=pad, least=0)
    if not 0 < channels <= cb * bc or not 0 <= 2 * pad < min(hp, wp):
        raise ValueError(f"unblock_activations: channels={channels} must be in 1..{cb * bc} and pad={pad} "
                         f"less than half of {hp}x{wp}")
    inner = xb[:, :, pad:hp - pad, pad:wp - pad, :]
    return new_aligned(inner.transpose(0, 1, 4, 2, 3).reshape(n, cb * bc, hp - 2 * pad, wp - 2 * pad)[:, :channels])


def block_weights(w, bc, bk, dtype=None, fold=False):
    """KCRS weights as ``(K/bk, ceil(C/bc), R, S, bc, bk)`` (channels past C zero); with
    ``dtype="bf16"`` each (bc, bk) block VNNI2-packed: ``(K/bk, C/bc, R, S, bc/2, bk, 2)``.
    ``fold=True`` merges each filter row's S x bc values into one k axis, ``(K/bk, C/bc, R,
    S*bc, bk)``, for convolutions that fold the filter columns into the GEMM's k; in bf16 the
    VNNI2 pairs run over those S*bc rows (``(..., R, ceil(S*bc/2), bk, 2)``, a zero pad row when
    S*bc is odd), so bc may be odd: a 3-channel input needs no zero channel.

    >>> block_weights(np.ones((4, 3, 1, 1), np.float32), bc=4, bk=2).shape
    (2, 1, 1, 1, 4, 2)
    >>> block_weights(np.ones((4, 4, 3, 3), np.float32), bc=4, bk=4, dtype="bf16").shape
    (1, 1, 3, 3, 2, 4, 2)
    >>> block_weights(np.ones((4, 3, 7, 7), np.float32), bc=3, bk=4, dtype="bf16", fold=True).shape
    (1, 1, 7, 11, 4, 2)
    """
    w = _real(as_array(w, "block_weights", "w"), "block_weights", "w")
    if w.ndim != 4:
        raise ValueError(f"block_weights: w must be KCRS (4-D), got shape {w.shape}")
    _positive("block_weights", bc=bc, bk=bk)
    bc, bk = int(bc), int(bk)
    if not isinstance(fold, (bool, np.bool_)):
        raise ValueError(f"block_weights: fold={fold!r}; expected True (fold the filter columns into k) or False")
    k, c, r, s = w.shape
    if k % bk:
        raise ValueError(f"block_weights: bk={bk} must divide the {k} output channels")
    dt = w.dtype if dtype is None else to_dtype(dtype)
    vnni = dt == to_dtype("bf16")
    if vnni and bc % 2 and not fold:
        raise ValueError(f"block_weights: bf16 weights pair channels (VNNI2): bc={bc} must be even; "
                         f"pad the channels with bc={bc + 1}, or pair over filter rows with fold=True")
    cb = -(-c // bc)
    _fits("block_weights", (k, cb * bc, r, s), dt, f"bc={bc}")
    padded = np.zeros((k, cb * bc, r, s), dt)
    padded[:, :c] = w
    blocked = padded.reshape(k // bk, bk, cb, bc, r, s).transpose(0, 2, 4, 5, 3, 1)
    if fold:
        blocked = blocked.reshape(k // bk, cb, r, s * bc, bk)
    return vnni_pack(blocked, 2) if vnni else aligned(blocked)


def conv2d_reference(x, w, stride=1, pad=0):
    """NCHW convolution (cross-correlation, as deep-learning frameworks define it) in float64.

    ``x`` and ``w`` may be anything the layout helpers take (torch tensors, bf16 included);
    ``stride`` and ``pad`` are one int each, the same along both axes.

    >>> x = np.arange(9.0).reshape(1, 1, 3, 3); w = np.ones((1, 1, 2, 2))
    >>> conv2d_reference(x, w).tolist()
    [[[[8.0, 12.0], [20.0, 24.0]]]]
    """
    x, w = (np.asarray(_real(as_array(a, "conv2d_reference", name), "conv2d_reference", name), np.float64)
            for a, name in ((x, "x"), (w, "w")))
    if x.ndim != 4 or w.ndim != 4 or x.shape[1] != w.shape[1]:
        raise ValueError(f"conv2d_reference: x (N, C, H, W) {x.shape} and w (K, C, R, S) {w.shape} must "
                         "agree on C")
    for name, v, least in (("stride", stride, 1), ("pad", pad, 0)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < least:
            raise ValueError(f"conv2d_reference: {name}={v!r}; expected one int >= {least}, the same along both "
                             f"axes, e.g. {name}=1" + ("; per-axis or asymmetric padding is not supported: np.pad "
                                                       "the input first" if name == "pad" else ""))
    stride, pad = int(stride), int(pad)
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    _fits("conv2d_reference", (n, c, h + 2 * pad, wd + 2 * pad), x.dtype, f"pad={pad}")
    p, q = out_size(h, r, stride, pad), out_size(wd, s, stride, pad)
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out = np.zeros((n, k, p, q))
    for i in range(r):
        for j in range(s):
            patch = xp[:, :, i:i + (p - 1) * stride + 1:stride, j:j + (q - 1) * stride + 1:stride]
            out += np.einsum("nchw,kc->nkhw", patch, w[:, :, i, j])
    return out


def _real(a, who, name):
    """``a`` when its dtype is one the layouts hold, real numbers: a float (bf16 included) or an integer."""
    if a.dtype.kind in "fiu" or a.dtype.name == "bfloat16":
        return a
    fix = f"{name}.real" if a.dtype.kind == "c" else f"{name}.astype(np.float32)"
    raise DtypeError(f"{who}: {name} holds {a.dtype}; expected real numbers: a float (float32, bfloat16, float16, "
                     f"float64) or integer array, e.g. {fix}")


def _fits(who, shape, dt, knobs):
    """ValueError naming ``knobs`` when an array of ``shape`` and ``dt`` needs more than the host's memory."""
    nbytes, memory = math.prod(shape) * dt.itemsize, _memory()
    if nbytes > memory:
        raise ValueError(f"{who}: with {knobs} the array would be {shape} {dt.name}, {nbytes / 2**30:.4g} GiB, "
                         f"more than this machine's {memory / 2**30:.4g} GiB of memory; check {knobs}")


def _memory():
    """The host's physical memory in bytes (2**63 - 1 where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return 2 ** 63 - 1


def _positive(who, least=1, **values):
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < least:
            raise ValueError(f"{who}: {name}={v!r}; expected an int >= {least}")
