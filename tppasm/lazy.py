"""Small objects kernels are made of or hand out: a class attribute computed when first read (what
kernel classes use for the docstrings and signatures that ``help()`` shows: writing them for every
kernel made would cost a process that loads its kernels from the disk cache a third of its time),
wrapper classes, and code addresses that hold the code (and the arrays) a native call points to.

>>> class C:
...     answer = OnFirstRead(lambda: 6 * 7)
>>> C.answer, C().answer
(42, 42)
"""
import threading
import weakref


class OnFirstRead:
    """A class attribute computed by ``make()`` when first read (from the class or an instance)."""

    def __init__(self, make):
        self.make, self.value = make, None

    def __get__(self, obj, cls=None):
        if self.value is None:
            self.value = self.make()
        return self.value


def wrapper_class(kernel, base):
    """A subclass of ``base`` (a wrapper that calls ``kernel``) named as the kernel's class, whose
    ``__doc__`` and ``__signature__`` are the kernel's, so that ``help()`` and
    ``inspect.signature()`` of the wrapper show its operands; made once per kernel and base (kept
    on the kernel, with no reference cycle through it).

    >>> import tppasm
    >>> from tppasm.spmm import BlockSpmmKernel
    >>> k = tppasm.block_spmm(bm=4, bk=4, n=16, kb=2)
    >>> wrapper_class(k.kernel, BlockSpmmKernel) is type(k), type(k).__doc__ == type(k.kernel).__doc__
    (True, True)
    """
    made = kernel.__dict__.setdefault("_wrapper_classes", {})
    if base not in made:
        me = weakref.ref(kernel)
        made[base] = type(type(kernel).__name__, (base,), {
            "__doc__": OnFirstRead(lambda: me() and type(me()).__doc__),
            "__signature__": OnFirstRead(lambda: me() and me().__signature__), "__module__": base.__module__})
    return made[base]


def one_wrapper(kernel, base):
    """The ``base(kernel)`` wrapper of ``kernel``: one per kernel while it is referenced, so equal
    constructor arguments, copies and unpicklings give the same object, as they give the same
    kernel. The kernel holds it weakly (a strong reference would be a cycle, freed only by the
    collector).

    >>> class K:
    ...     pass
    >>> class W:
    ...     def __init__(self, kernel):
    ...         self.kernel = kernel
    >>> k = K(); one_wrapper(k, W) is one_wrapper(k, W)
    True
    """
    with _WRAPPING:                             # (two threads' first calls: one wrapper)
        held = getattr(kernel, "_wrapper", None)
        wrapper = held() if held is not None else None
        if not isinstance(wrapper, base):
            wrapper = base(kernel)
            kernel._wrapper = weakref.ref(wrapper)
        return wrapper


_WRAPPING = threading.Lock()


class KernelWrapper:
    """Base of a wrapper whose calls check or prepare something before ``kernel``'s: one per kernel
    (:func:`one_wrapper`, also for copies and unpicklings), of a class named as the kernel's
    (:func:`wrapper_class`: ``help()`` shows the operands), shown as the kernel, its other
    attributes the kernel's (``desc``, ``raw``, ...). A subclass defines ``__call__``.

    >>> class Loud(KernelWrapper):
    ...     def __call__(self, *arrays):
    ...         print("calling"); return self.kernel(*arrays)
    >>> import copy, tppasm
    >>> k = tppasm.zero(1, 2); w = one_wrapper(k, Loud)
    >>> _ = w(); w.desc is k.desc, copy.copy(w) is w, repr(w) == repr(k)
    calling
    (True, True, True)
    """

    def __init__(self, kernel):
        self.kernel, self.desc = kernel, kernel.desc
        self.__class__ = wrapper_class(kernel, type(self))

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)        # copy/pickle probes, before __init__ ran
        return getattr(self.kernel, name)

    def __reduce__(self):
        return one_wrapper, (self.kernel, type(self).__bases__[0])

    def __repr__(self):
        return repr(self.kernel)

    def _repr_html_(self):
        return self.kernel._repr_html_()


class CodeAddress(int):
    """A native function's address, an int that holds ``owner`` (the object whose executable memory
    it points into, and what else a call's arguments point into) while the address itself is
    referenced: what ``Kernel.raw_address`` returns, so that a hand-built ``(kernel.raw_address,
    args)`` call keeps the code mapped, and what a batched BRGEMM's ``raw_call`` puts first in the
    pair it returns (holding the kernel and the arrays it made: the offsets it checked, copied; the
    blocks' address arrays), so that the pair, unpacked or not, keeps all of it. Arithmetic on it,
    and ``int(address)``, give plain ints, which hold nothing.

    >>> a = CodeAddress(4096, owner="code"); (a == 4096, a.owner, type(a + 0).__name__)
    (True, 'code', 'int')
    """

    def __new__(cls, address, owner):
        self = int.__new__(cls, address)
        self.owner = owner
        return self

    def __reduce__(self):
        return int, (int(self),)

    def __copy__(self, *memo):
        return self                      # (immutable: a copy is itself, still holding the code)

    __deepcopy__ = __copy__

    def __repr__(self):
        return int.__repr__(self)
