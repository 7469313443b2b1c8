"""Search loop specs, block sizes and build knobs for a loop kernel; remember the fastest.

Two entry points:

- ``lk.tune(*arrays, ...)`` (:func:`tune`): the specs of one loop kernel; with ``blocks=True`` also
  the block sizes of each loop, baked into the spec text (``"aB[,,,(8)]Cb"``), so the result is
  still one spec string. The best is remembered in ``lk`` for these shapes and used by its calls.
- :func:`search` also searches knobs that change how the kernel is built: ``make(**config)``
  returns ``(loop kernel, arrays)`` or ``(loop kernel, arrays, output)`` (``output()`` = the result
  in a layout that does not depend on the knobs, e.g. the unblocked C of a GEMM), and ``knobs``
  maps each parameter of ``make`` to the values to try.

Candidates (knob values x specs x block sizes) are ranked by the cost model (:mod:`loops.cost`,
``model=True``), then timed best-predicted first until ``top`` were timed (a candidate skipped
as refused, racing or giving a different result does not count) or ``seconds`` are spent;
the fastest few are timed again in rounds and the lowest median wins. A timing is the minimum of
``reps`` runs after a checking run, scaled by the machine's speed of the moment (the reference
timed again every ``probe`` seconds, :class:`loops.trial.Probe`). Each candidate starts from the
same array contents as the reference run (the first knob values and the kernel's own spec;
the arrays the nest writes but never reads poisoned with NaN when the reference overwrites them all)
and a result that differs from the reference's is reported and never picked. Results are remembered
per (kernel, shapes, dtypes, host, threads) and search (make, body, knobs, specs) in
:data:`REMEMBERED` as plain JSON-able dicts, and on disk for later processes (:mod:`loops.remembered`);
a repeated search returns the remembered record, or with ``resume=True`` searches on from it.

>>> import numpy as np
>>> from tppasm.eltwise import Unary
>>> from tppasm.kernel import get_kernel
>>> from loops import Loop, kernel
>>> relu = get_kernel(Unary("relu", 8, 8))
>>> @kernel("ab", Loop(0, 4), Loop(0, 4))
... def k(i, j, X, Y):
...     relu(X[i, j], Y[i, j])
>>> X = np.random.randn(4, 4, 8, 8).astype(np.float32); Y = np.empty_like(X)
>>> best = k.tune(X, Y, budget=3, reps=1, progress=False)
>>> best in [r[0] for r in k.last_tuning]
True
"""
import inspect
import itertools
import random
import time
from dataclasses import dataclass, field

import numpy as np
from tppasm.display import printable

from . import remembered
from .enumerate import enumerate_union, iter_spec_space
from .knob_grid import Grid
from .signature import signature
from .spec import LETTERS, SpecError
from .trace import TraceError
from .trial import Builds, Candidate, Probe, elapsed, measure, time_again  # noqa: F401  (elapsed: tuning API)
from .tune_options import check_hints, check_options, check_search_space
from .tune_keywords import check_keywords
from .tune_order import SKIPS_PER_SLOT, Order, explored as _explored, predicted as _predicted
from .tune_progress import Progress

REMEMBERED = {}          # key (tuple) -> record (JSON-able dict) of every search in this process
_SPACES = {}             # key -> what the search under it covered (its disk key): a record serves only that
EXPLORED = 4096          # candidates a record lists as timed (digests), so a resumed search times others
# A candidate replaces the reference only when its playoff median is this much faster: on a shared
# VM a 1% win is noise, and a spec with many short parallel regions that won so (22 regions per
# 1000x700x300 GEMM on 2 threads: 2.25 against the reference's 2.28 ms) then ran at half speed in
# the bench's final rounds, where the reference held its speed.
MARGIN = 0.02
_KERNEL_SECONDS = {}     # (descriptor, isa, scalars) -> seconds of one hot call
# Budgets under this many seconds search without the cost model: building it (the host's bandwidths,
# each kernel timed) takes 0.4-1.5 s the first time, and a 0.2 s search took 1-4 s with it.
MODEL_SECONDS = 2.0


