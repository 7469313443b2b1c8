"""The static instruction-mix report of the SVE BRGEMM microkernels."""
from bench.sve_static import analyse, main


def test_fp32_issues_two_fmas_per_load_at_vl256():
    rows = {r["kernel"]: r for r in analyse(64, 64, vl=256)}
    assert rows["f32/indexed"]["macs_per_load"] >= 2 and rows["f32/dot"]["macs_per_load"] >= 2
    assert all(r["accumulators"] <= 24 for r in rows.values())


def test_main_prints_and_writes_json(tmp_path, capsys):
    out = tmp_path / "mix.json"
    assert main(["--json", str(out)]) == 0
    assert "f32/dot" in capsys.readouterr().out
    assert '"macs_per_load"' in out.read_text()
