"""Scratch arrays of a loop kernel: working memory of its body, not results.

A body may keep partial results in an array it passes from one kernel call to the next, e.g. one
slot per thread, ``S[thread().tid]``. What such an array holds after a call depends on the spec
and the thread count (each slot holds what its thread computed last), so it is no result: declare
it with ``loops.kernel(..., scratch=("S",))``. Then

- :func:`tppasm.testing.assert_matches_reference` does not compare it with the reference (the
  ``.python()`` run, which runs every iteration as thread 0 and so never writes ``S[1]``), and
- the tuner (:mod:`loops.tune`) does not compare a candidate's with the kernel's own spec's (a
  spec that splits the loops differently leaves other values there),

while both still check every other array (and that nothing outside ``S`` is written). The
bounds and race checks treat it as any array: two threads that share a slot race.

>>> import numpy as np, tppasm as tpp
>>> from loops import Loop, get_num_threads, kernel, thread
>>> from tppasm.testing import assert_matches_reference
>>> relu, add = tpp.relu(4, 8), tpp.binary("add", 4, 8)
>>> @kernel("A", Loop(0, 4), scratch=("S",))
... def k(i, X, S, Y):
...     relu(X[i], S[thread().tid])            # one slot of S per thread
...     add(S[thread().tid], X[i], Y[i])       # Y = relu(X) + X
>>> X = np.random.default_rng(0).standard_normal((4, 4, 8)).astype(np.float32)
>>> S, Y = np.zeros((get_num_threads(), 4, 8), np.float32), np.zeros_like(X)
>>> assert_matches_reference(k, X, S, Y)          # Y compared, S not (on any number of threads)
>>> k.scratch
('S',)

An output of which only part is scratch (the padding columns of a blocked result that a
``result()`` crops) cannot be declared so: check it with ``outputs=()`` (nothing poisoned, so an
element the nest leaves keeps what the arrays given held) or on arrays without the padding.
"""


def check_scratch(scratch, array_names, name):
    """``scratch`` (names of array parameters; one name may be given as a string) as a tuple in the
    body's order, or the TypeError / ValueError that says what to write.

    >>> check_scratch("S", ["X", "S"], "k"), check_scratch({"S", "X"}, ["X", "S"], "k")
    (('S',), ('X', 'S'))
    >>> check_scratch(("T",), ["X", "S"], "k")
    Traceback (most recent call last):
    ...
    ValueError: k: scratch names 'T', which is no array parameter of the body (X, S); write scratch=('S',) ...
    """
    if isinstance(scratch, str):
        scratch = (scratch,)
    if not isinstance(scratch, (tuple, list, frozenset, set)) or not all(isinstance(s, str) for s in scratch):
        raise TypeError(f"{name}: scratch={scratch!r}; expected a tuple of array parameter names, e.g. "
                        f"scratch=({(list(array_names) or ['S'])[-1]!r},)")
    for s in scratch:
        if s not in array_names:
            example = (list(array_names) or ["S"])[-1]
            raise ValueError(f"{name}: scratch names {s!r}, which is no array parameter of the body "
                             f"({', '.join(array_names)}); write scratch=({example!r},) with names of its "
                             "array parameters")
    return tuple(n for n in array_names if n in scratch)      # the body's order: a set's follows the hash seed
