"""The race checker (loops.races) against an oracle that shares none of its code.

Random nests (1-4 loops, steps that do not divide their spans, blockings, collapsed runs under
every schedule, 2-D and 3-D thread grids, barriers, ``if`` conditions, init/fini hooks) call tiny
TPPs on blocks whose indices are affine in the loop values and the thread id: 2x2 blocks of 4-D
arrays, overlapping and strided 2x2 windows of a 2-D array, a BRGEMM batch of 1-2 blocks, and a
fourth argument that is another view of the output (the same array, shifted, transposed,
reversed) or a view whose blocks overlap each other.

The oracle reads the spec with its own small parser, walks the nest as README's loop section
describes it (which thread or dynamic chunk runs each iteration, how many barriers precede it,
init before and fini after everything on each thread that takes part), takes each iteration's
footprint as the byte addresses of the NumPy views the body indexes (so aliasing needs no special
case), and calls two events *concurrent* when no barrier separates them and they are on different
threads (or, under a dynamic schedule, in different chunks, on any two different threads).
The checker must refuse exactly the specs the oracle finds a race in; a nest it accepts must
compute on 2 and 3 threads, bit for bit, what the serial order of its spec computes; and every
fix a RaceError names must be race-free to the oracle and compute the serial result.
"""
import functools
import itertools
import re
import types

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

import tppasm as tpp
from loops import Loop, kernel, thread
from loops.races import RaceError, check
from tests.loops.spec_draws import collapse_run, grid_axes
from tests.support import pool_of

KERNELS = {"copy": tpp.copy(2, 2), "zero": tpp.zero(2, 2), "add": tpp.binary("add", 2, 2),
           "gemm": tpp.brgemm(2, 2, 2, beta=1)}
VMAX = 10                  # the largest loop value drawn (loop_decl keeps trips under it)
D = 2 * VMAX + 2           # 4-D arrays are (D, D, 2, 2): every index form below stays inside
ZR = 2 * VMAX + 4          # Z is (ZR, ZR): windows Z[e:e+4:2, f:f+2]
NAMES = ("X", "Y", "Z", "W")
ALIASES = ("none", "same", "shift", "transposed", "reversed", "selfoverlap")


# -- the body: calls on blocks affine in the loop values ------------------------------------------

FORMS = {"v": lambda f, x, t: x[f[1]], "v+1": lambda f, x, t: x[f[1]] + 1, "2v": lambda f, x, t: x[f[1]] * 2,
         "v+w": lambda f, x, t: x[f[1]] + x[f[2]], "rev": lambda f, x, t: x[f[1]] * -1 + VMAX,
         "tid": lambda f, x, t: t.tid, "tid+1": lambda f, x, t: t.tid + 1, "col": lambda f, x, t: t.col,
         "row": lambda f, x, t: t.row, "c": lambda f, x, t: f[1]}
CONDS = {"eq": lambda c, x, t: x[c[1]] == c[2], "ne": lambda c, x, t: x[c[1]] != c[2],
         "lt": lambda c, x, t: x[c[1]] < c[2], "eqv": lambda c, x, t: x[c[1]] == x[c[2]],
         "sumge": lambda c, x, t: x[c[1]] + x[c[2]] >= c[3], "tid": lambda c, x, t: t.tid == c[1]}


def ev(form, x, t):
    """Index ``form`` at loop values ``x`` (ints or traced indices) and thread coordinates ``t``."""
    return FORMS[form[0]](form, x, t)


def holds(cond, x, t):
    return CONDS[cond[0]](cond, x, t)


def view(arrays, operand, x, t, count):
    """The block an operand names: arrays is a dict name -> array (or traced view)."""
    name, f1, f2, strided = operand
    e1, e2 = ev(f1, x, t), ev(f2, x, t)
    a = arrays[name]
    if name == "Z":
        return a[e1:e1 + 4:2, e2:e2 + 2] if strided else a[e1:e1 + 2, e2:e2 + 2]
    return a[e1, e2:e2 + count] if count else a[e1, e2]


ROLES = {"copy": ("r", "w"), "zero": ("w",), "add": ("r", "r", "w"), "gemm": ("r", "r", "rw")}


