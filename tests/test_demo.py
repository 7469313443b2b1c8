"""The README's first command runs the demo: it must JIT, check against NumPy and print both speeds,
at every ISA level the host runs natively."""
import tppasm.__main__ as cli


def test_demo_checks_and_times(capsys, isa_level):
    assert cli.main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "-> OK" in out and "tppasm" in out and "numpy" in out and "ratio" in out
    assert f"host ISA: {isa_level}" in out


def test_info_says_which_levels_run_natively_and_which_are_tested_otherwise(capsys):
    from isa.cpu import host
    cli.main(["info"])
    out = capsys.readouterr().out
    native = next(line for line in out.splitlines() if line.startswith("native"))
    assert native.split("(")[0].split()[1:] == host().levels
    lacking = [lv for lv in ("avx2", "avx512", "amx") if lv not in host().levels]
    if lacking:
        assert f"interp    {' '.join(lacking)}" in out
    assert ("emulated  sve" in out) != ("sve" in host().levels)
    cli.main(["info", "--json"])
    v = __import__("json").loads(capsys.readouterr().out)["verification"]
    assert v["native"] == host().levels and set(v["native"] + v["interpreter"] + v["emulator"]) == {
        "avx2", "avx512", "amx", "sve"}


def test_a_malformed_setting_is_one_line_naming_the_fix_not_a_traceback():
    from tests.scripts import start
    for command in ("info", "demo", "cache"):
        proc = start(f"import sys; from tppasm.__main__ import main; sys.exit(main([{command!r}] + "
                     f"(['info'] if {command!r} == 'cache' else [])))",
                     {"TPPASM_ISA": "bogus", "TPPASM_CACHE_MB": "1e-9" if command == "cache" else "64"})
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 2 and "Traceback" not in err, (command, err)
        assert ("TPPASM_CACHE_MB='1e-9'" if command == "cache" else "TPPASM_ISA='bogus'") in err
