"""The native thread pool: workers are JIT'd machine code started with ``pthread_create``.

No Python runs in the workers, and the calling thread runs a whole region (its own share, tid 0,
included) inside one ctypes call, so the interpreter lock is released for the region. Loop nests
(:mod:`loops`) and :mod:`tppasm.fc` (tables of kernel calls, :meth:`Pool.run_native`) share the
process's pool, whose regions may run on torch's OpenMP threads instead (:func:`share_openmp_threads`).

Policy (see :mod:`isa.x86.pool_code` for the code, :mod:`isa.aarch64.pool_code` on AArch64 hosts:
same state layout and protocol, ``yield`` in place of ``pause``):

- A region bumps a generation counter; workers spin on it for ``TPPASM_SPIN_US`` microseconds of
  ``pause`` (default 1000; 0 when oversubscribed; a ``sched_yield`` every 256 of them), then
  sleep on a futex; the caller issues ``FUTEX_WAKE`` only when a worker is asleep, and then yields
  once: a worker woken (or started) on the caller's CPU moves to another CPU of its mask. Completion
  is a countdown the caller waits on with the same spin-then-sleep; barriers wait the same way.
- Regions are serialized by a lock, so several Python threads may call :meth:`Pool.run`; calling it
  on a thread already inside the pool (a callback into Python from a region, or a signal handler
  that interrupted a region or the start or stop of the workers) raises ``RuntimeError`` instead
  of deadlocking.
- A forked child restarts its workers on its first region (``os.register_at_fork``); the state and
  code addresses (``barrier_fn``, ``barrier_state``) stay the same there.
- At interpreter exit the workers are joined; later regions (an atexit handler registered before
  the pool, on any thread) start them again and join them at their end (:mod:`isa.pool_exit`).
- :meth:`Pool.close` (or the collection of a pool nothing references) joins the workers and unmaps
  the pool's state; a closed pool refuses work (``ValueError``). The machine code is built once per
  process and shared by every pool (it is never unmapped: it takes the state as an argument).

>>> import ctypes
>>> from isa.x86 import Function, qword
>>> f = Function("count", ["ptr", "i64", "i64"]); counts, tid, _ = f.args
>>> f.asm.inc(qword[counts + tid * 8])
>>> count = f.finalize()
>>> pool = get_pool(); hits = (ctypes.c_int64 * pool.nthreads)()
>>> pool.run(count.address, ctypes.addressof(hits))
>>> list(hits) == [1] * pool.nthreads
True
"""
import atexit
import ctypes
import mmap
import operator
import os
import signal
import threading
import time
import weakref

from isa.cpu import host
from isa.int_text import int_text

from . import pool_calls, pool_exit
from .pool_calls import WORD, refuse_run
from . import pool_state as pc

if host().arch == "aarch64":      # the machine code of the host; the state layout (``pc``) is shared
    from .aarch64 import pool_code as _code
else:
    from .x86 import pool_code as _code

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.pthread_create.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_libc.pthread_join.argtypes = (ctypes.c_ulong, ctypes.c_void_p)
_pthread_timedjoin = getattr(_libc, "pthread_timedjoin_np", None)
if _pthread_timedjoin is not None:
    _pthread_timedjoin.argtypes = (ctypes.c_ulong, ctypes.c_void_p, ctypes.c_void_p)     # (a struct timespec *)


def _join(handle, result, deadline):
    """Join thread ``handle`` (by ``deadline``, where libc can time out), storing what it returned at
    address ``result``; whether it was joined."""
    if _pthread_timedjoin is None:
        return _libc.pthread_join(handle, result) == 0
    sec = int(deadline)
    return _pthread_timedjoin(handle, result, (ctypes.c_long * 2)(sec, int((deadline - sec) * 1e9))) == 0


_RUN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_MAP_FAILED = ctypes.c_void_p(-1).value
# Blocked in workers, so they reach Python threads; faults stay deliverable (faulthandler, gdb).
_ASYNC_SIGNALS = signal.valid_signals() - {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL,
                                           signal.SIGTRAP, signal.SIGABRT}


# Workers spin this long for the next region before sleeping. On a VM, a vCPU whose thread sleeps
# halts, and waking it costs far more than on bare metal: on the 2-vCPU Zen 4 VM, 1x1 convolutions
# of 0.2-0.6 ms per call on 2 threads ran at 0.77-0.90x torch (geomean of 3 layers, 2 runs) with
# 100 µs and at 1.13-1.25x with 500-3000 µs (4 runs); torch's OpenMP workers spin longer still.
SPIN_US = 1000.0
MAX_SPIN_US = 1e6            # a second of spinning before sleeping is already far past useful
MAX_THREADS = 4096


