"""Every Python example of the README runs as written."""
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_examples():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, capsys):
    exec(compile(BLOCKS[index], f"README.md python block {index}", "exec"), {"__name__": "readme"})


def test_readme_properties_have_no_deadline():
    """A user copying an example runs it without tests/conftest.py's profile: a property whose
    examples JIT new kernels must not keep hypothesis's 200 ms deadline (flaky on a busy host)."""
    given = [b for b in BLOCKS if "@given" in b]
    assert given
    for block in given:
        assert re.search(r"@settings\(", block), block
        for line in re.findall(r"@settings\((.*)\)", block):
            assert "deadline=None" in line, line
