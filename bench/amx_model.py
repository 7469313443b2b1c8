"""A cycle model of AMX kernels on one Sapphire / Emerald Rapids core (a model, not a measurement).

Input: the tile instructions and prefetches a kernel executed, in order, as the interpreter
records them (:attr:`isa.x86.interp.machine.Stats.tile_ops`). Output: the cycles a core would take, from a
scoreboard of four units and the tile registers:

- the TMUL runs ``tdp*`` in program order, one per ``TDP_CYCLES`` (16: a 16x16x32 bf16 or 16x16x64
  int8 tile product); its result is ready ``TDP_LATENCY`` (52) cycles after it starts;
- the tile-load pipe takes a ``tileloadd`` row per half cycle (two 64-byte lines per cycle: 8
  cycles a tile); the data is ready ``LOAD_LATENCY`` cycles later (45 from L1; more from L2, L3),
  and no earlier than the lines missing in L1 arrive through the fill path, which moves
  ``L2_BW`` / ``L3_BW`` bytes per cycle (shared with prefetches);
- the tile-store pipe takes a ``tilestored`` per 16 cycles, and a tile load starts only once every
  tile store before it has finished (``fence``: fitted to the first AMX host measured, an Emerald
  Rapids core, where four accumulators stored and four loaded after 8 / 16 ``tdp*`` took 226 / 361
  cycles against the 128 / 256 of the ``tdp*``; the fence models 232 / 360, overlapping loads 128 /
  256: ``python -m bench amx-micro``'s ``c_trip`` loops);
- ``ldtilecfg`` (204 cycles), ``sttilecfg`` (19) and ``tilerelease`` (13) wait for everything
  before them, and everything after waits for them.

Tiles: an instruction starts once the tiles it reads are ready. ``renaming=False`` (the default,
the conservative reading) also makes a write to a tile wait until every earlier reader of it has
finished, so an operand tile cannot be reloaded while a ``tdp`` still reads it; ``renaming=True``
drops those write-after-read waits (as if tiles were renamed like vector registers). The front end
runs at most ``WINDOW`` micro-ops ahead of the oldest unfinished instruction (the reorder buffer;
a tile load or store counts ``UOPS`` 16, one per row, a ``tdp*`` or a prefetch one).

Caches: least-recently-used L1 (48 KiB) and L2 (2 MiB) of 64-byte lines, warmed by one run of
the same trace (a benchmark calls a kernel again and again on the same operands). Latencies and
throughputs are the figures of Intel's optimization manual (AMX chapter: ``tdp*`` 16 / 52,
``tileloadd`` 8 / 45, ``tilestored`` 16, ``ldtilecfg`` 204, ``sttilecfg`` 19, ``tilerelease`` 13); the cache
bandwidths (L2 48 B/cycle sustained of 64 peak, L3 16 B/cycle per core) and the window are
assumptions.

>>> ops = [("tilezero", (0,), (), 0, 0, 0, 0)] + [("tdp", (0,), (0, 1, 2), 0, 0, 64, 16)] * 4
>>> simulate(ops).cycles                       # four dependent tdp: 52 cycles each
209.0
>>> indep = [("tdp", (t,), (t, 6, 7), 0, 0, 64, 16) for t in range(4)] * 4
>>> simulate(indep).cycles                     # independent ones issue every 16 cycles
292.0
>>> trip = [("tilestored", (), (0,), 0, 64, 64, 16), ("tileloadd", (1,), (), 4096, 64, 64, 16)]
>>> simulate(trip).cycles, simulate(trip, fence=False).cycles      # the load waits for the store
(61.0, 45.0)
"""
import json
from collections import OrderedDict
from dataclasses import dataclass, field

LINE = 64
TDP_CYCLES, TDP_LATENCY = 16, 52
LOAD_ROW_CYCLES = 0.5
LOAD_LATENCY = {1: 45, 2: 56, 3: 145}        # from L1; + the L2 (11) / L3 (100) extra latency
STORE_CYCLES = 16
SERIAL = {"ldtilecfg": 204, "sttilecfg": 19, "tilerelease": 13}
L1_BYTES, L2_BYTES = 48 << 10, 2 << 20
L2_BW, L3_BW = 48.0, 16.0
WINDOW = 512                                 # Golden Cove's reorder buffer
UOPS = {"tileloadd": 16, "tileloaddt1": 16, "tilestored": 16}
TDP_WORK = {"bf16": 16 * 16 * 32 * 2, "i8": 16 * 16 * 64 * 2}   # work of a full tile product


