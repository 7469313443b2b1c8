"""Loop DSL: PARLOOPER loop specs compiled to native loop nests around tppasm kernels.

``kernel(spec, *loops)`` decorates a body ``f(i_a, i_b, ..., *arrays)``; ``Loop`` declares a
logical loop; ``thread()`` gives the thread id and grid coordinates inside a body; the native
thread pool is :mod:`isa.pool` (``get_num_threads()`` / ``set_num_threads(n)`` at run time;
``share_openmp_threads()`` runs its nests on torch's OpenMP threads, which otherwise spin beside
them after each torch operator).

>>> from loops import Loop, kernel
>>> @kernel("aB", Loop(0, 2), Loop(0, 3))
... def nothing(i, j):
...     pass
>>> nothing()
"""
from .decorator import BoundsError, LoopKernel, kernel  # noqa: F401
from isa.pool import get_num_threads, set_num_threads, share_openmp_threads  # noqa: F401
from .spec import Loop, SpecError  # noqa: F401
from .trace import TraceError, thread  # noqa: F401
