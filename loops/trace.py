"""Symbolic tracing of loop bodies into a tree of TPP calls on affine views of the arguments.

The body runs with :class:`Affine` loop indices and :class:`View` array proxies. Indexing a view
gives a view whose element offset is affine in the indices; calling a tppasm kernel on views is
recorded (through ``tppasm.kernel.TRACE_HOOK``) instead of executed. A Python ``if`` on a
comparison of indices asks the tracer for a decision; the body is re-run once per control path,
and the paths are merged into a :class:`loops.program.Node` tree that mirrors the body's branches.

>>> import numpy as np, tppasm.eltwise as ew
>>> from tppasm.kernel import get_kernel
>>> relu = get_kernel(ew.Unary("relu", 2, 4))
>>> def body(i, X, Y):
...     if i == 0:
...         relu(X[0:2, :], Y[0:2, :])
...     relu(X[2 * i:2 * i + 2, :], Y[2 * i:2 * i + 2, :])
>>> tree = trace(body, ["i"], [np.zeros((8, 4), np.float32)] * 2)
>>> print(tree.pretty())
if i == 0:
  relu(X[0:2, :], Y[0:2, :])
  relu(X[2*i:2*i + 2, :], Y[2*i:2*i + 2, :])
else:
  relu(X[2*i:2*i + 2, :], Y[2*i:2*i + 2, :])
"""
import inspect
import os

import numpy as np

import tppasm.kernel as _tk
from tppasm.brgemm import unchecked_in_body
from tppasm.operand import OperandError, check

from .affine import NEGATE, Affine, Compare, TraceError  # noqa: F401  (Compare, TraceError: loops.trace's)
from .affine import thread_state as _local
from .program import Call, merge_paths

THREAD_VARS = ("tid", "row", "col", "layer")
MAX_PATHS = 4096
MAX_TESTS = 10_000           # index comparisons evaluated in one pass over the body
COUNT_AFTER = 64             # a body with more paths has them counted (cheaply) before more are traced


class ViewAttributeError(TraceError, AttributeError):
    """An attribute a traced view does not have (``X[i].T``, ``.reshape``): a :class:`TraceError`
    naming the alternative, and an AttributeError, so ``hasattr``/``getattr(..., default)`` probes
    still read it as absent."""


# -- array proxies ---------------------------------------------------------------------------

_TRANSPOSE = ("views cannot be transposed in a body; transpose the block with a transform TPP "
              "(tpp.transform('transpose', m, n) called on X[i] and a scratch block), or pass the array in "
              "the blocked layout the kernel wants (tpp.block(x, ..., outer='n'), a different blocking)")
_RESHAPE = ("views cannot change shape in a body; give the argument the blocked shape beforehand "
            "(tpp.block(x, bm, bn) makes (Mb, Nb, bm, bn) blocks, or x.reshape(...) outside the body) and index "
            "the blocks with the loop indices")
_CONVERT = ("a body cannot convert a view; convert the block with a copy TPP (tpp.copy(m, n, dtype=..., "
            "out_dtype=...) from X[i] into a block of another argument), or convert the argument before the call")
_COPY = ("a body cannot copy a view with NumPy; copy the block with tpp.copy(m, n) into a block of another "
         "argument")
_ALTERNATIVES = {
    **dict.fromkeys(("T", "mT", "transpose", "swapaxes", "moveaxis", "rollaxis"), _TRANSPOSE),
    **dict.fromkeys(("reshape", "ravel", "flatten", "squeeze", "expand_dims", "view", "resize",
                     "atleast_2d", "atleast_3d", "broadcast_to"), _RESHAPE),
    **dict.fromkeys(("astype", "real", "imag", "byteswap"), _CONVERT),
    **dict.fromkeys(("copy", "ascontiguousarray", "asarray", "array", "fill", "tolist", "item", "tobytes"), _COPY),
}