def calls_made(program, x, t, arrays):
    """(kind, operand views, count) of each call ``program`` makes at ``x`` on thread ``t``."""
    for kind, ops, cond, count in program:
        if cond is None or holds(cond, x, t):
            yield kind, [view(arrays, op, x, t, count if (kind == "gemm" and i < 2) else 0)
                         for i, op in enumerate(ops)], count


def run_calls(program, x, t, arrays):
    """Execute (or, while tracing, record) the calls of ``program``."""
    for kind, views, count in calls_made(program, x, t, arrays):
        if kind == "gemm":
            KERNELS["gemm"](*views, count=count)
        else:
            kernel_for(kind, tuple(v.strides[0] // 4 for v in views))(*views)


@functools.lru_cache(maxsize=None)
def kernel_for(kind, lds):
    """The 2x2 kernel of ``kind`` for operands whose rows are ``lds`` elements apart (Z's windows)."""
    return {"copy": lambda: tpp.copy(2, 2, ldx=lds[0], ldo=lds[-1]), "zero": lambda: tpp.zero(2, 2, ldo=lds[0]),
            "add": lambda: tpp.binary("add", 2, 2, lda=lds[0], ldb=lds[1], ldo=lds[2])}[kind]()


def make_body(nloops, program):
    """A body taking one index per loop (i0, i1, ...) then X, Y, Z, W (bodies take no *args)."""
    names = "".join(f"i{k}, " for k in range(nloops))
    env = {"run_calls": run_calls, "program": program, "thread": thread}
    exec(f"def body({names}X, Y, Z, W):\n    run_calls(program, ({names}), thread(), dict(X=X, Y=Y, Z=Z, W=W))", env)
    return env["body"]


def make_arrays(alias, seed=0):
    """(X, Y, Z, W) with small integer values (sums are exact in any order)."""
    rng = np.random.default_rng(seed)
    ints = lambda shape: rng.integers(-3, 4, shape).astype(np.float32)
    X = ints((D, D, 2, 2))
    Z = ints((ZR, ZR))
    if alias == "shift":
        buf = ints((D + 1, D, 2, 2))
        return X, buf[:D], Z, buf[1:]
    if alias == "selfoverlap":
        s1 = 2 * D + 4                                    # W[i, j] and W[i + 1, j] share 2 elements
        buf = ints(s1 * D + 2 * D + 4)
        W = np.lib.stride_tricks.as_strided(buf, (D, D, 2, 2), (8, 4 * s1, 8, 4), writeable=True)
        return X, ints((D, D, 2, 2)), Z, W
    Y = ints((D, D, 2, 2))
    W = {"none": lambda: ints((D, D, 2, 2)), "same": lambda: Y, "transposed": lambda: Y.transpose(1, 0, 2, 3),
         "reversed": lambda: Y[::-1]}[alias]()
    return X, Y, Z, W


def snapshot(arrays):
    """Copies of the arrays' contents, for bit-for-bit comparison."""
    return [np.array(a, copy=True) for a in arrays]


# -- the oracle: its own reading of the spec -------------------------------------------------------

TOKEN = re.compile(r"([a-zA-Z])(?:\[([^\]]*)\])?(?:\{([RCL]):([0-9]+)\})?(\|)?")


def read_spec(text, loops=()):
    """(levels, mode, run, (kind, chunk), grid, loops with the baked bounds) from a spec text,
    independently of loops.spec. A level is a namespace: loop, occ, last, par, axis, teams, barrier."""
    body, _, sched = text.partition("@")
    levels, pos, seen, loops = [], 0, {}, list(loops)
    while pos < len(body):
        m = TOKEN.match(body, pos)
        assert m, text
        k = ord(m.group(1).lower()) - ord("a")
        levels.append(types.SimpleNamespace(loop=k, occ=seen.get(k, 0), par=m.group(1).isupper(),
                                            axis=m.group(3) or "", teams=int(m.group(4) or 1),
                                            barrier=bool(m.group(5))))
        if m.group(2) is not None and loops:             # [start,end,step,(blocks)], empty fields kept
            fields = re.fullmatch(r"([^,]*),([^,]*),([^,]*),\(([^)]*)\)", m.group(2)).groups()
            lp = loops[k]
            start, end, step = (int(f) if f.strip() else old for f, old in zip(fields, (lp.start, lp.end, lp.step)))
            blocks = tuple(int(b) for b in fields[3].split(",")) if fields[3].strip() else lp.blocks
            loops[k] = types.SimpleNamespace(start=start, end=end, step=step, blocks=blocks)
        seen[k] = seen.get(k, 0) + 1
        pos = m.end()
    for lv in levels:
        lv.last = lv.occ == seen[lv.loop] - 1
    kind, chunk = "static", 0
    if sched:
        m = re.fullmatch(r"schedule\((static|dynamic)(?:,([0-9]+))?\)", sched)
        kind, chunk = m.group(1), int(m.group(2) or 0)
    par = [i for i, lv in enumerate(levels) if lv.par]
    if not par:
        return levels, "serial", None, (kind, chunk), (1, 1, 1), loops
    if any(lv.axis for lv in levels):
        grid = {lv.axis: lv.teams for lv in levels if lv.axis}
        return levels, "grid", None, (kind, chunk), tuple(grid.get(a, 1) for a in "RCL"), loops
    last = par[0]
    while last + 1 < len(levels) and levels[last + 1].par:
        last += 1
    return levels, "collapse", (par[0], last), (kind, chunk), (1, 1, 1), loops


def walk(text, loops, T):
    """Every body iteration as (values, thread or None, dynamic chunk or None, barriers before it),
    the barriers in all, and the threads that take part (run init, body and fini)."""
    levels, mode, run, (kind, chunk), (R, C, L), loops = read_spec(text, loops)
    events, state = [], {"phase": 0, "instance": 0}
    val, top, coord = {}, {}, {"R": 0, "C": 0, "L": 0}

    def rng(lv):          # an inner block runs inside the outer one's, clamped to where that one ends
        lp, out = loops[lv.loop], (lv.loop, lv.occ - 1)
        lo, hi = (lp.start, lp.end) if lv.occ == 0 else (val[out], min(val[out] + lp.blocks[lv.occ - 1], top[out]))
        return lo, hi, (lp.step if lv.last else lp.blocks[lv.occ])

    def body(owner, dyn):
        x = tuple(val[k, max(lv.occ for lv in levels if lv.loop == k)] for k in range(len(loops)))
        owner = coord["L"] * R * C + coord["R"] * C + coord["C"] if mode == "grid" else owner
        events.append((x, owner, dyn, state["phase"]))

    def go(i, owner, dyn):
        if i == len(levels):
            return body(owner, dyn)
        if mode == "collapse" and i == run[0]:
            members = levels[run[0]:run[1] + 1]
            ranges = [rng(lv) for lv in members]
            top.update({(lv.loop, lv.occ): r[1] for lv, r in zip(members, ranges)})
            values = list(itertools.product(*[range(*r) for r in ranges]))
            n, state["instance"] = len(values), state["instance"] + 1
            for q, vs in enumerate(values):
                val.update({(lv.loop, lv.occ): v for lv, v in zip(members, vs)})
                if kind == "dynamic":
                    who, dyn = None, (state["instance"], q // (chunk or 1))
                elif chunk:
                    who = (q // chunk) % T
                else:                      # OpenMP static: contiguous, the first n % T threads get one more
                    who = next(t for t in range(T) if q < (t + 1) * (n // T) + min(t + 1, n % T))
                go(run[1] + 1, who, dyn)
            state["phase"] += members[-1].barrier               # '|' after the run: after all of it
            return
        lv = levels[i]
        values = range(*rng(lv))
        top[lv.loop, lv.occ] = values.stop
        for p, v in enumerate(values):
            val[lv.loop, lv.occ] = v
            if lv.axis:                          # a team's contiguous share: ceil(trip / teams) values
                coord[lv.axis] = p // -(-len(values) // lv.teams)
            go(i + 1, owner, dyn)
        state["phase"] += lv.barrier             # runs even when this loop was empty, not when an outer one was

    go(0, 0, None)
    active = 1 if mode == "serial" else (R * C * L if mode == "grid" else T)
    return events, state["phase"], active, mode, kind == "dynamic" and mode == "collapse", (R, C, L)


def addresses(v):
    base = v.__array_interface__["data"][0]
    off = np.zeros((), np.int64)
    for n, s in zip(v.shape, v.strides):
        off = np.add.outer(off, np.arange(n, dtype=np.int64) * s)
    return (base + off).ravel().tolist()


def footprint(program, x, t, arrays):
    """(read addresses, written addresses) of one run of ``program``; elements are float32 at
    addresses that are multiples of 4, so two elements overlap exactly when their addresses match."""
    reads, writes = set(), set()
    for kind, views, _ in calls_made(program, x, t, dict(zip(NAMES, arrays))):
        for v, role in zip(views, ROLES[kind]):
            for what in role:
                (reads if what == "r" else writes).update(addresses(v))
    return reads, writes


def clash(p, q):
    return bool(p[1] & (q[0] | q[1]) or q[1] & p[0])


def coords(t, grid):
    """thread() of thread ``t`` (the grid coordinates are 0 off a grid, where grid is (1, 1, 1))."""
    R, C, L = grid
    return types.SimpleNamespace(tid=t, col=t % C, row=t % (R * C) // C, layer=t // (R * C) if L > 1 else 0)


def oracle(text, loops, program, init, fini, arrays, T):
    """The races of the nest: [(a, b)] with a, b an iteration's values or ('init'|'fini', thread)."""
    events, barriers, active, mode, dynamic, grid = walk(text, loops, T)
    if mode == "serial" or active < 2:
        return []
    cache, programs = {}, {"init": (init, ()), "fini": (fini, ())}

    def fp(what, t):
        if (what, t) not in cache:
            prog, x = programs.get(what, (program, what))
            cache[what, t] = footprint(prog, x, coords(t, grid), arrays)
        return cache[what, t]

    threads = range(T)
    found = []
    for (x, tx, cx, px), (y, ty, cy, py) in itertools.combinations(events, 2):
        if px != py:
            continue
        if dynamic:
            if cx != cy and any(clash(fp(x, t), fp(y, u)) for t in threads for u in threads if t != u):
                found.append((x, y))
        elif tx != ty and clash(fp(x, tx), fp(y, ty)):
            found.append((x, y))
    hooks = [("init", t, 0) for t in range(active) if init] + [("fini", t, barriers) for t in range(active) if fini]
    for what, t, phase in hooks:
        for x, tx, _, px in events:
            if px != phase:
                continue
            others = [u for u in threads if u != t] if dynamic else ([tx] if tx != t else [])
            if any(clash(fp(x, u), fp(what, t)) for u in others):
                found.append((x, (what, t)))
    for (w1, t1, p1), (w2, t2, p2) in itertools.combinations(hooks, 2):
        if t1 != t2 and p1 == p2 and clash(fp(w1, t1), fp(w2, t2)):
            found.append(((w1, t1), (w2, t2)))
    return found


# -- drawing nests ---------------------------------------------------------------------------------


@st.composite
def index_form(draw, nloops, threads=True, loops=True):
    kinds = (["v"] * 6 + ["v+1", "v+1", "2v", "rev", "v+w"] if loops and nloops else []) + ["c", "c"] + \
        (["tid", "tid", "tid+1", "col", "row"] if threads else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "c":
        return ("c", draw(st.integers(0, 1)))
    if kind in ("tid", "tid+1", "col", "row"):       # the thread's coordinates
        return (kind,)
    k = draw(st.integers(0, nloops - 1))
    return (kind, k, draw(st.integers(0, nloops - 1))) if kind == "v+w" else (kind, k)


@st.composite
def call(draw, nloops, threads=True, hook=False):
    kind = draw(st.sampled_from(["copy", "zero", "add", "gemm"]))
    form = lambda: draw(index_form(nloops, threads, loops=not hook))

    def operand(output):
        names = ["Y", "Z", "W"] if output else ["X", "X", "Y", "Z", "W"]
        if kind == "gemm":                 # batches of X and Y blocks, C a block of Y or W
            names = ["Y", "W"] if output else ["X", "X", "Y"]
        return (draw(st.sampled_from(names)), form(), form(), draw(st.booleans()))
    n_in = {"copy": 1, "zero": 0, "add": 2, "gemm": 2}[kind]
    ops = [operand(False) for _ in range(n_in)] + [operand(True)]
    if kind == "add" and draw(st.booleans()):
        ops[2] = ops[1] = (ops[2][0] if ops[2][0] != "X" else "Y",) + ops[2][1:]    # in place: out is b
    cond = None
    if hook and threads and draw(st.integers(0, 2)) == 0:
        cond = ("tid", draw(st.integers(0, 2)))
    elif not hook and nloops and draw(st.integers(0, 2)) == 0:
        k, l = draw(st.integers(0, nloops - 1)), draw(st.integers(0, nloops - 1))
        c = draw(st.integers(0, 4))
        cond = draw(st.sampled_from([("eq", k, c), ("ne", k, c), ("lt", k, c), ("eqv", k, l), ("sumge", k, l, c)]
                                    + ([("tid", c % 3)] if threads else [])))
    count = draw(st.integers(1, 2)) if kind == "gemm" else 0
    return (kind, tuple(ops), cond, count)


SHIFTED = {"v": "v+1", "v+1": "v"}


@st.composite
def sibling(draw, first):
    """``first`` with one index of its output shifted by a constant: a call the checker merges
    with ``first`` into one block covering both before it looks at each."""
    kind, ops, cond, count = first
    name, f1, f2, strided = ops[-1]
    axis = draw(st.integers(0, 1))
    form = (f1, f2)[axis]
    form = ("c", 1 - form[1]) if form[0] == "c" else (SHIFTED.get(form[0], form[0]),) + form[1:]
    out = (name,) + ((form, f2) if axis == 0 else (f1, form)) + (strided,)
    return (kind, ops[:-1] + (out,), cond if draw(st.booleans()) else None, count)


@st.composite
def loop_decl(draw, allow_empty, max_trip, nblocks=None):
    step = draw(st.sampled_from([1, 1, 2, 3]))
    start = draw(st.sampled_from([0, 0, 1]))
    trip = draw(st.sampled_from(([0] if allow_empty else []) + list(range(1, max_trip + 1)) + [max_trip]))
    trip = min(trip, (VMAX - start) // step + 1)               # every value stays <= VMAX
    cut = draw(st.integers(0, step - 1)) if trip else 0       # a last step that overshoots the end
    blocks = draw(st.lists(st.integers(1, 3), min_size=nblocks or 0, max_size=2 if nblocks is None else nblocks))
    return Loop(start, start + trip * step - cut, step, [b * step for b in blocks])


@st.composite
def spec_text(draw, loops, max_trip, max_grid=3):
    seq, bake = [], {}
    for k, lp in enumerate(loops):
        seq += [k] * draw(st.integers(1, len(lp.blocks) + 1))
        if draw(st.integers(0, 7)) == 0:                     # bake other bounds into the spec
            b = draw(loop_decl(False, max_trip, len(lp.blocks)))
            bake[k] = f"[{b.start},{b.end},{b.step},({','.join(map(str, b.blocks))})]"
    seq = draw(st.permutations(seq))
    mode = draw(st.sampled_from(["collapse", "collapse", "grid", "serial"]))
    par, axes, run, sched = set(), {}, None, ""
    if mode == "collapse":
        run = collapse_run(draw, seq)
        par = set(range(run[0], run[1] + 1))
        sched = draw(st.sampled_from(["", "", "@schedule(static)", "@schedule(static,1)", "@schedule(static,2)",
                                      "@schedule(dynamic)", "@schedule(dynamic,1)", "@schedule(dynamic,2)"]))
    elif mode == "grid":
        axes = grid_axes(draw, seq, max_grid)
        par = set(axes)
    first = min(par) if par else len(seq)
    text, seen = "", {}
    for pos, k in enumerate(seq):
        letter = chr(ord("a") + k)
        text += letter.upper() if pos in par else letter
        if k in bake and k not in seen:
            text += bake[k]
        seen[k] = True
        if pos in axes:
            text += "{%s:%d}" % axes[pos]
        legal = pos <= first if mode == "grid" else (pos < first or (run is not None and pos == run[1]))
        if legal and draw(st.integers(0, 3)) == 0:
            text += "|"
    return text + sched


@st.composite
def nests(draw, threads=True, hooks=True, allow_empty=True):
    nloops = draw(st.sampled_from([1, 2, 2, 3, 3, 3, 4]))
    max_trip = 6 if nloops < 3 else (4 if nloops == 3 else 3)
    loops = [draw(loop_decl(allow_empty, max_trip)) for _ in range(nloops)]
    program = draw(st.lists(call(nloops, threads), min_size=1, max_size=3))
    if draw(st.integers(0, 3)) == 0:
        program.append(draw(sibling(program[0])))
    program = tuple(program)
    init = fini = ()
    if hooks and draw(st.integers(0, 2)) == 0:
        init = tuple(draw(st.lists(call(nloops, True, hook=True), max_size=1)))
        fini = tuple(draw(st.lists(call(nloops, True, hook=True), max_size=1)))
    alias = draw(st.sampled_from(ALIASES))
    return loops, draw(spec_text(loops, max_trip)), program, init, fini, alias


def build(loops, text, program, init, fini, pool=None, races="refuse"):
    lk = kernel(text, *loops, pool=pool, races=races)(make_body(len(loops), program))
    for hook, calls in ((lk.init, init), (lk.fini, fini)):
        if calls:
            hook(lambda X, Y, Z, W, calls=calls: run_calls(calls, (), thread(), dict(X=X, Y=Y, Z=Z, W=W)))
    return lk


def serial_text(text):
    """The spec run serially in the same order: lower case, no grid, barrier or schedule."""
    return re.sub(r"\{[^}]*\}|\||@.*", "", text).lower()


def needs(text):
    """Threads a grid spec needs (1 for the others)."""
    _, mode, _, _, (R, C, L), _ = read_spec(text)
    return R * C * L if mode == "grid" else 1


# -- the differential properties -----------------------------------------------------------------

def compare(case, T):
    """Assert the checker and the oracle agree on ``case`` on ``T`` threads; the oracle's races."""
    loops, text, program, init, fini, alias = case
    lk = build(loops, text, program, init, fini, races="allow")
    arrays = make_arrays(alias)
    found = check(lk, arrays, nthreads=T)
    expect = oracle(text, loops, program, init, fini, arrays, T)
    shown = (text, T, alias, program, init, fini, loops)
    assert found or not expect, ("checker missed a race", shown, expect[:3])
    assert expect or not found, ("checker refused a race-free nest", shown, [str(c) for c in found][:2])
    pairs = {frozenset([a, b]) for a, b in expect if isinstance(a[0], int) and isinstance(b[0], int)}
    for c in found:                                          # a reported pair of iterations is a race
        if c.first.where == c.second.where == "body":
            a, b = (tuple(at[n] for n in lk.index_names) for at in (c.at_first, c.at_second))
            assert frozenset([a, b]) in pairs, ("reported pair is no race", shown, str(c))
    return expect


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nests())
def test_the_checker_finds_a_race_exactly_when_the_oracle_does(case):
    text = case[1]
    for T in (2, 3):
        if needs(text) <= T:
            expect = compare(case, T)
            event(f"{read_spec(text)[1]}, race: {bool(expect)}")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nests(threads=False, hooks=False, allow_empty=False))
def test_accepted_nests_compute_the_serial_result_and_refused_ones_name_working_fixes(case):
    loops, text, program, _, _, alias = case
    serial = build(loops, serial_text(text), program, (), ())
    arrays = make_arrays(alias)
    serial(*arrays)
    expect = snapshot(arrays)
    for T in (2, 3):
        if needs(text) > T:
            continue
        lk = build(loops, text, program, (), (), pool=pool_of(T))
        racy = oracle(text, loops, program, (), (), make_arrays(alias), T)
        try:
            lk(*make_arrays(alias))                                  # binds it: RaceError when refused
        except RaceError as e:
            assert racy, (text, T, "refused without a race", str(e))
            assert e.conflicts and "fix:" in str(e) and all(repr(fix) in str(e) for fix in e.fixes)
            for fix in e.fixes:                  # race-free, and computes its serial order (which may differ)
                assert not oracle(fix, loops, program, (), (), make_arrays(alias), T), (text, fix, T)
                want = make_arrays(alias)
                build(loops, serial_text(fix), program, (), ())(*want)
                computes(lk.with_spec(fix), alias, snapshot(want), 2, f"fix {fix} of {text} on {T} threads")
            continue
        assert not racy, ("accepted with a race", text, T, alias, program, racy[:2])
        computes(lk, alias, expect, 6 if "dynamic" in text else 3, f"{text} on {T} threads")


def computes(lk, alias, expect, runs, what):
    """``lk`` run ``runs`` times on fresh arrays leaves them equal to ``expect``, bit for bit."""
    for seed in range(runs):
        arrays = make_arrays(alias)
        lk(*arrays)
        for got, want in zip(snapshot(arrays), expect):
            np.testing.assert_array_equal(got, want, err_msg=f"{what}, run {seed}")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nests(threads=False, hooks=False, allow_empty=False), st.sampled_from([2, 3]))
def test_the_oracle_puts_each_iteration_on_the_thread_the_nest_runs_it_on(case, T):
    """The oracle's reading of the spec against the native nest: each iteration writes its thread's
    id into a block of its own, so every iteration ran once, on the thread the oracle names (any
    thread under a dynamic schedule)."""
    loops, text, _, _, _, _ = case
    if needs(text) > T:
        return
    names = ", ".join(f"i{k}" for k in range(len(loops)))
    env = {"copy": KERNELS["copy"], "thread": thread}
    exec(f"def body({names}, Ids, Y):\n    copy(Ids[thread().tid], Y[{names}])\n", env)
    Ids = np.repeat(np.arange(T, dtype=np.float32), 4).reshape(T, 2, 2)
    Y = np.full((VMAX + 1,) * len(loops) + (2, 2), -1, np.float32)
    kernel(text, *loops, pool=pool_of(T))(env["body"])(Ids, Y)
    events, _, _, mode, dynamic, _ = walk(text, loops, T)
    ran = {tuple(x) for x in np.argwhere(Y[..., 0, 0] >= 0).tolist()}
    assert ran == {x for x, *_ in events}, text                   # the iterations the oracle walks, no other
    for x, owner, _, _ in events:
        assert (Y[x] == Y[x][0, 0]).all()
        if mode != "serial" and not dynamic:
            assert Y[x][0, 0] == owner, (text, T, x, Y[x][0, 0], owner)


# -- cases kept as plain tests: bugs the oracle found, and what mutants of the checker missed --------

def _op(name, f1, f2, strided=False):
    return (name, f1, f2, strided)


def _zero(*index, name="Y"):
    return (("zero", (_op(name, *index),), None, 0),)


V0, V1, V2, C0, TID, TID1 = ("v", 0), ("v", 1), ("v", 2), ("c", 0), ("tid",), ("tid+1",)
ZERO_Y0 = _zero(C0, C0)[0]
EMPTY = [Loop(0, 0), Loop(0, 2), Loop(0, 2)]
GEMM = (("zero", (_op("Y", V1, V2),), ("eq", 0, 0), 0),                     # C[im, jn] = sum over k
        ("gemm", (_op("X", V1, V0), _op("X", V2, V0), _op("Y", V1, V2)), None, 1))
TRICKY = [
    # an as_strided W whose blocks W[i, j] and W[i + 1, j] share bytes (the checker compared axes)
    ([Loop(0, 4)], "A", (("copy", (_op("X", V0, C0), _op("W", V0, C0)), None, 0),), (), (), "selfoverlap", 2, True),
    ([Loop(0, 4)], "A", (("copy", (_op("X", V0, C0), _op("W", V0, C0)), None, 0),), (), (), "reversed", 2, False),
    # a barrier inside an empty loop a never runs: thread 0's fini (Y[1]) may meet thread 1's init (Y[1])
    *[([Loop(0, end)] + EMPTY[1:], spec, _zero(V1, V2, name="W"), _zero(TID, C0), _zero(TID1, C0), "none", 2, racy)
      for spec in ("ab|C", "aB|c", "aB{R:2}|c", "aBC|@schedule(dynamic)") for end, racy in ((0, True), (1, False))],
    (EMPTY[:2], "a|B", _zero(V1, C0, name="W"), _zero(TID, C0), _zero(TID1, C0), "none", 2, False),   # it runs
    # the thread of 'A{C:1}A{R:2}' is not monotone in a (0, 1, 0 for a = 0, 1, 2): every value counts
    ([Loop(0, 3, 1, [2])], "A{C:1}A{R:2}", (ZERO_Y0,), (), (), "none", 2, True),
    # an init hook writing only blocks its own thread's iterations read
    ([Loop(0, 2)], "A", (("copy", (_op("Y", V0, C0), _op("W", V0, C0)), None, 0),), _zero(TID, C0), (), "none", 3,
     False),
    ([Loop(0, 2)], "A@schedule(dynamic)", (("copy", (_op("Y", V0, C0), _op("W", V0, C0)), None, 0),), _zero(TID, C0),
     (), "none", 2, True),
    # two calls on neighbouring blocks, which the checker first merges into one covering block
    ([Loop(0, 4)], "A", _zero(V0, C0) + _zero(("v+1", 0), C0), (), (), "none", 2, True),
    ([Loop(0, 4, 2)], "A", _zero(V0, C0) + _zero(("v+1", 0), C0), (), (), "none", 2, False),
    # README's GEMM: a dynamic schedule over several k steps races; a barrier after the run does not
    ([Loop(0, 3), Loop(0, 2), Loop(0, 2)], "aBC@schedule(dynamic,1)", GEMM, (), (), "none", 2, True),
    ([Loop(0, 3), Loop(0, 2), Loop(0, 2)], "aBC|@schedule(dynamic,1)", GEMM, (), (), "none", 2, False),
    ([Loop(0, 3), Loop(0, 2), Loop(0, 2)], "aB{R:2}C{C:1}", GEMM, (), (), "none", 3, False),
    ([Loop(0, 3), Loop(0, 2), Loop(0, 2)], "ABC@schedule(static,3)", GEMM, (), (), "none", 2, True),
]


@pytest.mark.parametrize("case", TRICKY, ids=lambda c: f"{c[1]}-{c[5]}-{c[7]}")
def test_cases_the_oracle_and_mutants_of_the_checker_found(case):
    *nest, T, racy = case
    assert bool(compare(tuple(nest), T)) == racy


def test_blocks_of_a_self_overlapping_argument_are_compared_as_bytes():
    """Found by the oracle: an argument whose strides put two indices on one address (an
    ``as_strided`` view, writable) had its blocks compared per axis, where Y[i] and Y[i + 1] look
    apart, so 'A' was accepted although iterations i and i + 1 write 2 shared elements."""
    copy = KERNELS["copy"]
    buf = np.zeros(64, np.float32)
    Y = np.lib.stride_tricks.as_strided(buf, (6, 2, 2), (8, 8, 4), writeable=True)   # Y[i][1] is Y[i + 1][0]
    X = np.arange(24, dtype=np.float32).reshape(6, 2, 2)
    k = kernel("A", Loop(0, 6), pool=pool_of(2))(lambda i, X, Y: copy(X[i], Y[i]))
    found = check(k, (X, Y), nthreads=2)
    assert found and abs(found[0].at_first["i"] - found[0].at_second["i"]) == 1, [str(c) for c in found]
    with pytest.raises(RaceError, match="data race"):
        k(X, Y)
    k.with_spec("a")(X, Y)                                  # serially: each later block overwrites the last
    assert buf[:14].tolist() == [0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 22, 23]
    apart = np.lib.stride_tricks.as_strided(buf, (6, 2, 2), (32, 8, 4), writeable=True)   # gaps, no overlap
    assert check(k, (X, apart), nthreads=2) == [] and check(k, (X, np.zeros((12, 2, 2), np.float32)[::-2]),
                                                                nthreads=2) == []
