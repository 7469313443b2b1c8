"""Native nests: every logical iteration runs exactly once, in the order and on the thread the spec says.

A recording kernel ``rec(counter, order, hits)`` takes a ticket from ``counter`` (lock xadd),
stores it in ``order`` and increments ``hits`` (lock add); the body calls it on the slot of the
iteration, so ``hits`` is a histogram per thread and ``order`` the sequence within a thread.
"""
import inspect
import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from isa.x86 import Function, dword, eax, qword, rdi, rdx, rsi
from loops import Loop, SpecError, kernel, thread
from loops.enumerate import enumerate_specs, enumerate_union
from isa.pool import get_pool
from tppasm.kernel import Descriptor, Kernel
from tppasm.operand import OperandSpec
from tests.loops.spec_draws import collapse_run, grid_axes
from tests.support import pool_of

LETTERS = "abcd"


class Record(Descriptor):
    kind = "rec"
    op = "rec"

    def operands(self):
        return [OperandSpec(n, "i32", (1, 1), (1, 1), writable=True) for n in ("counter", "order", "hits")]

    def reference(self, counter, order, hits):
        order[0, 0] = counter[0, 0]
        counter[0, 0] += 1
        hits[0, 0] += 1


def _record_kernel():
    fn = Function("rec", ["ptr", "ptr", "ptr"])
    a = fn.asm
    a.mov(eax, 1)
    a.xadd(dword[rdi], eax)
    a.instructions[-1].has_lock_prefix = True
    a.mov(dword[rsi], eax)
    a.add(dword[rdx], 1)
    a.instructions[-1].has_lock_prefix = True
    k = Kernel.__new__(Kernel)
    k.desc, k.isa, k.raw = Record(), "avx2", fn.finalize()
    k.operands, k.scalars = tuple(k.desc.operands()), ()
    k._native, k._n, k._defaults = False, 3, ()
    return k


REC = _record_kernel()


def recording_body(nloops, shared_counter=False):
    """body(i_a, ..., CNT, O, H): rec(CNT[tid], O[idx], H[tid, idx])."""
    def body(*args):
        idx, (cnt, order, hits) = args[:nloops], args[nloops:]
        t = thread()
        rec(cnt[0 if shared_counter else t.tid], order[idx], hits[(t.tid,) + tuple(idx)])
    rec = REC
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
              for n in [f"i{c}" for c in LETTERS[:nloops]] + ["CNT", "O", "H"]]
    body.__signature__ = inspect.Signature(params)
    return body


def run_recorded(spec, loops, nthreads, shared_counter=False, eff=None):
    eff = eff or loops
    ends = [max(lp.end, lp.start + 1) for lp in eff]
    cnt = np.zeros((nthreads, 1, 1), np.int32)
    order = np.full(tuple(ends) + (1, 1), -1, np.int32)
    hits = np.zeros((nthreads,) + tuple(ends) + (1, 1), np.int32)
    # a shared counter is updated with lock xadd: a race the analysis would refuse, on purpose here
    k = kernel(spec, *loops, pool=pool_of(nthreads), races="allow" if shared_counter else "refuse")(
        recording_body(len(loops), shared_counter))
    k(cnt, order, hits)
    return order[..., 0, 0], hits[..., 0, 0], k


# -- an independent oracle of the spec semantics ------------------------------------------------