@dataclass(frozen=True)
class Figures:
    """The timings :func:`simulate` assumes (cycles; bytes per cycle). The defaults are the
    module's constants above; a host's own come from ``python -m bench amx-micro``
    (:func:`bench.amx_micro.host_figures`).

    >>> Figures().load_latency[1], Figures(tdp_latency=40).tdp_latency
    (45, 40)
    """

    tdp_cycles: float = TDP_CYCLES
    tdp_latency: float = TDP_LATENCY
    load_row_cycles: float = LOAD_ROW_CYCLES
    load_latency: tuple = (None, LOAD_LATENCY[1], LOAD_LATENCY[2], LOAD_LATENCY[3])   # by level
    store_cycles: float = STORE_CYCLES
    ldtilecfg: float = SERIAL["ldtilecfg"]
    l2_bw: float = L2_BW
    l3_bw: float = L3_BW

    def serial(self, name):
        return self.ldtilecfg if name == "ldtilecfg" else SERIAL[name]


FIGURES = Figures()
# the readings of tile dependencies, each as simulate()'s keywords
READINGS = {"in-order": dict(in_order=True), "ooo": {}, "renamed": dict(renaming=True)}


def save_figures(path, figures, reading, host=""):
    """Write ``figures`` (a host's, from ``python -m bench amx-micro --figures FILE``), the
    ``reading`` that fit that host and its name as JSON, for ``python -m bench amx-static
    --figures FILE`` (:func:`load_figures`).

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "f.json")
    >>> save_figures(path, Figures(tdp_latency=40), "ooo", "a core")
    >>> f, reading, host = load_figures(path); f.tdp_latency, f.load_latency == FIGURES.load_latency, reading
    (40.0, True, 'ooo')
    """
    with open(path, "w") as out:
        json.dump({"figures": vars(figures), "reading": reading, "host": host}, out, indent=1)
        out.write("\n")