@dataclass(eq=False)
class Tuned:
    """What :func:`search` found: the ``record`` (JSON-able), every ``candidates``' figures, and the
    winner built: ``kernel`` (its loop kernel with the best spec), ``arrays``, ``output``. Its repr
    is one line: the winner, its time and how many candidates were timed and skipped. ``==`` is
    identity (as for kernels; comparing ``record`` says whether two searches agree)."""

    record: dict
    candidates: list = field(default_factory=list)
    kernel: object = None
    arrays: tuple = ()
    output: object = None

    def __call__(self):
        """Run the winner on its arrays."""
        self.kernel(*self.arrays)

    def __repr__(self):
        """One line (a notebook shows it for ``found``): the winner, its time and the counts; the
        candidates and arrays stay in the attributes.

        >>> Tuned({"kernel": "gemm", "spec": "aBC", "knobs": {"bm": 32}, "seconds": 0.00125, "candidates": 9315,
        ...        "timed": 40, "skipped": 3})
        Tuned(gemm: spec 'aBC' bm=32, 1.250 ms; 40 of 9315 candidates timed, 3 skipped)
        """
        r = self.record
        knobs = "".join(f" {k}={v!r}" for k, v in (r.get("knobs") or {}).items())
        seconds = r.get("seconds")
        took = f"{seconds * 1e3:.3f} ms" if isinstance(seconds, (int, float)) else "not timed"
        how = "; recalled" if r.get("recalled") else \
            f"; {r.get('timed')} of {r.get('candidates')} candidates timed, {r.get('skipped')} skipped"
        return printable(f"Tuned({r.get('kernel')}: spec {r.get('spec')!r}{knobs}, {took}{how})")


def candidates(lk, budget, seed=0):
    """The current spec, then the unblocked enumerated ones, then a shuffled sample, ``budget`` in all.

    >>> from loops import Loop, kernel
    >>> k = kernel("ab", Loop(0, 4, parallel=False), Loop(0, 4))(lambda i, j: None)
    >>> candidates(k, 4)
    ['ab', 'Ba', 'aB']
    """
    loops = [(LETTERS[i], lp.parallel and lp.trip > 1) for i, lp in enumerate(lk.loops)]
    blockings = {LETTERS[i]: min(len(lp.blocks), 2) for i, lp in enumerate(lk.loops)}
    specs = enumerate_union(loops, blockings)
    unblocked = [s for s in specs if len(s) == len(lk.loops)]
    rest = [s for s in specs if len(s) != len(lk.loops)]
    random.Random(seed).shuffle(rest)
    out = [lk.spec.text]
    for s in unblocked + rest:
        if s not in out:
            out.append(s)
    return out[:budget]


def space(lk, blocks=True):
    """The specs searched for ``lk``: with ``blocks`` (True, or a dict letter -> times blocked, the
    letters it leaves out not blocked: ``{}`` blocks no loop) each loop blocked (True: once) with
    sizes from :func:`loops.enumerate.block_sizes` baked in; with False, the enumerated specs over
    the declared ``blocks`` of each loop. The current spec comes first.

    >>> from loops import Loop, kernel
    >>> k = kernel("ab", Loop(0, 4, parallel=False), Loop(0, 8))(lambda i, j: None)
    >>> len(space(k)), space(k)[:3], len(space(k, blocks=False))
    (28, ['ab', 'Ba', 'aB'], 3)
    """
    return list(iter_space(lk, blocks))


def iter_space(lk, blocks=True):
    """:func:`space` one spec at a time: a search stops taking them when its budget says so."""
    yield lk.spec.text
    if _searches_blocks(blocks):
        times = blocks if isinstance(blocks, dict) else {LETTERS[i]: 1 for i in range(len(lk.loops))}
        specs = iter_spec_space(lk.loops, times)
    else:
        loops = [(LETTERS[i], lp.parallel and lp.trip > 1) for i, lp in enumerate(lk.loops)]
        specs = enumerate_union(loops, {LETTERS[i]: min(len(lp.blocks), 2) for i, lp in enumerate(lk.loops)})
    yield from (s for s in specs if s != lk.spec.text)