def oracle(spec_levels, loops, nthreads, mode, grid, schedule, run):
    """[(index tuple, owner tid or None)] in serial order."""
    out, x, hi = [], {}, {}
    counts = {}
    for lv in spec_levels:
        counts[lv[0]] = counts.get(lv[0], 0) + 1

    def rng(i):
        letter, occ, par, axis, teams = spec_levels[i]
        lp = loops[LETTERS.index(letter)]
        last = occ == counts[letter] - 1
        if occ == 0:
            lo, top = lp.start, lp.end
        else:
            p = (letter, occ - 1)
            lo, top = x[p], min(x[p] + lp.blocks[occ - 1], hi[p])
        return lo, top, lp.step if last else lp.blocks[occ]

    def walk(i, owner):
        if i == len(spec_levels):
            out.append((tuple(x[(c, counts[c] - 1)] for c in LETTERS[:len(loops)]), owner))
            return
        letter, occ, par, axis, teams = spec_levels[i]
        if mode == "collapse" and i == run[0]:
            members = list(range(run[0], run[1] + 1))
            rs = [rng(j) for j in members]
            for j, (lo, top, s) in zip(members, rs):
                hi[spec_levels[j][:2]] = top
            trips = [len(range(lo, top, s)) for lo, top, s in rs]
            n = int(np.prod(trips))
            for q, digits in enumerate(itertools.product(*[range(t) for t in trips])):
                for j, d, (lo, top, s) in zip(members, digits, rs):
                    x[spec_levels[j][:2]] = lo + d * s
                kind, chunk = schedule
                if kind == "dynamic":
                    who = None
                elif chunk:
                    who = (q // chunk) % nthreads
                else:
                    quot, rem = divmod(n, nthreads)
                    who = next(t for t in range(nthreads) if q < (t + 1) * quot + min(t + 1, rem))
                walk(run[1] + 1, who)
            return
        lo, top, s = rng(i)
        hi[(letter, occ)] = top
        vals = range(lo, top, s)
        for q, v in enumerate(vals):
            x[(letter, occ)] = v
            o = owner
            if axis:
                chunk = -(-len(vals) // teams)
                coord[axis] = q // chunk
                r, c, _ = grid
                o = coord["L"] * r * c + coord["R"] * c + coord["C"]
            walk(i + 1, o)
        if axis:
            coord[axis] = 0

    coord = {"R": 0, "C": 0, "L": 0}
    walk(0, 0 if mode != "collapse" else None)
    return out


# -- strategies -------------------------------------------------------------------------------

@st.composite
def loop_decls(draw):
    n = draw(st.integers(1, 4))
    loops = []
    for _ in range(n):
        step = draw(st.integers(1, 2))
        start = draw(st.integers(0, 3))
        trip = draw(st.integers(0 if n == 1 else 1, 9 if n < 3 else 5))
        blocks = draw(st.lists(st.integers(1, 4).map(lambda b: b * step), max_size=2))
        loops.append(Loop(start, start + trip * step - draw(st.integers(0, step - 1)), step, blocks))
    return loops


@st.composite
def specs(draw, loops, nthreads):
    """(spec text, levels, mode, grid, schedule, run, effective loops) for ``loops``."""
    eff = list(loops)
    seq = []
    bake = {}
    for k, lp in enumerate(loops):
        occ = draw(st.integers(1, len(lp.blocks) + 1))
        seq += [LETTERS[k]] * occ
        if draw(st.integers(0, 5)) == 0:          # bake this loop's bounds (same or shifted values)
            end = lp.end + draw(st.integers(0, 2)) * lp.step
            bake[LETTERS[k]] = f"[{lp.start},{end},{lp.step},({','.join(map(str, lp.blocks))})]"
            eff[k] = Loop(lp.start, end, lp.step, lp.blocks)
    seq = draw(st.permutations(seq))
    mode = draw(st.sampled_from(["serial", "collapse", "grid"]))
    par, axes, run, schedule, grid = set(), {}, None, ("static", 0), [1, 1, 1]
    if mode == "collapse":
        run = collapse_run(draw, seq)
        par = set(range(run[0], run[1] + 1))
        schedule = draw(st.sampled_from([("static", 0), ("static", 1), ("static", 3), ("dynamic", 0),
                                         ("dynamic", 2)]))
    elif mode == "grid":
        axes = grid_axes(draw, seq, nthreads)
        par = set(axes)
        for axis, teams in axes.values():
            grid["RCL".index(axis)] = teams
    first_par = min(par) if par else len(seq)
    barriers = set()
    for pos in range(len(seq)):
        ok = pos < first_par or (mode == "collapse" and pos == run[1]) or (mode == "grid" and pos == first_par)
        if ok and draw(st.integers(0, 4)) == 0:
            barriers.add(pos)
    text, levels, seen = "", [], {}
    for pos, c in enumerate(seq):
        occ = seen.get(c, 0)
        seen[c] = occ + 1
        text += c.upper() if pos in par else c
        if occ == 0 and c in bake:
            text += bake[c]
        if pos in axes:
            text += "{%s:%d}" % axes[pos]
        if pos in barriers:
            text += "|"
        axis, teams = axes.get(pos, ("", 1))
        levels.append((c, occ, pos in par, axis, teams))
    if mode == "collapse" and schedule != ("static", 0):
        text += f"@schedule({schedule[0]}{',' + str(schedule[1]) if schedule[1] else ''})"
    return text, levels, mode, tuple(grid), schedule, run, eff


# -- properties -------------------------------------------------------------------------------

@settings(max_examples=60)
@given(data=st.data())
def test_each_iteration_once_in_order_on_its_thread(data):
    loops = data.draw(loop_decls())
    nthreads = data.draw(st.sampled_from([1, 2, 3]))
    text, levels, mode, grid, schedule, run, eff = data.draw(specs(loops, nthreads))
    order, hits, k = run_recorded(text, loops, nthreads, eff=eff)
    expect = oracle(levels, eff, nthreads, mode, grid, schedule, run)
    want = np.zeros_like(hits)
    for idx, owner in expect:
        want[(owner if owner is not None else 0,) + idx] += 1
    if any(owner is None for _, owner in expect):        # dynamic: any thread, once in total
        assert (hits.sum(0) == want.sum(0)).all(), k.explain()
    else:
        assert (hits == want).all(), (text, k.explain())
    position = {idx: p for p, (idx, _) in enumerate(expect)}
    for t in range(nthreads):                              # each thread runs its share in serial order
        mine = [idx for idx in position if hits[(t,) + idx]]
        seq = sorted(mine, key=lambda idx: order[idx])
        assert [position[i] for i in seq] == sorted(position[i] for i in seq), text


def test_serial_spec_runs_in_spec_order():
    loops = [Loop(0, 5, blocks=[2]), Loop(1, 4)]
    order, hits, _ = run_recorded("aba", loops, 2)
    expect = oracle([("a", 0, False, "", 1), ("b", 0, False, "", 1), ("a", 1, False, "", 1)],
                    loops, 1, "serial", (1, 1, 1), ("static", 0), None)
    got = sorted(((order[idx], idx) for idx, _ in expect))
    assert [idx for _, idx in got] == [idx for idx, _ in expect]
    assert hits[1].sum() == 0                               # a serial spec runs on the calling thread only


def test_grid_gives_each_thread_its_blocks():
    loops = [Loop(0, 7), Loop(0, 4)]
    order, hits, _ = run_recorded("A{C:2}B{R:1}", loops, 2)
    assert hits[0, :4].all() and not hits[0, 4:].any()      # ceil(7/2) = 4 rows to column 0
    assert hits[1, 4:7].all() and not hits[1, :4].any()


def test_barrier_orders_phases():
    loops = [Loop(0, 6), Loop(0, 64)]
    for _ in range(3):
        order, hits, _ = run_recorded("aB|", loops, 2, shared_counter=True)
        first = order.min(axis=1)
        last = order.max(axis=1)
        assert (last[:-1] < first[1:]).all()
        assert (hits.sum(0) == 1).all()


def test_dynamic_schedule_inside_serial_loop():
    loops = [Loop(0, 5), Loop(0, 7, blocks=[3])]
    order, hits, _ = run_recorded("abB@schedule(dynamic,2)", loops, 2)
    assert (hits.sum(0)[:5, :7] == 1).all() and hits.sum() == 35


def test_grid_larger_than_pool_is_an_error():
    with pytest.raises(SpecError, match="grid"):
        run_recorded("A{R:2}B{C:2}", [Loop(0, 4), Loop(0, 4)], 2)


# -- every spec of the paper's enumerator compiles and runs -------------------------------------

GEMM_LOOPS = [Loop(0, 4), Loop(0, 6, blocks=[4, 2]), Loop(0, 5, blocks=[3, 2])]


def _check_all_once(text):
    order, hits, k = run_recorded(text, GEMM_LOOPS, get_pool().nthreads)
    assert (hits.sum(0)[:4, :6, :5] == 1).all() and hits.sum() == 120, text


@pytest.mark.parametrize("text", enumerate_specs("a_0_K,b_0_M,c_0_N"))
def test_unblocked_enumerated_specs(text):
    _check_all_once(text)


ALL = enumerate_union([("a", False), ("b", True), ("c", True)], {"b": 2, "c": 2})


@settings(max_examples=40)
@given(st.sampled_from(ALL))
def test_enumerated_specs_sample(text):
    _check_all_once(text)


def test_enumerator_counts():
    assert len(enumerate_specs("a_0_K,b_0_M,c_0_N")) == 16
    assert len(enumerate_specs("a_0_K,b_1_M,c_1_N")) == 168
    assert len(ALL) == 1040
    assert all(s[0] != s[1] for s in ALL if len(s) > 1)


def test_calls_from_several_python_threads():
    """Concurrent calls of one nest each get their own context block (arrays differ per thread)."""
    import threading
    loops = [Loop(0, 3), Loop(0, 5)]
    k = kernel("aB", *loops)(recording_body(2))
    nt = k.pool.nthreads
    results, errors = [], []

    def worker():
        try:
            for _ in range(30):
                cnt = np.zeros((nt, 1, 1), np.int32)
                order = np.full((3, 5, 1, 1), -1, np.int32)
                hits = np.zeros((nt, 3, 5, 1, 1), np.int32)
                k(cnt, order, hits)
                results.append(int(hits.sum()) == 15 and (hits.sum(0) == 1).all())
        except Exception as e:                      # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 90 and all(results)


def test_a_nest_updating_an_array_in_place_keeps_its_native_entry(monkeypatch):
    """f(x, x): the kernels' overlap check is not a nest's (its arrays may be read and written by
    one body); the call must not fall back to the Python launch (5x slower on small nests)."""
    import loops.decorator as decorator
    import tppasm as tpp
    relu = tpp.relu(4, 8)

    @kernel("a", Loop(0, 3))
    def f(i, x, y):
        relu(x[i], y[i])
    x = np.arange(-48, 48, dtype=np.float32).reshape(3, 4, 8)
    f(x, x)
    if f._last.entry is None:
        pytest.skip("no native nest entry on this host")
    slow = []
    monkeypatch.setattr(decorator._Instance, "run", lambda self, arrays: slow.append(arrays))
    f(x, x)
    assert not slow and not (x < 0).any()


def test_a_nest_of_more_than_six_arrays_keeps_its_native_entry(monkeypatch):
    """Past the six argument registers the stub writes the data pointers into the context block
    itself, once every array passed its checks: such a nest no longer takes the Python launch
    (~2 us per array a call); arrays it cannot vouch for (other strides, a read-only output, another
    dtype) still take the checked Python path, and a refused call leaves the next ones intact."""
    import loops.decorator as decorator
    import tppasm as tpp
    add = tpp.binary("add", 4, 8)

    @kernel("A", Loop(0, 3))
    def f(i, a, b, c, d, e, g, h, k, y):
        add(a[i], b[i], y[i])
        for x in (c, d, e, g, h, k):
            add(x[i], y[i], y[i])
    xs = [np.full((3, 4, 8), float(n), np.float32) for n in range(8)]
    y = np.full((3, 4, 8), np.nan, np.float32)
    f(*xs, y)
    assert (y == 28).all()
    if not decorator.NATIVE_CHECKS or decorator.ON_AARCH64:
        pytest.skip("no native nest entries on this host")
    assert f._last.entry is not None
    slow = []
    run = decorator._Instance.run
    monkeypatch.setattr(decorator._Instance, "run", lambda self, arrays: (slow.append(len(arrays)), run(self, arrays)))
    y[...] = np.nan
    f(*[x + 1 for x in xs], y)                               # new arrays, the same signature
    assert not slow and (y == 36).all()
    every_other = np.full((6, 4, 8), 5.0, np.float32)[::2]
    f(every_other, *xs[1:], y)                               # other strides: bound again, in Python
    assert slow == [9] and (y == 33).all()
    frozen = y.copy()
    frozen.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        f(*xs, frozen)
    with pytest.raises(ValueError, match="dtype float64, expected float32"):
        f(*xs, y.astype(np.float64))
    f(*xs, y)                                               # back to the first signature (one Python call)
    slow.clear()
    y[...] = np.nan
    f(*xs, y)
    assert not slow and (y == 28).all()
