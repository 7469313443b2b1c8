"""Every docstring example in the packages runs and gives what it shows."""
import doctest
import importlib
import pkgutil

import pytest

PACKAGES = ("isa", "tppasm", "loops", "bench")
OPTIONAL = ("torch",)      # modules that need these are skipped where they are not installed


def modules():
    names = []
    for pkg in PACKAGES:
        names.append(pkg)
        names += [info.name for info in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + ".")
                  if not info.name.endswith("__main__")]
    return names


@pytest.mark.parametrize("name", modules())
def test_docstring_examples(name):
    module = _import(name)
    if module is None:
        pytest.skip(f"{name} needs one of {', '.join(OPTIONAL)}, not installed")
    result = doctest.testmod(module, report=False, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} docstring examples failed (run python -m doctest -v on it)"


def test_examples_are_found():
    assert sum(doctest.testmod(m, report=False).attempted for m in map(_import, modules()) if m) > 200


def _import(name):
    """The module, or None where it needs an optional package that is not installed."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name not in OPTIONAL:
            raise
        return None