def _searches_blocks(blocks):
    """``blocks`` asks for block sizes to be searched: True or a dict (even ``{}``: no loop blocked)."""
    return isinstance(blocks, dict) or bool(blocks)


def tune(lk, arrays, budget=16, reps=5, specs=None, progress=True, rtol=1e-4, blocks=False, seconds=None,
         model=True, remember=False, **unknown):
    """Time candidate specs of ``lk`` on ``arrays``; remember and return the best spec.

    ``specs``: the candidates (default :func:`space`, ranked by the cost model when ``model``, else
    :func:`candidates`), each checked first (a refused spec raises its :class:`SpecError`; with
    ``seconds``, as many as its first tenth allows, a later refused one skipped with its note);
    ``budget``: how many are timed at most (a candidate skipped, refused or racing or with a
    different result, does not count; see :mod:`loops.tune_order`; :func:`search` calls it
    ``top``, and its defaults differ: :mod:`loops.tune_keywords`); ``seconds``: a wall-clock limit (None: none);
    ``blocks``: search block sizes too (True: every loop blocked once; or a dict loop letter ->
    times blocked, 0..5, the letters left out not blocked, so ``{}`` and ``{'a': 0}`` search the
    unblocked specs; see :func:`space`; a loop is blocked at most as many times as nested sizes
    fit its trip count). A candidate other than ``lk``'s own spec that the race analysis finds
    racing (:mod:`loops.races`) is skipped, whatever ``races=`` ``lk`` declares (see
    :mod:`loops.trial`); ``seconds`` bounds the whole call, the spec space's enumeration, the
    specs' check and the final rounds included: no run starts past it, but one that started
    before it ends (the kernel's own spec always runs once: its reference run, which then also
    serves as its timing).
    ``lk.last_tuning`` holds (spec, seconds or None, note) per timed candidate after the call,
    the spec chosen noted ``"chosen"``: the fastest unless it beats ``lk``'s own spec by less
    than :data:`MARGIN`. ``remember=True``: also keep the winner on disk and take it back,
    checked, in a later process (or later in this one) instead of tuning again, as :func:`search`
    does (``lk.last_tuning`` then holds the remembered winner's check alone). The winner serves
    ``lk``'s calls on arrays like these on this many threads until :meth:`~loops.LoopKernel.retrace`;
    :meth:`~loops.LoopKernel.with_spec` variants still run the spec they name.
    """
    if unknown:
        check_keywords("tune", unknown, _keywords(tune, 2))
    check_options("tune", budget=budget, reps=reps, rtol=rtol, seconds=seconds,
                  flags=dict(progress=progress, model=model, remember=remember))
    check_search_space("tune", lk, specs, blocks, until=time.perf_counter() if seconds else None)  # search: the rest
    if specs is None and not model:         # listed past the budget: a skipped one leaves its slot to the next
        listed = (SKIPS_PER_SLOT + 1) * budget
        specs = (candidates(lk, listed) if not _searches_blocks(blocks)
                 else list(itertools.islice(iter_space(lk, blocks), listed)))
    found = search(lambda: (lk, arrays), {}, specs=specs, blocks=blocks, seconds=seconds, top=budget,
                   reps=reps, model=model, progress=progress, rtol=rtol, remember=remember)
    best = found.record["spec"]
    lk.last_tuning = [(c.spec, c.seconds, "chosen" if c.spec == best and c.seconds is not None else c.note)
                      for c in found.candidates if c.seconds is not None or c.note]
    return best