def _count_text(n):
    """``n`` for a message (an int too long for str(): its digit count)."""
    return int_text(n) if isinstance(n, int) else repr(n)


def _env_int(name):
    """The int in ``name`` (OMP_NUM_THREADS: its first level), None if unset or blank."""
    raw = os.environ.get(name, "")
    if not raw.strip():
        return None
    text = raw.split(",")[0].strip()
    if not (text.isascii() and text.isdigit()):      # (int() takes '1_000' and other scripts' digits)
        raise ValueError(f"{name}={raw!r}: expected a positive integer (e.g. 4)")
    value = int(text) if len(text.lstrip("0")) <= 4 else MAX_THREADS + 1     # (int() refuses 4301 digits)
    if not 1 <= value <= MAX_THREADS:
        raise ValueError(f"{name}={os.environ[name]!r}: expected a number of threads from 1 to {MAX_THREADS}")
    return value


def default_threads():
    """TPPASM_NUM_THREADS, else OMP_NUM_THREADS (its first level), else the CPUs this process may use.

    >>> default_threads() >= 1
    True
    """
    for value in map(_env_int, ("TPPASM_NUM_THREADS", "OMP_NUM_THREADS")):
        if value is not None:
            return value
    return len(os.sched_getaffinity(0))


def _spin_us(nthreads):
    """TPPASM_SPIN_US, else SPIN_US, or 0 when there are more threads than CPUs: a spinning thread
    would hold the CPU that the thread it waits for needs (measured here: 3 threads on 2 CPUs,
    ~650 µs per empty region with 100 µs of spinning, ~18 µs sleeping at once)."""
    text = os.environ.get("TPPASM_SPIN_US", "").strip()
    default = 0.0 if nthreads > len(os.sched_getaffinity(0)) else SPIN_US
    try:
        if text and not (text.isascii() and "_" not in text):     # (float() takes '1_0' and other scripts' digits)
            raise ValueError(text)
        value = float(text) if text else default
    except ValueError:
        value = -1.0
    if not 0 <= value <= MAX_SPIN_US:          # NaN and infinity fail too
        raise ValueError(f"TPPASM_SPIN_US={text!r}: expected a number of microseconds from 0 to {MAX_SPIN_US:g}")
    return value


