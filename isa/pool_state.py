"""The thread pool's shared state: one block of plain read+write memory, the same on every ISA.

Byte offsets of its fields (fields written by different parties sit on different cache lines),
the futex operations the pools' machine code uses on its words, its size, and the value of its
SPIN field. The machine code that reads and writes it is per ISA (:mod:`isa.x86.pool_code`,
:mod:`isa.aarch64.pool_code`); the protocol is described there.

>>> state_size(2) - state_size(1) == RECORD_SIZE
True
"""

# State layout: byte offsets. Fields written by different parties sit on different cache lines.
GEN = 0            # u32 region generation; futex word the idle workers sleep on
FN = 8             # u64 address of the region's function
ARG = 16           # u64 its argument
NTHREADS = 24      # u64 threads of a region (the caller included)
QUIT = 32          # u32 nonzero: workers return at the next generation
SPIN = 40          # u64 pause iterations before sleeping
FP_CONTROL = 48    # u64 the caller's floating-point control for the region, which every worker loads
                   # before its share: MXCSR (x86, u32: FTZ/DAZ, rounding) or FPCR (AArch64: FZ, RMode)
SLEEPERS = 64      # u32 workers asleep on GEN
REMAIN = 128       # u32 workers that have not finished the region; futex word of the caller
CALLER_SLEEPS = 192  # u32 the caller is (about to be) asleep on REMAIN
BCOUNT = 256       # u32 threads arrived at the current barrier
BGEN = 320         # u32 barrier generation; futex word of barrier sleepers
BSLEEPERS = 384    # u32 threads asleep on BGEN
CALLER_CPU = 448   # u32 the CPU the caller ran on when it last woke sleeping workers (first: the one
                   # the pool was started from), else NO_CPU
NO_CPU = 0xFFFFFFFF
OPENMP = 456       # 5 u64: a region the caller runs on OpenMP's threads instead (isa.pool_calls.OpenMPRegions)
RECORDS = 512      # per-worker start records: u64 state, u64 tid, u32 initial generation
RECORD_SIZE = 32

# The argument table of ``rawcall``, the region of Pool.run_native: how many threads have calls,
# then per such thread the address of its first call record and how many records follow; a record
# is a function address and its six integer arguments (System V / AAPCS64 registers).
RAW_COUNT = 0
RAW_LISTS = 8      # (u64 first record, i64 records) per thread
RAW_LIST_SIZE = 16
RAW_RECORD_SIZE = 56
RAW_ARGS = 6

# Waits spin on pause (x86) / yield (AArch64) with a sched_yield every YIELD_EVERY iterations (a
# power of two). A woken worker on the caller's CPU moves off it: its affinity mask, read and
# written whole, takes MASK_BYTES.
YIELD_EVERY = 256  # ~9 µs of pause on Zen 4: a tight fork-join never yields
MASK_BYTES = 128   # 1024 CPUs

FUTEX_WAIT_PRIVATE = 0 | 128
FUTEX_WAKE_PRIVATE = 1 | 128
WAKE_ALL = 0x7FFFFFFF


def state_size(nthreads):
    """Bytes of state for a pool of ``nthreads`` (worker records included)."""
    return RECORDS + RECORD_SIZE * max(nthreads, 1)


def spin_iterations(n):
    """The SPIN budget for ``n`` iterations: at least 1, and a multiple of YIELD_EVERY when it
    holds one, so a wait's first ``sched_yield`` (where the remaining budget is a multiple of it)
    comes after YIELD_EVERY spins, never after the first few (a barrier's wait is a few spins).

    >>> spin_iterations(0), spin_iterations(20.4), spin_iterations(28125)
    (1, 20, 27904)
    """
    n = max(1, round(n))
    return n - n % YIELD_EVERY if n >= YIELD_EVERY else n