def search(make, knobs=None, specs=None, blocks=True, seconds=60.0, top=None, reps=3, model=True, machine=None,
           progress=True, rtol=1e-4, key=None, remember=True, refine=5, clock="wall", probe=0, resume=False,
           hints=(), **unknown):
    """Search ``knobs`` x specs x block sizes; return :class:`Tuned`. ``knobs``: name -> values for
    ``make`` (every combination, the first values first), or a list of keyword dicts.

    ``make(**config)`` returns ``(lk, arrays)`` or ``(lk, arrays, output)``; without ``output``, each
    configuration's results are checked against its own kernel's spec. ``specs``: a fixed list
    (else :func:`space` of each configuration's kernel with ``blocks``), checked against the first
    configuration's kernel before anything is timed (with ``seconds``, in its first tenth at most:
    a later refused spec is skipped, noted); ``top``: how many are timed at most (None: all; a
    skipped candidate does not count, see :mod:`loops.tune_order`; ``lk.tune`` calls it ``budget``,
    see :mod:`loops.tune_keywords` for the other defaults that differ);
    ``seconds``: the wall-clock budget (None: none; modelling included: configurations are modelled
    best kernel first, and those not modelled in its first 40% are left out, counted in the
    record, as are the predictions of specs past it; specs of the space not enumerated in its
    first half are left out; the final rounds stop at the deadline; under :data:`MODEL_SECONDS` no
    model is built; the reference configuration is always built and timed); ``machine``: the
    :class:`loops.cost.Machine` (default measured on the host); ``key``: what the result is
    remembered under (default: the kernel's name, the reference arrays' shapes and dtypes, the
    host and the thread count); ``remember``: return the result remembered for this search (the
    same key, make, body, loop declarations, knobs and specs), in this process or on disk by an
    earlier one (:mod:`loops.remembered`; generated again and its result and races checked first,
    a winner that fails searched again), else search and
    remember the result both ways; ``resume`` (with ``remember``): search again anyway, the
    remembered winner timed first and kept in the final rounds and the candidates earlier runs
    timed left out (``record["explored"]``), so each run times new ones and the result remembered
    across runs only gets better (``record["runs"]`` counts the searches,
    ``record["tuning_seconds"]`` their time; ``record["recalled"]`` is True when nothing was
    searched); ``refine``: how many of the fastest are timed again at the end, with the
    reference configuration, in 3 round-robin rounds, the lowest median winning (a single lucky run does not)
    unless it beats the kernel's own spec (on the first configuration; timed first when ``specs``
    lists it, no preference when it does not) by less than :data:`MARGIN`; when every candidate
    is refused, the first one's :class:`SpecError` (e.g. a :class:`loops.races.RaceError`) is raised;
    ``clock``: ``"wall"``, or ``"cpu"``: the largest CPU time of the nest's threads, which leaves
    out the time other processes held the cores (for a busy machine; see :meth:`isa.pool.Pool.cpu_seconds`);
    ``probe``: every so many seconds the reference is timed again and the candidates' times are scaled
    by its change (:class:`loops.trial.Probe`, for slow drifts of the machine's speed; 0, the
    default: never. On a VM whose speed switches within a second it adds more noise than it removes);
    ``hints``: records (dicts with ``"knobs"`` and ``"spec"``, e.g. another search's ``record``) timed
    right after the reference and kept in the final rounds, like a remembered winner: the winner of
    one thread is a strong start on two, where the model ranks nests less well.

    >>> import numpy as np, tppasm as tpp
    >>> from loops import Loop, kernel
    >>> def make(bm):
    ...     zero = tpp.zero(bm, 8)
    ...     X = np.ones((16 // bm, bm, 8), np.float32)
    ...     @kernel("A", Loop(0, 16 // bm))
    ...     def clear(i, X):
    ...         zero(X[i])
    ...     return clear, (X,), lambda: X.reshape(16, 8)
    >>> found = search(make, {"bm": [4, 8]}, seconds=20, progress=False, remember=False)
    >>> found.record["knobs"]["bm"] in (4, 8), found.record["timed"] >= 2
    (True, True)
    """
    start = time.perf_counter()
    if unknown:
        check_keywords("search", unknown, _keywords(search, 1))
    check_options("search", top=top, reps=reps, rtol=rtol, seconds=seconds, refine=refine, probe=probe,
                  machine=machine, flags=dict(progress=progress, model=model, remember=remember, resume=resume))
    deadline = start + seconds if seconds else float("inf")
    hints = check_hints("search", hints)
    if clock not in ("wall", "cpu"):
        raise ValueError(f"search: clock={clock!r}; expected 'wall' or 'cpu'")
    configs = Grid(knobs)                           # walked lazily: a huge grid costs its budget only
    builds = Builds(make)
    ref = builds.get(configs[0])
    check_search_space("search", ref.lk, specs, blocks, until=start + (deadline - start) * 0.1 if seconds else None)
    threads = ref.lk.pool.nthreads
    key = key if key is not None else _default_key(ref, threads)
    if not _hashable(key):
        raise TypeError(f"search: key={key!r} is not hashable; give a tuple or a string, e.g. key=('gemm', 64)")
    if resume and not remember:
        raise ValueError("search: resume=True continues the remembered search; it needs remember=True")
    disk = remembered.disk_key(key, configs, specs, blocks, make, ref.lk, threads) if remember else None
    earlier = _in_process(key, disk, configs) if remember else None
    if remember and earlier is None:
        earlier = remembered.load(disk, configs)
    reference = ref.reference(deadline, clock)      # its second run (the NaN check) skipped past the deadline
    seed = _recalled(earlier, builds, reference, reps, rtol, clock)
    if seed is not None and not resume:
        record = _keep(key, disk, dict(earlier, recalled=True))
        out = _rebuild(builds, record)
        out.candidates = [seed]                     # its check: the one candidate timed
        return out
    timer = Probe(ref.lk, ref.arrays, reps, clock, probe) if probe else None
    ref.holding = ref.holding if timer is None else None       # the probe ran on the arrays
    cands, modelling = [], start + (deadline - start) * 0.4
    model = model and (seconds is None or seconds >= MODEL_SECONDS)
    enumerating = start + (deadline - start) * 0.5      # specs enumerated after this are left out
    models = _models(configs, builds, ref, model, machine, threads, start + (deadline - start) / 4)
    unmodelled = configs.count - len(models)              # not reached before the modelling deadline
    for config, lk, predict in models:
        late = config is not configs[0] and time.perf_counter() > modelling
        if lk is None or late:
            unmodelled += 1                       # the rest of the budget is for timing: left out
            continue
        for s in list(specs) if specs is not None else iter_space(lk, blocks):
            now = time.perf_counter()
            if specs is None and now > enumerating and cands:
                break                             # a huge space: the budget bounds its enumeration too
            late = predict is not None and now > modelling    # the rest: unpredicted
            cands.append(Candidate(config, s, _safe(predict, s) if predict and not late else None))
    at = _same(cands, Candidate(configs[0], ref.lk.spec.text))
    if at:                                          # a listed own spec is the reference: timed first
        cands.insert(0, cands.pop(at))
    modelled = time.perf_counter() - start
    if seed is not None:                            # the remembered winner stands for its candidate, timed already
        _stand_in(cands, seed)
    hinted = []
    for h in hints:
        c = Candidate(dict(h["knobs"]), h["spec"])
        same = _same(cands, c)
        if same is not None and (cands[same] is seed or same == 0 or any(cands[same] is o for o in hinted)):
            continue                                # the reference, remembered winner or a hint: timed anyway
        measure(c, builds, reference, reps, rtol, clock, deadline=deadline)
        if c.seconds is None:
            continue                                # refused or a different result: a hint is only a hint
        if not _stand_in(cands, c):
            cands.append(c)
        hinted.append(c)
    prior = earlier if seed is not None else {"runs": 0}      # what the searches before this one did
    explored = set(prior.get("explored", ()))
    order = Order(cands, model, top, threads, skip=explored, bounded=seconds is not None)
    timed, finals = [], start + (deadline - start) * 0.9       # the last tenth: the final rounds
    timed += [seed] if seed is not None else []
    timed += hinted
    cut = False
    bar = Progress(order.total, progress)
    try:                                            # an interrupt (Ctrl-C) closes the bar too
        for c in order:                             # a skipped candidate does not use the budget (top)
            if time.perf_counter() > finals and timed:
                cut = True
                break
            if c is seed or any(c is h for h in hinted):
                continue
            measure(c, builds, reference, reps, rtol, clock, timer, deadline)
            order.learn(c)
            if c.seconds is not None:
                timed.append(c)
                bar.step(c)
    finally:
        bar.close()                                 # the budget-ended line waits for the final rounds' winner
    if not timed:
        refused = [c.error for c in cands if c.error is not None]
        if refused:
            raise refused[0]                        # every candidate refused: the first's SpecError / RaceError
        raise RuntimeError("no candidate ran: " + "; ".join(f"{c.spec}: {c.note}" for c in cands[:3]))
    timed.sort(key=lambda c: c.seconds)
    finalists = timed[:max(1, refine)]
    own = cands[0] if (cands[0].config, cands[0].spec) == (configs[0], ref.lk.spec.text) else None
    for c in (own, seed, *hinted):                  # the own spec, remembered winner and hints play off too:
        if refine and c is not None and c.seconds is not None and all(f is not c for f in finalists):
            finalists.append(c)                     # tuning never loses to them by chance
    samples = {id(c): [c.seconds] for c in finalists}
    for _ in range(3 if len(finalists) > 1 else 0):     # round robin: a period of another load hits all alike
        if time.perf_counter() > deadline:
            break                                   # the budget bounds the final rounds too
        for c in finalists:
            again = time_again(c, builds, reps, clock, deadline)
            if again is not None:
                samples[id(c)].append(again)
    for c in finalists:
        c.seconds = float(np.median(samples[id(c)]))
    best = min(finalists, key=lambda c: c.seconds)
    if own is not None and any(c is own for c in finalists) and best.seconds > own.seconds * (1 - MARGIN):
        best = own                                  # not measurably faster than the kernel's own spec: keep it
    bar.close(budget_ended=cut, winner=best)
    ranked = {id(c): i for i, c in enumerate(sorted(cands[1:], key=_predicted))}
    record = {"kernel": ref.lk.__name__, "key": [str(k) for k in key] if isinstance(key, tuple) else str(key),
              "threads": threads, "knobs": best.config, "spec": best.spec, "seconds": best.seconds,
              "reference_seconds": own.seconds if own is not None else None,
              "candidates": len(cands), "timed": len(timed),
              "configurations": configs.count, "unmodelled_configurations": unmodelled,
              "skipped": sum(1 for c in cands if c.note), "model": bool(model),
              "predicted_rank": ranked.get(id(best), 0), "modelling_seconds": modelled, "clock": clock,
              "elapsed": time.perf_counter() - start}
    record["runs"] = prior.get("runs", 1) + 1
    record["tuning_seconds"] = record["elapsed"] + prior.get("tuning_seconds", 0.0)
    record["resumed"] = seed is not None
    tried = {_explored(c) for c in cands if c.seconds is not None or c.note}
    record["explored"] = sorted(explored | tried)[-EXPLORED:]
    if remember:
        _keep(key, disk, record)
        remembered.store(disk, record)
    out = _rebuild(builds, record)
    out.candidates = cands
    return out


