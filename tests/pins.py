"""Which installed packages differ from the pinned set in constraints.txt (shown in the test header)."""
import importlib.metadata
import pathlib
import re
import sys

PINS = pathlib.Path(__file__).resolve().parent.parent / "constraints.txt"


def _name(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(path=PINS):
    """{normalized name: version} of constraints.txt, and the Python version it was made with."""
    pins, python = {}, None
    for line in path.read_text().splitlines():
        if line.startswith("# python:"):
            python = line.split(":", 1)[1].strip()
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[_name(name)] = version.strip()
    return pins, python


def differences(path=PINS):
    """Lines naming each way this environment is outside the pins (empty: inside them).

    >>> differences() == [] or all(isinstance(d, str) for d in differences())
    True
    """
    if not path.exists():
        return [f"{path.name} is missing"]
    pins, python = pinned(path)
    out = []
    here = "%d.%d" % sys.version_info[:2]
    if python and python != here:
        out.append(f"Python {here} (pins made with {python})")
    for dist in importlib.metadata.distributions():
        name = _name(dist.metadata["Name"] or "")
        want = pins.get(name)
        have = dist.version.split("+", 1)[0]         # a local label (+cpu) is the same release
        if want is not None and have != want:
            out.append(f"{name} {dist.version} (pinned {want})")
    return sorted(out)