class View:
    """A traced view of argument ``_arg``: concrete shape, strides (``_strides``, in elements) and
    dtype, affine element offset. ``.strides`` gives NumPy's byte strides, as ``.python()`` sees them.

    ``_axes`` follows each axis of the argument itself: ``(start, step)`` in index units (``start``
    affine), and ``_vmap`` names the argument axis behind each axis of the view, so the block a
    kernel touches is known per axis of the argument (the race analysis, :mod:`loops.races`).
    ``_owner`` is the trace that made it (its index names): a view kept past its body and used in
    another nest is refused.
    """

    # internal slots start with "_": a body reading X.offset or X.text gets the ViewAttributeError
    __slots__ = ("_arg", "dtype", "shape", "_strides", "_offset", "_text", "_checks", "_axes", "_vmap", "_owner")

    def __init__(self, arg, dtype, shape, strides, offset, text, checks=(), axes=None, vmap=None, owner=None):
        self._arg, self.dtype, self.shape, self._strides = arg, dtype, tuple(shape), tuple(strides)
        self._offset, self._text, self._checks, self._owner = offset, text, tuple(checks), owner
        self._axes = tuple(axes) if axes is not None else tuple((Affine.of(0), 1) for _ in self.shape)
        self._vmap = tuple(vmap) if vmap is not None else tuple(range(len(self.shape)))

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def strides(self):
        """NumPy's strides, in bytes (as ``kernel.python`` gives them)."""
        item = np.dtype(self.dtype).itemsize
        return tuple(s * item for s in self._strides)

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        if any(k is None for k in key):
            name = self._text.split("[")[0]
            raise TraceError(f"{self._text}: None (np.newaxis) is not supported as an index in a loop body; add the "
                             f"axis outside the body: pass the argument {name} with it ({name}[None] for a leading "
                             f"axis, e.g. a BRGEMM operand's batch axis; np.expand_dims({name}, axis) elsewhere) and "
                             "index it without None")
        if getattr(getattr(_local, "tracer", None), "counting", False) and self._plain(key):
            n = len(key)        # counting paths: the shape is all a body can read (no offset, text or check)
            return View(self._arg, self.dtype, self.shape[n:], self._strides[n:], self._offset, self._text,
                        (), self._axes, self._vmap[n:], self._owner)
        if len(key) > self.ndim:
            raise TraceError(f"{self._text}: {len(key)} indices for a {self.ndim}-D array")
        shape, strides, offset, checks, parts = [], [], self._offset, list(self._checks), []
        axes, vmap = list(self._axes), []
        for axis, k in enumerate(key):
            self._own(k.start if isinstance(k, slice) else k)
            self._own(k.stop if isinstance(k, slice) else None)
            dim, st = self.shape[axis], self._strides[axis]
            origin = self._vmap[axis]
            start, step = axes[origin]
            if isinstance(dim, Affine):
                raise TraceError(f"{self._text}: cannot index the axis whose length depends on a loop index; "
                                 "slice the other axes first")
            if isinstance(k, slice):
                lo, extent, sstep, text = self._slice(k, dim, axis, checks)
                offset = offset + lo * st
                shape.append(extent)
                strides.append(st * sstep)
                axes[origin] = (start + lo * step, step * sstep)
                vmap.append(origin)
                parts.append(text)
            elif isinstance(k, (Affine, int, np.integer)) and not isinstance(k, bool):
                if isinstance(k, Affine):
                    where = (f"{self._text} has no block {k}: axis {axis} has length 0" if dim == 0 else
                             f"{self._text}: index {k} on axis {axis} (length {dim})")
                    checks.append((k, 0, dim - 1, where))
                else:
                    k = int(k) + dim if k < 0 else int(k)
                    if not 0 <= k < dim:
                        raise TraceError(f"{self._text}: index {k} out of range for axis {axis} of length {dim}")
                offset = offset + k * st
                axes[origin] = (start + k * step, step)
                parts.append(repr(k))
            else:
                raise TraceError(f"{self._text}: cannot index with {type(k).__name__} {k!r}; use ints, loop "
                                 "indices (affine expressions of them) and slices")
        shape += self.shape[len(key):]
        strides += self._strides[len(key):]
        vmap += self._vmap[len(key):]
        text = f"{self._text}[{', '.join(parts)}]"
        return View(self._arg, self.dtype, shape, strides, offset, text, checks, axes, vmap, self._owner)

    def _plain(self, key):
        """True when ``key`` is at most ``ndim`` ints and loop indices (no slice): the view's shape is
        then the rest of this one's."""
        return len(key) <= self.ndim and all(isinstance(k, (Affine, int, np.integer)) and not isinstance(k, bool)
                                             for k in key)

    def _own(self, index):
        """TraceError when ``index`` is a loop index of another body (kept past it, e.g. in a global)."""
        tracer = getattr(_local, "tracer", None)
        if tracer is not None and self._owner is not tracer.names:
            raise TraceError(f"{self._text} is a view traced for another loop body (kept past its body, e.g. in a "
                             "global); use the views of this body's own array arguments")
        if isinstance(index, Affine) and index.names and index.names is not self._owner:
            raise TraceError(f"{self._text}[{index}]: {index} is a loop index of another loop body (kept past "
                             "its body, e.g. in a global); index with this body's own loop indices")

    def _box(self, shape):
        """Per axis of the argument: ``(start, extent, step)`` of the elements a kernel operand of
        ``shape`` (the view's own, the batch axis cut to ``count``) covers."""
        extent = [1] * len(self._axes)
        for origin, n in zip(self._vmap, shape):
            extent[origin] = n
        return tuple((start, n, step) for (start, step), n in zip(self._axes, extent))

    def _slice(self, k, dim, axis, checks):
        step = 1 if k.step is None else k.step
        if isinstance(step, Affine) or not isinstance(step, (int, np.integer)) or step < 1:
            raise TraceError(f"{self._text}: slice step {step!r} must be a positive int")
        lo = 0 if k.start is None else k.start
        hi = dim if k.stop is None else k.stop
        lo = Affine.of(lo)
        hi = Affine.of(hi)
        for e in (lo, hi):
            if e.is_const and e.const < 0:
                raise TraceError(f"{self._text}: negative slice bound {e.const} is not supported with traced "
                                 "indices; write the bound from the start of the axis")
        extent = hi - lo
        text = ("" if k.start is None else repr(lo)) + ":" + ("" if k.stop is None else repr(hi))
        text += "" if step == 1 else f":{step}"
        if lo.is_const and hi.is_const:
            if hi.const > dim:
                hi = Affine.of(dim)
                extent = hi - lo
            n = max(0, -(-extent.const // step))
            return lo, n, step, text
        checks.append((lo, 0, dim, f"{self._text}: slice start {lo} on axis {axis} (length {dim})"))
        if extent.is_const:
            checks.append((hi, 0, dim, f"{self._text}: slice stop {hi} on axis {axis} (length {dim})"))
            return lo, max(0, -(-extent.const // step)), step, text
        if k.stop is None and step == 1:
            return lo, extent, step, text           # length dim - lo: checked against the kernel's need
        raise TraceError(f"{self._text}: the slice {text} has a length that depends on loop indices; use "
                         "A[i:i + n] with a constant n, or A[i:] for the rest of the axis")

    def _refuse(self, *a, **k):
        raise TraceError(f"{self._text} is a traced array: only tppasm kernels can run on it inside a loop "
                         "body (e.g. tpp.brgemm(...)(A[i], B[j], C[i, j])); NumPy functions, operators and "
                         "element access cannot be compiled; use kernel.python(...) to run NumPy code")

    __array__ = __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __matmul__ = __rmatmul__ = _refuse
    __truediv__ = __rtruediv__ = __floordiv__ = __mod__ = __pow__ = __neg__ = __abs__ = __setitem__ = _refuse
    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = _refuse    # an `if` on data cannot be compiled
    __hash__ = object.__hash__          # (refusing == would drop it): views stay usable as dict keys, `is` works
    __iter__ = __len__ = __float__ = __int__ = __index__ = __bool__ = _refuse
    traced_view = True                 # what loops.signature recognizes: a nest called inside a body

    def __array_ufunc__(self, *a, **k):
        self._refuse()

    def __array_function__(self, func, types, args, kwargs):
        name = getattr(func, "__name__", "")
        hint = _ALTERNATIVES.get(name)
        if hint is None:
            self._refuse()
        raise TraceError(f"np.{name}({self._text}) inside a loop body: {hint}")

    def __getattr__(self, name):
        if name.startswith("__"):          # protocol probes (copy, pickle, NumPy) get the usual answer
            raise AttributeError(name)
        hint = _ALTERNATIVES.get(name)
        if hint is None:
            raise ViewAttributeError(f"{self._text}.{name}: a traced array in a loop body only supports indexing "
                                     "and slicing (X[i, j:j + 4]) and .shape, .ndim, .dtype and .strides; pass it to a "
                                     "tppasm kernel, or run NumPy code with kernel.python(...)")
        raise ViewAttributeError(f"{self._text}.{name} inside a loop body: {hint}")

    def __repr__(self):
        return f"<traced {self._text}: shape {self.shape}, offset {self.offset}>"


class _Tracer:
    def __init__(self, names):
        self.names = names
        self.decisions, self.events, self.pos, self.known = [], [], 0, {}
        self.tests = 0
        self.counting = False       # True: calls are not recorded (see _count_paths)

    def decide(self, test):
        self.tests += 1
        if self.tests > MAX_TESTS:      # a comparison is decided once per path, so this is a while loop
            raise TraceError(f"the body compared loop indices more than {MAX_TESTS} times in one pass: a "
                             f"'while' on a loop index ({test!r}) never ends while tracing, since each "
                             "comparison has one value per path; use 'if', or a loop over constants")
        if test.key() in self.known:
            return self.known[test.key()]
        if self.pos < len(self.decisions):
            out = self.decisions[self.pos]
        else:
            out = True
            self.decisions.append(out)
        self.pos += 1
        self.known[test.key()] = out
        neg = Compare(test.expr, NEGATE[test.op])
        self.known[neg.key()] = not out
        self.events.append(("if", test, out))
        return out

    def record(self, kernel, arrays, values):
        if self.counting:
            return
        specs = kernel.operands
        if not getattr(kernel.desc, "checked_call", True):
            raise TraceError(unchecked_in_body(kernel.desc))
        for name, v in zip(kernel.scalars, values):
            if isinstance(v, Affine):
                raise TraceError(f"{kernel.desc.kind}: {name}={v!r}; kernel scalars in a loop body must be ints "
                                 "known when the body is traced, not loop indices")
        try:
            values = tuple(_tk.scalar_arg(kernel.desc.kind, name, v) for name, v in zip(kernel.scalars, values))
        except OperandError as e:
            raise TraceError(str(e)) from None
        count = dict(zip(kernel.scalars, values)).get(kernel.desc.count_scalar, 1)
        args, checks, texts, boxes = [], [], [], []
        for spec, v in zip(specs, arrays):
            if not isinstance(v, View):
                raise TraceError(f"{kernel.desc.kind}: operand {spec.name} is a {type(v).__name__}; inside a loop "
                                 "body pass views of the body's array arguments (declare the array as a "
                                 "parameter of the body instead of using a global)")
            if v._owner is not self.names:
                raise TraceError(f"{kernel.desc.kind}: operand {spec.name} = {v._text} is a view traced for another "
                                 "loop body (kept past its body, e.g. in a global); use the views of this body's "
                                 "own array arguments")
            shape = list(v.shape)
            if spec.batch and shape and isinstance(shape[0], Affine):
                checks.append((shape[0], count, 1 << 62,
                               f"{kernel.desc.kind}: operand {spec.name} = {v._text} holds {shape[0]} blocks "
                               f"but count={count}"))
                shape[0] = count
            if any(isinstance(d, Affine) for d in shape):
                raise TraceError(f"{v._text}: only the batch axis of a kernel operand may have a length that "
                                 "depends on a loop index")
            item = np.dtype(v.dtype).itemsize
            fake = np.lib.stride_tricks.as_strided(np.empty(1, v.dtype), shape, [s * item for s in v._strides])
            try:
                check(spec, fake, count, who=kernel.desc.kind)
            except OperandError as e:
                raise OperandError(f"{e} (operand {v._text})") from None
            args.append((v._arg, v._offset))
            boxes.append(v._box(spec.full_shape(count)))
            checks.extend(v._checks)
            texts.append(v._text)
        extra = "".join(f", {n}={x}" for n, x in zip(kernel.scalars, values)
                        if n == kernel.desc.count_scalar or x != 1)
        name = getattr(kernel.desc, "op", None) or kernel.desc.kind
        path = tuple((t, o) for kind, t, o in self.events if kind == "if")
        self.events.append(("call", Call(kernel, tuple(args), tuple(int(x) for x in values),
                                         f"{name}({', '.join(texts)}{extra})", tuple(checks), path,
                                         tuple(boxes)), None))


def _hook(kernel, arrays, values):
    mode = getattr(_local, "mode", None)
    if mode == "trace":
        _local.tracer.record(kernel, arrays, values)
        return True
    if mode == "python" and (not arrays or any(isinstance(a, PyArray) for a in arrays)):
        kernel.reference(*(np.asarray(a).view(np.ndarray) for a in arrays),
                         **dict(zip(kernel.scalars, values)))
        return True
    return False


class PyArray(np.ndarray):
    """Arrays passed to a body by ``kernel.python``: kernels called on them run their NumPy reference."""


def _mode():
    """This thread's mode: "trace" (tracing a body), "python" (running one in ``.python()``) or None."""
    return getattr(_local, "mode", None)


_tk.TRACE_HOOK, _tk.BODY_MODE = _hook, _mode


# -- thread coordinates ----------------------------------------------------------------------

class ThreadVars:
    """The calling thread's id and grid coordinates: symbolic while tracing, 0 in ``kernel.python``."""

    __slots__ = ("tid", "row", "col", "layer")

    def __init__(self, values):
        for k, v in zip(self.__slots__, values):
            setattr(self, k, v)


def thread():
    """The thread id and grid coordinates, usable in offsets inside a body or init/fini hook.

    >>> from loops import thread
    >>> thread().tid                 # outside a body: the Python caller, thread 0
    0
    """
    mode = getattr(_local, "mode", None)
    if mode == "trace":
        return ThreadVars([Affine(((v, 1),)) for v in THREAD_VARS])
    return ThreadVars([0, 0, 0, 0])


# -- driving the body ------------------------------------------------------------------------

def trace(body, index_names, arrays, arg_names=None):
    """Trace ``body(*indices, *arrays)`` into a :class:`loops.program.Node` tree (indices: loop letters a, b, ...).

    ``index_names`` are the body's parameter names for the indices (used in texts and messages);
    ``arrays`` give the shape, strides and dtype of each array argument.

    >>> import numpy as np, tppasm as tpp
    >>> zero = tpp.zero(2, 2)
    >>> print(trace(lambda i, X: zero(X[i]), ["i"], [np.ones((3, 2, 2), np.float32)]).pretty())
    zero(X[i])
    """
    letters = [chr(ord("a") + i) for i in range(len(index_names))]
    names = dict(zip(letters, index_names))
    idx = [Affine(((v, 1),), 0, names) for v in letters]
    if arg_names is None:
        params = list(inspect.signature(body).parameters)[len(index_names):]
        arg_names = params + [f"arg{i}" for i in range(len(params), len(arrays))]
    views = []
    for i, a in enumerate(arrays):
        if not isinstance(a, np.ndarray):
            raise TraceError(f"array argument {arg_names[i]} is a {type(a).__name__}; pass NumPy arrays")
        item = a.itemsize
        if any(s % item for s in a.strides):
            raise TraceError(f"array argument {arg_names[i]} has strides {a.strides} that are not multiples of "
                             "its item size; pass np.ascontiguousarray(...)")
        views.append(View(i, a.dtype, a.shape, _element_strides(a), Affine((), 0, names), arg_names[i], owner=names))
    paths = []
    decisions = []
    while decisions is not None:
        tr = _Tracer(names)
        tr.decisions = decisions
        _run(tr, body, idx + views)
        paths.append(tr.events)
        decisions = _next_path(tr)
        if len(paths) == COUNT_AFTER and decisions is not None:
            _count_paths(body, idx + views, names, decisions, len(paths))
    return merge_paths(paths)


def _next_path(tr):
    """The decisions of the next path after ``tr``'s (depth first, True before False), or None."""
    decisions = list(tr.decisions[:tr.pos])
    while decisions and decisions[-1] is False:
        decisions.pop()
    if not decisions:
        return None
    decisions[-1] = False
    return decisions


def _count_paths(body, args, names, decisions, done):
    """TraceError when the paths from ``decisions`` on, with the ``done`` ones, number more than
    :data:`MAX_PATHS`: counted by running the body with its kernel calls not recorded (recording
    costs about 4/5 of a traced path; views get their shape only), so a body with too many is
    refused in seconds, not minutes. A path that fails ends the count: tracing it says why."""
    while decisions is not None:
        tr = _Tracer(names)
        tr.counting = True
        tr.decisions = decisions
        try:
            _run(tr, body, args)
        except Exception:         # noqa: BLE001  (traced again, with its calls recorded, the error has its text)
            return
        done += 1
        if done > MAX_PATHS:
            raise TraceError(f"the body has more than {MAX_PATHS} control paths; simplify its 'if's")
        decisions = _next_path(tr)


def _element_strides(a):
    """``a``'s strides in elements; C order for a zero-size array, whose strides NumPy sets to 0 (no
    element is ever reached: a nest over it runs no iteration, or fails its bounds check)."""
    if a.size == 0:
        return [int(np.prod(a.shape[k + 1:], dtype=np.int64)) for k in range(a.ndim)]
    return [s // a.itemsize for s in a.strides]


def _run(tracer, fn, args, mode="trace"):
    """``fn(*args)`` with kernel calls going to the hook in ``mode`` ("trace" or "python")."""
    prev = getattr(_local, "mode", None), getattr(_local, "tracer", None), getattr(_local, "depth", 0)
    # A KeyboardInterrupt (any signal handler's exception) is raised only where the interpreter
    # checks for pending signals (and switches threads): after a call, at a function's start, at a
    # jump. The updates below are plain assignments with no such point among them or before the
    # try that undoes them, so an interrupt lands before them (nothing to undo) or in fn (all
    # undone), and no other thread sees TRACING half updated. A call there (the former
    # tracing(+1)) let one land between an update and its try, or in the finally before the
    # restore: that left this thread in trace mode, and TRACING counted, for good.
    try:
        _local.mode, _local.tracer, _local.depth = mode, tracer, prev[2] + 1
        _tk.TRACING += 1        # kernels then skip their native fast path and ask the hook
        _tk._DIVERT.value = _tk.TRACING
        try:
            result = fn(*args)
        finally:
            _tk.TRACING -= 1
            _tk._DIVERT.value = _tk.TRACING
    finally:
        _local.mode, _local.tracer, _local.depth = prev
    if inspect.isgenerator(result) or inspect.iscoroutine(result) or inspect.isasyncgen(result) \
            or inspect.isawaitable(result):
        if hasattr(result, "close"):
            result.close()          # never started: nothing of the body ran
        raise TraceError(f"the loop body returned a {type(result).__name__}: its kernel calls never ran; write "
                         "the body as a plain 'def' that calls the kernels directly (no yield, async or await)")


def _after_fork_in_child():
    """Only the forking thread's traces go on in a child: other threads' counts must not keep
    every kernel call on the slow path forever."""
    _tk.TRACING = getattr(_local, "depth", 0)
    _tk._DIVERT.value = _tk.TRACING


os.register_at_fork(after_in_child=_after_fork_in_child)


def run_python(fn, args):
    """Call ``fn(*args)`` with kernels on :class:`PyArray` arguments running their NumPy references.

    >>> import numpy as np, tppasm as tpp
    >>> X = np.ones((2, 2), np.float32)
    >>> run_python(tpp.zero(2, 2), [X.view(PyArray)]); float(X.sum())
    0.0
    """
    _run(None, fn, args, mode="python")
