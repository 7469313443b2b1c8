"""x86 code generators for the TPPs (AVX2 and AVX-512; AMX for BRGEMM where present)."""

_GENERATORS = {}


def register(kind):
    """Decorator: ``@register("unary")`` makes a function ``(desc, isa) -> JitFunction`` the generator."""
    def wrap(fn):
        _GENERATORS[kind] = fn
        return fn
    return wrap


def generate(desc, isa):
    """The raw kernel for ``desc`` on ``isa`` (a :class:`isa.x86.JitFunction`)."""
    gen = _GENERATORS.get(desc.kind)
    if gen is None:             # import every generator module (one may already be imported alone)
        from . import brgemm, eltwise  # noqa: F401  (they register themselves)
        gen = _GENERATORS.get(desc.kind)
    if gen is None:
        raise NotImplementedError(f"no x86 generator for {desc.kind!r}")
    return gen(desc, isa)