def _page_bytes(size):
    return -(-size // mmap.PAGESIZE) * mmap.PAGESIZE


def _pages(size):
    """Private anonymous read+write pages (unmapped by :meth:`_Workers.release`)."""
    size = _page_bytes(size)
    addr = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if addr in (None, _MAP_FAILED):
        errno = ctypes.get_errno()
        raise OSError(errno, f"mmap of the pool state failed: {os.strerror(errno)}")
    return addr


_shared = {}                    # the machine code of every pool, and its pause rate; built once
_code_lock = threading.Lock()


def _shared_code():
    """The pools' machine code (:mod:`isa.x86.pool_code`), built once and never unmapped (a worker may run it)."""
    with _code_lock:
        if "code" not in _shared:
            code = _code.build()
            for jit in code.values():
                jit.memory._finalizer.detach()
            _shared["pauses_per_us"] = _pause_iterations_per_us(code["spin"])
            _shared["code"] = code
        return _shared["code"]


def _pause_iterations_per_us(spin):
    n, best = 20000, float("inf")
    for _ in range(3):
        t = time.perf_counter()
        spin(n)
        best = min(best, time.perf_counter() - t)
    return n / (best * 1e6)


def _this_cpu():
    """The CPU the calling thread runs on (sched_getcpu), or NO_CPU."""
    cpu = getattr(_libc, "sched_getcpu", lambda: -1)()
    return cpu if cpu >= 0 else pc.NO_CPU


class _Workers:
    """A pool's native side: its state pages and its worker threads, apart from the :class:`Pool`
    so that the finalizer of a collected pool can stop the workers and free the pages.

    ``handles[tid]`` is worker tid's pthread_t (== threading.get_ident() there), 0 where none runs.
    Native calls fill and clear it: ``pthread_create`` writes the handle (a failed one writes that of
    a thread that never ran: cleared at once), and the join writes the worker's return value (NULL)
    over it. So a signal handler that raises between two Python statements of a start or a stop
    never loses a running worker, nor leaves a joined one listed (joining it again would be
    undefined behaviour): the next stop joins exactly the ones left.
    """

    def __init__(self, nthreads, code):
        self.code, self.size = code, pc.state_size(nthreads)
        self.state = _pages(self.size)
        self.handles = (ctypes.c_ulong * nthreads)()      # slot 0 (the caller's) stays 0

    @property
    def threads(self):
        """The handles of the running workers."""
        return [handle for handle in self.handles if handle]

    def slot(self, tid):
        """The address of ``handles[tid]``."""
        return ctypes.addressof(self.handles) + tid * ctypes.sizeof(ctypes.c_ulong)

    def forget(self):
        """Drop every handle (a forked child: the parent's workers do not exist there)."""
        ctypes.memset(self.handles, 0, ctypes.sizeof(self.handles))

    def stop(self):
        """Make the workers return and join them; whether every one was joined in time."""
        if not any(self.handles):
            return True
        self.code["quit"](self.state)
        deadline, joined = time.time() + pool_exit.GRACE_S, True
        for tid, handle in enumerate(self.handles):
            if handle and not _join(handle, self.slot(tid), deadline):
                self.handles[tid] = 0             # (as before: given up on; release keeps the state)
                joined = False
        return joined

    def release(self):
        """Stop the workers and unmap the state (kept if a worker was not joined: it may read it yet)."""
        if self.stop() and self.state:
            _libc.munmap(ctypes.c_void_p(self.state), ctypes.c_size_t(_page_bytes(self.size)))
        self.state = 0


class Pool:
    """``nthreads`` threads (the caller is tid 0) that run native functions; use :func:`get_pool`.

    ``run(fn, arg)`` calls ``void fn(void *arg, int64 tid, int64 nthreads)`` once per tid; in ``fn``, ``barrier_fn(
    barrier_state, tid)`` waits for every thread of the region; ``run_native(shares)`` runs lists of native calls.

    >>> pool = Pool(2); print(pool.nthreads); pool.close()
    2
    """

    def __init__(self, nthreads, spin_us=None):
        if not isinstance(nthreads, int) or isinstance(nthreads, bool):
            raise TypeError(f"Pool(nthreads={nthreads!r}): expected an int number of threads, e.g. Pool(4)")
        if not 1 <= nthreads <= MAX_THREADS:
            raise ValueError(f"Pool(nthreads={_count_text(nthreads)}): a pool has 1 to {MAX_THREADS} threads")
        if spin_us is not None:
            if isinstance(spin_us, bool) or not isinstance(spin_us, (int, float)):
                raise TypeError(f"Pool(spin_us={spin_us!r}): expected microseconds as a number, or None for "
                                "TPPASM_SPIN_US / the default")
            if not 0 <= spin_us <= MAX_SPIN_US:
                raise ValueError(f"Pool(spin_us={spin_us}): expected 0 to {MAX_SPIN_US:g} microseconds")
        self.nthreads = nthreads
        spin_us = _spin_us(nthreads) if spin_us is None else spin_us
        self._code = _shared_code()
        self._run = _RUN(self._code["run"].address)
        self._workers = _Workers(nthreads, self._code)
        self._release = weakref.finalize(self, self._workers.release)     # when collected, or close()
        self._release.atexit = False        # (at exit, _stop_pools_at_exit stops them)
        self._state = self._workers.state
        self.barrier_fn = self._code["barrier"].address
        self.barrier_state = self._state
        self.spin_iterations = pc.spin_iterations(spin_us * _shared["pauses_per_us"])
        self._lock = threading.RLock()     # (a signal handler that interrupted its holder may re-enter)
        self._owner = None                  # the thread inside a region, or starting or stopping workers
        self._worker_ids = frozenset()
        self._stale = True          # workers must be (re)started before the next region
        self._replaced = False      # set_num_threads replaced it: each region's end joins the workers
        self._exited = pool_exit.hook_ran      # at interpreter exit: each region starts and joins the workers
        self.closed = False         # set by close()
        self._pid = os.getpid()
        _POOLS.add(self)
        atexit.unregister(_stop_pools_at_exit)      # (re)registered last: it runs before the handlers
        atexit.register(_stop_pools_at_exit)        # registered before this pool existed, as they expect

    def run(self, fn, arg):
        """Run native ``fn(arg, tid, nthreads)`` on every thread; return when all have returned.

        >>> from isa.x86 import Function
        >>> nop = Function("nop", ["ptr", "i64", "i64"]).finalize()
        >>> get_pool().run(nop.address, 0)
        """
        if self._within(me := threading.get_ident()):
            raise self._inside("Pool.run", "nested regions are not supported (run the inner work serially, or after "
                               "the region)")
        if type(fn) is not int or type(arg) is not int or not (0 < fn <= WORD and 0 <= arg <= WORD):
            refuse_run(fn, arg)             # (ctypes would pass a str's characters, and wrap 2**64 to 0)
        self._take_lock()        # (a signal handler may re-enter it before _owner is set: no work begun yet)
        try:
            self._owner, late = me, self._exited
            if self.closed:
                raise ValueError(f"this pool was closed (Pool.close()); make a new Pool({self.nthreads}), or "
                                 "use the process's pool, isa.pool.get_pool()")
            if self._stale:
                self._start()               # (and its state, whose barriers regions on OpenMP's threads use too)
            if self is _pool and not late and pool_calls.run_on_openmp(fn, arg, self.nthreads, self._state + pc.OPENMP):
                return                      # (on torch's OpenMP threads: share_openmp_threads)
            if late:
                pool_exit.run_late(self, fn, arg)
            else:
                self._run(self._state, fn, arg)
        finally:
            try:
                if self._replaced or self._exited:
                    self._stop()            # (what _stop_replaced deferred; at exit: no worker outlives it)
            finally:
                self._owner = None
                self._lock.release()

    def _within(self, me):
        """Whether thread ``me`` is inside the pool: in a region (libgomp's threads included) or its start or stop."""
        return me == self._owner or me in self._worker_ids or (self._owner is not None and
                                                               pool_calls.inside_openmp_region())

    @staticmethod
    def _inside(what, fix):
        """The error of ``what`` on a thread inside the pool, where taking the lock would deadlock."""
        return RuntimeError(f"{what} called on a thread already inside this pool: inside a parallel region (a "
                            f"callback), or while it starts or stops the workers (e.g. from a signal handler); {fix}")

    def _take_lock(self):
        """Take the region lock; during finalization, RuntimeError if it is not free within the grace."""
        if not self._lock.acquire(True, pool_exit.lock_wait()):
            raise RuntimeError(pool_exit.HELD_AT_EXIT)

    def run_native(self, shares):
        """Make native calls on the pool's threads with no Python in between: ``shares`` holds
        lists of ``(address, args)`` (a function and up to six integer arguments, as
        :meth:`tppasm.kernel.Kernel.raw_call` returns them; whatever the arguments point to must
        outlive the region); share i runs on thread i % nthreads, each list's calls in order. The
        workers never take the interpreter lock: on the 2-vCPU Zen 4 VM, workers that ran Python
        (and handed the lock back and forth with the caller) were drawn onto the caller's vCPU for
        tens of milliseconds after an idle pause.

        >>> import ctypes
        >>> from isa.x86 import Function, qword
        >>> f = Function("add", ["ptr", "i64"]); p, v = f.args; f.asm.add(qword[p], v); add = f.finalize()
        >>> total = ctypes.c_int64(0); at = ctypes.addressof(total)
        >>> get_pool().run_native([[(add.address, (at, 1))], [(add.address, (at, 2)), (add.address, (at, 4))]])
        >>> total.value
        7
        """
        if not isinstance(shares, (list, tuple)) or not all(isinstance(share, (list, tuple)) for share in shares):
            raise TypeError(f"Pool.run_native: shares={shares!r:.80}; expected a list of lists of (address, args) "
                            "calls, e.g. [[kernel.raw_call(a, b, c)]]")
        table, lists = pool_calls.call_table(shares, self.nthreads)
        if not lists:
            return self.run(self._code["rawcall"].address, table.buffer_info()[0])
        self.run_table(table.buffer_info()[0], lists)

    def run_table(self, at, lists):
        """Make the native calls of the table at address ``at``, laid out as :meth:`run_native`
        lays one out (:mod:`isa.pool_calls`), of ``lists`` lists (1 to :attr:`nthreads`): one on
        the calling thread, with no region, several as a region (:meth:`run`). For callers that replay
        calls on other operands without building them again (:mod:`tppasm.fc_calls`); the table is not checked.

        >>> import array
        >>> table = array.array("Q", [1, 0, 0]); get_pool().run_table(table.buffer_info()[0], 1)   # no calls
        """
        if type(lists) is not int or not 1 <= lists <= self.nthreads:
            raise ValueError(f"Pool.run_table: lists={lists!r}; expected an int from 1 to the pool's {self.nthreads} "
                             "threads (make the table for as many, or run its calls with run_native)")
        if lists > 1 or self.closed:
            return self.run(self._code["rawcall"].address, at)        # (closed: run says so)
        if type(at) is not int or not 0 < at <= WORD:
            refuse_run(self._code["rawcall"].address, at)
        self._code["rawcall"](at, 0, 1)

    def cpu_seconds(self):
        """CPU seconds each thread of a region has run so far: the calling thread (tid 0), then the workers
        (none before the first region); the largest difference across a region is its time without
        the time other processes held the cores (waits spin briefly, then sleep).

        >>> get_pool().cpu_seconds()[0] > 0
        True
        """
        if self._within(threading.get_ident()):
            raise self._inside("Pool.cpu_seconds", "call it after the region")
        with self._lock:
            return [time.thread_time()] + [time.clock_gettime(time.pthread_getcpuclockid(t))
                                           for t in self._workers.threads]

    def close(self):
        """Join the workers and free the pool's memory now (a region in flight ends first); the
        pool then refuses work. Calling it again does nothing; a pool that nothing references is
        closed when it is collected. :func:`get_pool` replaces a closed process pool.

        >>> pool = Pool(2); pool.close(); pool.close()
        >>> pool.run(1, 0)
        Traceback (most recent call last):
        ValueError: this pool was closed (Pool.close()); make a new Pool(2), or use the process's pool, ...
        """
        me = threading.get_ident()
        if self._within(me):
            raise self._inside("Pool.close", "close it after the region")
        self._take_lock()
        try:
            self._owner = me
            self.closed = True
            self._stop()            # (interrupted: the finalizer, or close() again, joins the rest)
            self._release()
        finally:
            self._owner = None
            self._lock.release()

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def _threads(self):
        return self._workers.threads

    def _field(self, ctype, offset):
        return ctype.from_address(self._state + offset)

    def _start(self):
        """Start the workers (the lock is held). A signal handler may raise between any two steps
        (restoring the signal mask runs the pending ones): the pool is then either started, or
        stale with every worker it started still listed, which the next start joins first."""
        self._workers.stop()    # workers left by an interrupted start or stop would read the state cleared here
        ctypes.memset(self._state, 0, pc.state_size(self.nthreads))
        self._field(ctypes.c_uint64, pc.NTHREADS).value = self.nthreads
        self._field(ctypes.c_uint64, pc.SPIN).value = self.spin_iterations
        self._field(ctypes.c_uint32, pc.CALLER_CPU).value = _this_cpu()     # workers start off it
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _ASYNC_SIGNALS)
        try:                                      # workers inherit the mask: signals go to Python threads
            for tid in range(1, self.nthreads):
                rec = self._state + pc.RECORDS + pc.RECORD_SIZE * tid   # initial generation: 0
                (ctypes.c_uint64 * 2).from_address(rec)[:] = (self._state, tid)
                err = _libc.pthread_create(self._workers.slot(tid), None, self._code["worker"].address, rec)
                if err:
                    self._workers.handles[tid] = 0      # glibc wrote the handle of a thread that never ran
                    raise OSError(err, f"only {tid} of {self.nthreads} threads could be started (pthread_create for "
                                  f"worker {tid}: {os.strerror(err)}; ulimit -u, a pids limit, kernel.threads-max, or "
                                  f"ulimit -v leaving no room for stacks): run on fewer, TPPASM_NUM_THREADS={tid} or "
                                  f"loops.set_num_threads({tid}), or raise `ulimit -u`")
            self._worker_ids = frozenset(self._workers.threads)
            self._stale = False                   # before the mask is restored (see above)
        except BaseException:
            self._stop()
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)

    def _stop(self):
        """Make the workers return and join them (the lock is held or no region can run)."""
        self._stale = True                        # first: a stop cut short still restarts them
        self._worker_ids = frozenset()
        self._workers.stop()

    def _stop_replaced(self):
        """Join the workers once a region in flight ends (the pool was replaced by another). On a
        thread inside the pool (a signal handler that interrupted its region or the start or stop of
        its workers, a worker's callback into Python) the stop waits for the end of that: joining now
        would leave the region waiting for workers that are gone, or deadlock."""
        self._replaced = True
        me = threading.get_ident()
        if self._within(me):
            return
        self._take_lock()
        try:
            self._owner = me     # a signal handler's run on this thread: RuntimeError
            self._stop()
        finally:
            self._owner = None
            self._lock.release()

    def _after_fork_in_child(self):
        # The parent's workers do not exist here, and the lock may have been held by a thread
        # that does not exist either.
        self._lock = threading.RLock()
        self._owner = None
        self._workers.forget()
        self._worker_ids, self._stale = frozenset(), True
        self._pid = os.getpid()

    _at_exit = pool_exit.stop_at_exit     # waits for a region in flight and joins the workers

    def __deepcopy__(self, memo=None):
        return self         # (and copy.copy) a copy sharing the threads and state would free them twice
    __copy__ = __deepcopy__

    def __reduce__(self):
        raise TypeError(f"a pool is this process's threads: make another Pool({self.nthreads}) in the other process")

    def __repr__(self):
        state = "closed" if self.closed else f"spin {self.spin_iterations} pauses"
        return f"<Pool {self.nthreads} threads, {state}>"