def _cycles(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
        raise ValueError(v)
    return float(v)


def load_figures(path):
    """(:class:`Figures`, reading, host) from a file :func:`save_figures` wrote; ValueError
    naming the fix for anything else."""
    fix = "write it with python -m bench amx-micro --figures FILE on an AMX host"
    try:
        with open(path) as src:
            data = json.load(src)
    except (OSError, ValueError) as e:
        raise ValueError(f"--figures {path}: cannot read it ({e}); {fix}") from None
    names = set(vars(FIGURES))
    given = data.get("figures") if isinstance(data, dict) else None
    if not isinstance(given, dict) or set(given) != names or data.get("reading") not in READINGS:
        raise ValueError(f"--figures {path}: expected {{'figures': {{{', '.join(sorted(names))}}}, 'reading': "
                         f"one of {', '.join(READINGS)}, 'host': ...}}; {fix}")
    try:
        lat = given["load_latency"]
        if not isinstance(lat, list) or len(lat) != 4 or lat[0] is not None:
            raise ValueError(lat)
        given = {k: (None, *map(_cycles, v[1:])) if k == "load_latency" else _cycles(v) for k, v in given.items()}
    except ValueError:
        raise ValueError(f"--figures {path}: the figures must be numbers >= 0, load_latency [null, L1, L2, L3]; "
                         f"{fix}") from None
    return Figures(**given), data["reading"], str(data.get("host", ""))


class _Lru:
    """An LRU cache of lines (the caches' replacement, approximately): fully associative, or with
    ``ways`` lines per set (sets chosen by the line address modulo their number); ``lines`` maps
    each line held to its value (when its fill arrives)."""

    def __init__(self, nbytes, ways=None):
        ways = ways or nbytes // LINE
        self.ways, self.nsets = ways, nbytes // LINE // ways
        self.sets = [OrderedDict() for _ in range(self.nsets)]
        self.lines = {}

    def touch(self, line, value=0.0):
        order = self.sets[line % self.nsets]
        hit = line in self.lines
        if hit:
            order.move_to_end(line)
            value = max(value, self.lines[line]) if value else self.lines[line]
        else:
            order[line] = None
        self.lines[line] = value
        if len(order) > self.ways:
            del self.lines[order.popitem(last=False)[0]]
        return hit


@dataclass
class Result:
    """Modelled cycles of one trace, and what they come from."""

    cycles: float = 0.0
    tdp: int = 0
    tdp_cycles: float = 0.0
    loads: int = 0
    lines: dict = field(default_factory=lambda: {1: 0, 2: 0, 3: 0})   # tile-load lines per level
    prefetches: int = 0
    serial: float = 0.0

    def utilization(self):
        """Fraction of the cycles in which the TMUL is busy."""
        return self.tdp_cycles / self.cycles if self.cycles else 0.0


def _lines(addr, stride, colsb, rows):
    for r in range(rows):
        start = addr + r * stride
        yield from range(start // LINE, (start + max(colsb, 1) - 1) // LINE + 1)


def simulate(ops, renaming=False, in_order=False, window=WINDOW, warm=True, figures=FIGURES, fence=True,
             l1_ways=None):
    """Model the cycles of ``ops`` (the interpreter's ``tile_ops`` of one call) on one core;
    ``in_order``: tile instructions start in program order (a load waits for the ``tdp`` before
    it to start), else only their operands and units order them; ``figures``: the timings
    (:class:`Figures`); ``fence=False`` lets tile loads pass earlier tile stores; ``l1_ways``: L1
    lines per set (Golden Cove: 12, so lines 4 KiB apart share a set), None: fully associative."""
    f = figures
    l1, l2 = _Lru(L1_BYTES, l1_ways), _Lru(L2_BYTES)
    if warm:
        for name, _, _, addr, stride, colsb, rows in ops:
            if name.startswith(("tileload", "tilestore", "prefetch")):
                for line in _lines(addr, stride, colsb, rows):
                    l2.touch(line)
                    l1.touch(line)
        for line in l1.lines:
            l1.lines[line] = 0.0
    res = Result()
    ready = [0.0] * 8                  # when each tile's value is available
    read_until = [0.0] * 8             # when its last reader so far has finished reading it
    tmul = load = store = fill = last_start = barrier = 0.0
    finish, cum, rmax = [], [], []        # completion, micro-ops so far, in-order retirement times
    oldest = -1
    for i, (name, writes, reads, addr, stride, colsb, rows) in enumerate(ops):
        total = (cum[-1] if cum else 0) + UOPS.get(name, 1)
        while total - (cum[oldest] if oldest >= 0 else 0) > window:
            oldest += 1                       # ops up to ``oldest`` must retire before this one issues
        issue = rmax[oldest] if oldest >= 0 else 0.0
        issue = max(issue, barrier)           # nothing passes a configuration instruction
        start = max([issue] + [ready[t] for t in reads])
        if not renaming:
            start = max([start] + [read_until[t] for t in writes] + [ready[t] for t in writes])
        if in_order and not name.startswith("prefetch"):
            start = max(start, last_start)
        if name in SERIAL:
            start = max([start] + finish)
            end = barrier = start + f.serial(name)
            res.serial += f.serial(name)
            done = end
        elif name == "tdp":
            start = max(start, tmul)
            tmul = end = start + f.tdp_cycles
            done = start + f.tdp_latency
            res.tdp += 1
            res.tdp_cycles += f.tdp_cycles
        elif name.startswith("tileload"):
            start = max(start, load, store if fence else 0.0)
            load = start + rows * f.load_row_cycles
            level, arrival = 1, 0.0
            for line in _lines(addr, stride, colsb, rows):
                if l1.touch(line):
                    arrival = max(arrival, l1.lines[line])
                    res.lines[1] += 1
                    continue
                lv = 2 if l2.touch(line) else 3
                level = max(level, lv)
                res.lines[lv] += 1
                fill = max(fill, start) + LINE / (f.l2_bw if lv == 2 else f.l3_bw)
                l1.lines[line] = fill
                arrival = max(arrival, fill)
            end = load
            done = max(start + f.load_latency[level], arrival + 5)
            res.loads += 1
        elif name == "tilestored":
            start = max(start, store)
            store = end = start + f.store_cycles
            for line in _lines(addr, stride, colsb, rows):
                if not l1.touch(line, end):
                    l2.touch(line)
            done = end
        elif name == "tilezero":
            end = start
            done = start + 1
        else:                           # prefetch: a fill into L1 that nothing waits for
            res.prefetches += 1
            line = addr // LINE
            if not l1.touch(line):
                lv = 2 if l2.touch(line) else 3
                fill = max(fill, issue) + LINE / (f.l2_bw if lv == 2 else f.l3_bw)
                l1.lines[line] = fill
            end = done = issue
        if not name.startswith("prefetch"):
            last_start = start
        for t in reads:
            read_until[t] = max(read_until[t], end)
        for t in writes:
            ready[t] = done
            read_until[t] = 0.0 if renaming else read_until[t]
        finish.append(max(end, done))
        cum.append(total)
        rmax.append(max(rmax[-1], finish[-1]) if rmax else finish[-1])
    res.cycles = max(finish + [tmul, load, store]) if finish else 0.0
    return res