def _keywords(fn, positional):
    """The keyword options of ``fn`` (after its ``positional`` parameters), for a TypeError's list."""
    return [p.name for p in list(inspect.signature(fn).parameters.values())[positional:] if p.kind != p.VAR_KEYWORD]


def _hashable(key):
    try:
        hash(key)
    except TypeError:
        return False
    return True


def _in_process(key, space, configs):
    """The record this process remembers under ``key`` for the same search (``space``: its disk
    key, which holds make, the body, the configurations and specs), or None."""
    record = REMEMBERED.get(key)
    if record is None or _SPACES.get(key) != space or record.get("knobs") not in configs:
        return None
    return record


def _keep(key, space, record):
    REMEMBERED[key], _SPACES[key] = record, space
    return record


def _recalled(record, builds, reference, reps, rtol, clock):
    """The remembered winner ``record`` as a timed candidate, or None (no record, or one that fails
    or whose result differs from the reference's: a stale or damaged record is searched again)."""
    if record is None:
        return None
    c = Candidate(dict(record["knobs"]), record["spec"])
    try:
        measure(c, builds, reference, reps, rtol, clock)
    except Exception:            # noqa: BLE001  (whatever a damaged record does, it costs a search)
        return None
    return c if c.seconds is not None else None


def _rebuild(builds, record):
    built = builds.get(record["knobs"])
    if built.own is None:
        built.reference()
    variant = built.lk.with_spec(record["spec"])
    if built.holding != record["spec"]:             # the arrays get the winner's result (one run more)
        built.restore()
        variant(*built.arrays)
    _remember_in(built.lk, built.arrays, record["spec"])
    return Tuned(record, [], variant, built.arrays, built.output)