_pool = None
_pool_lock = threading.RLock()      # (a signal handler may replace a closed pool while its thread does)
_POOLS = weakref.WeakSet()          # every pool: a forked child restarts their workers


def _after_fork_in_child():
    global _pool_lock, _code_lock
    _pool_lock = threading.RLock()      # a thread of the parent may have held it at the fork
    _code_lock = threading.Lock()
    for pool in list(_POOLS):
        pool._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _stop_pools_at_exit():
    pool_exit.stop_all(list(_POOLS))


def get_pool():
    """The process's pool (created on first use; threads from :func:`default_threads`, or the
    last :func:`set_num_threads`; replaced by one of as many threads if it was closed).

    >>> get_pool() is get_pool()
    True
    """
    pool = _pool
    return pool if pool is not None and not pool.closed else _switch_pool(None)


def is_current(pool):
    """Whether ``pool`` is the process's pool and open, without creating or replacing one (a nest
    compiled for a pool that set_num_threads replaced, or that was closed, compiles again).

    >>> is_current(get_pool()), is_current(Pool(1))
    (True, False)
    """
    return pool is _pool and not pool.closed


def _switch_pool(n):
    """The process's pool, replaced by a new one of ``n`` threads (None: as many as before) unless
    it is open and has that many; the old one's workers are joined once its region in flight ends,
    and its memory is freed when nothing references it any more."""
    global _pool
    with _pool_lock:
        old = _pool
        if old is not None and not old.closed and n in (None, old.nthreads):
            return old
        n = n or (old.nthreads if old is not None else default_threads())
        _pool = new = Pool(n)
    if old is not None:
        if not old.closed:
            old._stop_replaced()         # a region in flight on the old pool finishes first
        for callback in ON_NEW_POOL:
            callback()
    return new


