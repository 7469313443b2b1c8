"""x86-64 machine code of the loop layer: the nest generator (:mod:`.nest`); it runs on the thread pool
of :mod:`isa.pool`."""
