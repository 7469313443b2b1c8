"""A class attribute computed when first read: what kernel classes use for the docstrings and
signatures that ``help()`` shows (writing them for every kernel made would cost a process that
loads its kernels from the disk cache a third of its time).

>>> class C:
...     answer = OnFirstRead(lambda: 6 * 7)
>>> C.answer, C().answer
(42, 42)
"""


class OnFirstRead:
    """A class attribute computed by ``make()`` when first read (from the class or an instance)."""

    def __init__(self, make):
        self.make, self.value = make, None

    def __get__(self, obj, cls=None):
        if self.value is None:
            self.value = self.make()
        return self.value
