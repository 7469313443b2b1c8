"""The tables of native calls that :meth:`isa.pool.Pool.run_native` and ``run_table`` run
(:mod:`isa.pool_state`'s ``RAW_*`` words), and :class:`OpenMPRegions`, which runs the process
pool's regions (those tables, loop nests) on the threads of the GNU OpenMP runtime (libgomp)
that the process has loaded instead of the pool's own workers.

Why: torch's CPU build runs its operators on libgomp's threads, which spin for milliseconds
after each one (``GOMP_SPINCOUNT``, 300,000 ``pause`` by default) waiting for the next. A tppasm
region on the pool's workers right after a torch operator shares its cores with them: a 2-thread
training step of a 768 -> 3072 -> 768 MLP of :class:`tppasm.torch.Linear` with Adam, batch 256, took
62-65 ms on a 2-vCPU Zen 3 against 48-49 with ``OMP_WAIT_POLICY=passive`` (torch's: 52-58), and
MiniLM's forward of 1 x 32 tokens (loop nests) right after a torch operator 10-15 ms against 4.2
alone. On libgomp's threads there is no one to share with: the spinning threads take the work.

>>> from isa.x86 import Function, qword
>>> f = Function("add", ["ptr", "i64"]); p, v = f.args; f.asm.add(qword[p], v); add = f.finalize()
>>> import ctypes; total = ctypes.c_int64(0); at = ctypes.addressof(total)
>>> table, lists = call_table([[(add.address, (at, 1))], [(add.address, (at, 2))]], 2)
>>> lists, table[0], table[2], table[4]            # two lists of one call each: a call is 7 words
(2, 2, 1, 1)
"""
import array
import contextlib
import ctypes
import operator
import os

from isa.cpu import host

from . import pool_state as pc

WORD = (1 << 64) - 1
_NO_ARGS = (0,) * pc.RAW_ARGS         # a raw call's record pads its arguments to RAW_ARGS words


def raw_call(call):
    """``call`` as (address, args) of unsigned 64-bit words, or TypeError saying what run_native takes."""
    try:
        address, args = call
        args = tuple((a if type(a) is int else operator.index(a)) & WORD for a in args)     # (a float: refused)
        if not (isinstance(address, int) and address > 0 and len(args) <= pc.RAW_ARGS):
            raise ValueError
    except (TypeError, ValueError):
        raise TypeError(f"Pool.run_native: a call is (address, args): a native function's address and at most "
                        f"{pc.RAW_ARGS} integer arguments, e.g. kernel.raw_call(a, b, c); got {call!r}") from None
    return address, args


def call_table(shares, nthreads):
    """(table, lists): ``shares`` (lists of (address, args) calls) as the words of a table of at
    most ``nthreads`` lists (share i in list i % nthreads), its first records' addresses filled in."""
    threads = shares if len(shares) <= nthreads else [[call for share in shares[t::nthreads] for call in share]
                                                      for t in range(nthreads)]
    # the table (how many lists, then each one's first record and count), then the records (a
    # function and its six arguments); first records as word indices until the table exists
    words = [len(threads)] + [0] * (2 * len(threads))
    for t, share in enumerate(threads):
        words[1 + 2 * t:3 + 2 * t] = len(words), len(share)
        for call in share:
            address, args = raw_call(call)
            words += (address, *args, *_NO_ARGS[len(args):])
    table = array.array("Q", words)       # (a ctypes array of them takes 5x the time)
    at = table.buffer_info()[0]
    for t in range(len(threads)):
        table[1 + 2 * t] = at + 8 * words[1 + 2 * t]
    return table, len(threads)


def refuse_run(fn, arg):
    """The TypeError or ValueError of Pool.run for an ``fn`` or ``arg`` that is not an int in range."""
    for name, value, least in (("fn", fn, 1), ("arg", arg, 0)):
        if type(value) is not int or not least <= value <= WORD:
            what = "the int address of a native function (a JitFunction's .address)" if name == "fn" else \
                "an int (an address or a value)"
            raise (ValueError if type(value) is int else TypeError)(
                f"Pool.run: {name}={value!r} ({type(value).__name__}); expected {what}, {least} <= {name} < 2**64")


def loaded_openmp():
    """The path of the GNU OpenMP runtime (a file named libgomp*) mapped into this process, or None.

    >>> loaded_openmp() is None or "libgomp" in loaded_openmp()
    True
    """
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(None, 5)            # (address, perms, offset, device, inode[, path])
                if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith("libgomp"):
                    return fields[5].strip()
    except OSError:
        pass
    return None


DATA_WORDS = 5      # a region's block: fn, arg, nthreads, the caller's MXCSR, the team libgomp gave