# called after set_num_threads replaced the pool (loops.decorator drops nests compiled for the old one)
ON_NEW_POOL = []


def share_openmp_threads(share=True):
    """Run the regions of the process's pool (loop nests, :mod:`tppasm.fc`'s products) on the threads
    of the GNU OpenMP runtime this process loaded (torch's libgomp), which then take the work
    instead of spinning beside the pool's workers (:mod:`isa.pool_calls`); :mod:`tppasm.torch`
    calls it. ``share=False``: on the pool's workers again. Returns whether they run on OpenMP's
    threads (False where none is loaded or off x86-64; never in a forked child or at exit).

    >>> share_openmp_threads(False)
    False
    """
    return pool_calls.share_openmp(share)


def get_num_threads():
    """How many threads parallel loop nests run on (the caller included).

    >>> import loops; loops.get_num_threads() >= 1          # by default, the CPUs this process may run on
    True
    """
    return _pool.nthreads if _pool is not None else default_threads()


def set_num_threads(n):
    """Run parallel loop nests on ``n`` threads from now on (like ``torch.set_num_threads``): the
    pool is replaced, the old one's workers are joined once its region in flight (if any) ends,
    and nests compile again for the new count on their next call. Loop kernels built with their
    own ``pool=`` keep it.

    >>> import loops; before = loops.get_num_threads(); loops.set_num_threads(1); loops.get_num_threads()
    1
    >>> loops.set_num_threads(before)
    """
    wanted = "an int >= 1 (threads, the caller included)"
    try:
        count = operator.index(n) if not isinstance(n, bool) else None
    except TypeError:
        count = None
    if count is None:
        raise TypeError(f"set_num_threads({n!r}): expected {wanted}, e.g. set_num_threads(4)")
    if not 1 <= count <= MAX_THREADS:
        raise ValueError(f"set_num_threads({_count_text(n)}): expected {wanted}, at most {MAX_THREADS}")
    _switch_pool(count)
