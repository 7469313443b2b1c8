"""Every docstring example in the packages runs and gives what it shows."""
import doctest
import importlib
import pkgutil

import pytest

PACKAGES = ("isa", "tppasm", "loops", "bench")


def modules():
    names = []
    for pkg in PACKAGES:
        names.append(pkg)
        names += [info.name for info in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + ".")
                  if not info.name.endswith("__main__")]
    return names


@pytest.mark.parametrize("name", modules())
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), report=False, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} docstring examples failed (run python -m doctest -v on it)"


def test_examples_are_found():
    assert sum(doctest.testmod(importlib.import_module(n), report=False).attempted for n in modules()) > 200
