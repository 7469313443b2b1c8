"""Races the checker's model of threads must see (each found by a mutation of that model which no
other test caught): consecutive chunks of a dynamic schedule may run on two threads at once, and a
fini hook with no barrier before it runs beside the other threads' bodies."""
import numpy as np
import pytest

import tppasm as tpp
from isa.pool import Pool
from loops import Loop, kernel, thread
from loops.races import RaceError

copy, zero, relu = tpp.copy(4, 4), tpp.zero(4, 4), tpp.relu(4, 4)


def test_consecutive_dynamic_chunks_writing_one_block_race():
    @kernel("AB@schedule(dynamic,1)", Loop(0, 2), Loop(0, 2), pool=Pool(2))
    def gather(i, j, X, Y):
        copy(X[i, j], Y[i])                  # iterations (i, 0) and (i, 1): two chunks, one block

    with pytest.raises(RaceError, match="data race"):
        gather(np.ones((2, 2, 4, 4), np.float32), np.zeros((2, 4, 4), np.float32))


def test_a_fini_hook_writing_another_threads_block_races():
    @kernel("A", Loop(0, 4), pool=Pool(2))
    def rows(i, X, Y):
        relu(X[i], Y[i])

    @rows.fini
    def done(X, Y):
        zero(Y[3 - 2 * thread().tid])        # thread 0 clears Y[3], which thread 1's body writes

    with pytest.raises(RaceError, match="data race"):
        rows(np.ones((4, 4, 4), np.float32), np.zeros((4, 4, 4), np.float32))
