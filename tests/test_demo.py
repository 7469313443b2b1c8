"""The README's first command runs the demo: it must JIT, check against NumPy and print both speeds."""
import tppasm.__main__ as cli


def test_demo_checks_and_times(capsys):
    assert cli.main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "-> OK" in out and "tppasm" in out and "numpy" in out and "ratio" in out