def _remember_in(lk, arrays, spec):
    lk._tuned[signature(arrays), lk.pool.nthreads] = spec       # another thread count: tuned again
    lk._fast = None


def _default_key(built, threads):
    from isa.cpu import caches, host
    h = host()
    arrays = tuple((a.shape, a.dtype.name) for a in built.arrays)
    return (built.lk.__name__, arrays, f"{h.vendor}/{h.isa}/{'/'.join(str(c.size) for c in caches())}", threads)


# -- the model ------------------------------------------------------------------------------

def _models(configs, builds, ref, model, machine, threads, until):
    """(config, loop kernel, predictor or None) per configuration: the reference first, then, with a
    model, the others by their own spec's predicted time (the best kernels first) as far as
    ``until`` allows; the rest are not walked (the caller counts them as not modelled)."""
    out = []
    for config in configs:
        if config is not configs[0] and time.perf_counter() > until:
            break
        built = builds.get(config) if config is not configs[0] else ref
        out.append((config, built.lk, predictor(built, machine, threads) if model else None))
        if config is not configs[0]:
            builds.drop(config)
    if model and out[0][2] is not None:
        out[1:] = sorted(out[1:], key=lambda m: _safe(m[2], m[1].spec.text) or float("inf") if m[2] else float("inf"))
    return out