class OpenMPRegions:
    """Regions (a native ``fn(arg, tid, nthreads)`` on every thread: a loop nest's, or ``rawcall``
    over a table of native calls) run by ``GOMP_parallel`` of the libgomp at ``path`` (already
    loaded: :func:`loaded_openmp`) on ``nthreads`` of its threads, the calling one among them, each
    under the caller's MXCSR and given its own back after. Where libgomp gives a team of another
    size (a thread limit, a nested region), every thread sees so before it calls anything, none
    calls ``fn``, and :meth:`run` says False: the caller runs the region on its pool instead. x86-64
    only; never in a forked child (:func:`share_openmp`)."""

    def __init__(self, path):
        from .x86 import Function                # (x86-64 only: the caller checks the host)
        from .x86.registers import eax, ecx, edx, qword, r12, r13, r15, rax, rcx, rdi, rdx, rsi, rsp
        lib = ctypes.CDLL(path)
        parallel, thread_num, team_size = (ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in
                                           ("GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads"))
        # each thread: region(data), data = (fn, arg, nthreads, MXCSR, the team it got)
        f = Function("openmp_region", ["ptr"])
        f.stack(8)
        a, (data,) = f.asm, f.args
        a.mov(r12, data)
        a.stmxcsr([rsp])
        a.mov(rax, team_size)
        a.call(rax)
        a.movsxd(r13, eax)
        a.mov([r12 + 32], r13)                    # (every thread stores the same team)
        skip = a.label("skip")
        a.cmp(r13, [r12 + 16])
        a.jne(skip)
        a.mov(rax, thread_num)
        a.call(rax)
        a.ldmxcsr([r12 + 24])
        a.mov(rdi, [r12 + 8])
        a.movsxd(rsi, eax)
        a.mov(rdx, [r12 + 16])
        a.call(qword[r12])
        a.ldmxcsr([rsp])
        a.bind(skip)
        self._region = f.finalize()
        # the caller: enter(data, fn, arg, nthreads) fills data (its MXCSR too), then
        # GOMP_parallel(region, data, nthreads, 0), and returns the team the threads got
        f = Function("openmp_enter", ["ptr", "u64", "u64", "i64"], returns="i64")
        a = f.asm
        a.mov(r15, rdi)
        for i, reg in enumerate((rsi, rdx, rcx)):
            a.mov([r15 + 8 * i], reg)
        a.stmxcsr([r15 + 24])
        a.mov(qword[r15 + 32], 0)
        a.mov(rdi, self._region.address)
        a.mov(rsi, r15)
        a.mov(edx, ecx)
        a.xor(ecx, ecx)
        a.mov(rax, parallel)
        a.call(rax)
        a.mov(rax, [r15 + 32])
        self._enter = f.finalize()
        self.in_parallel = lib.omp_in_parallel
        self.path = path

    def run(self, fn, arg, nthreads, data):
        """Run ``fn(arg, tid, nthreads)`` on ``nthreads`` of libgomp's threads; False, having
        called nothing, where libgomp gave a team of another size. ``data``: the address of
        :data:`DATA_WORDS` words of the caller's that no other region uses meanwhile (a pool's
        state has them: :data:`isa.pool_state.OPENMP`)."""
        return self._enter.cfunc(data, fn, arg, nthreads) == nthreads


def openmp_regions():
    """:class:`OpenMPRegions` over the libgomp this process loaded, or None (none loaded, not an
    x86-64 host, or one without ``GOMP_parallel``)."""
    path = loaded_openmp()
    if path is None or host().arch != "x86_64":
        return None
    try:
        return OpenMPRegions(path)
    except (OSError, AttributeError):
        return None


_openmp = []        # the OpenMPRegions regions run on, while isa.pool.share_openmp_threads() has it so
_forked = []        # [True] in a forked child: libgomp's threads do not survive a fork (its next region may hang)
os.register_at_fork(after_in_child=lambda: (_openmp.clear(), _forked.append(True)))


def share_openmp(share):
    """Run the process pool's regions of several threads on :func:`openmp_regions` (``share``
    False: on the pool again); returns whether they do (:func:`isa.pool.share_openmp_threads`);
    never in a forked child."""
    _openmp.clear()
    regions = openmp_regions() if share and not _forked else None
    if regions is not None:
        _openmp.append(regions)
    return regions is not None


def inside_openmp_region():
    """Whether the calling thread runs inside a region of libgomp's threads (a callback of one),
    where entering a region of the pool would wait for the one it is in."""
    return bool(_openmp) and _openmp[0].in_parallel() != 0


@contextlib.contextmanager
def on_the_pools_threads():
    """Regions inside the ``with`` run on the pool's own workers even where they are shared
    (:func:`share_openmp`): :meth:`isa.pool.Pool.cpu_seconds` reads those threads' clocks.

    >>> with on_the_pools_threads(): openmp_team(2) is None
    True
    """
    kept = _openmp[:]
    _openmp.clear()
    try:
        yield
    finally:
        _openmp[:] = kept


def run_on_openmp(fn, arg, nthreads, data):
    """Run a region of the process's pool (``fn(arg, tid, nthreads)``, ``data`` its block: see
    :meth:`OpenMPRegions.run`) on libgomp's threads where they are shared (:func:`share_openmp`);
    whether it ran there. Where libgomp gives a team of another size (a thread limit), none of its
    threads ran it, and the pool's regions stay on the pool from then on."""
    if nthreads < 2 or not _openmp:
        return False
    if _openmp[0].run(fn, arg, nthreads, data):
        return True
    _openmp.clear()
    return False


def openmp_team(nthreads):
    """The :class:`OpenMPRegions` that a region of ``nthreads`` threads runs on, or None: the pool's."""
    return _openmp[0] if nthreads > 1 and _openmp else None
