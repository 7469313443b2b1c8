"""AArch64 machine code of the loop layer: the nest generator (:mod:`.nest`) and the thread pool's code
(:mod:`.pool_code`)."""