def predictor(built, machine, threads):
    """``spec -> predicted seconds`` for a configuration, or None when the model cannot read its body."""
    from .cost import Machine, Model, flop_seconds, time_kernel
    machine = machine or Machine.host(threads)
    lk_type = type(built.lk)

    def kernel_seconds(kernel, scalars):
        if not getattr(kernel, "runnable", True):
            return flop_seconds(kernel, scalars, machine)
        k = (kernel.desc, kernel.isa, scalars)
        if k not in _KERNEL_SECONDS:
            _KERNEL_SECONDS[k] = time_kernel(kernel, scalars, lk_type)
        return _KERNEL_SECONDS[k]
    try:
        model = Model(built.lk, built.arrays, machine, kernel_seconds)
    except (TraceError, ValueError, TypeError):
        return None
    return lambda spec: model.predict(spec).seconds


def _safe(predict, spec):
    try:
        return predict(spec)
    except (SpecError, ValueError, ZeroDivisionError):
        return None


def _same(cands, c):
    """The index of the candidate of ``cands`` with ``c``'s configuration and spec, or None."""
    return next((i for i, o in enumerate(cands) if (o.config, o.spec) == (c.config, c.spec)), None)


def _stand_in(cands, c):
    """Put ``c`` (timed already) in the place of its twin in ``cands``, keeping the twin's
    prediction; False when it has none."""
    i = _same(cands, c)
    if i is None:
        return False
    c.predicted, cands[i] = cands[i].predicted, c
    return True
