"""``python -m bench linear`` end to end on tiny shapes: one record per shape and dtype with the
path tppasm.fc takes, a ratio and the weight's bandwidth, plus the host's read bandwidth."""
import json

import pytest

from bench import linear

pytest.importorskip("torch")


def test_linear_bench_writes_a_record_per_shape(tmp_path):
    out = tmp_path / "linear.json"
    assert linear.main(["--shapes", "2x40x24,40x24x40", "--dtypes", "f32,bf16", "--rounds", "1", "--threads", "1",
                        "--sweep-mib", "8", "--json", str(out)]) == 0
    records = json.loads(out.read_text())
    rows = [r for r in records if "path" in r]
    assert [(r["dtype"], r["n x k -> m"], r["path"]) for r in rows] == [
        ("f32", "2x40->24", "dots"), ("f32", "40x24->40", "panels"),
        ("bf16", "2x40->24", "dots"), ("bf16", "40x24->40", "panels")]
    assert all(r["torch/ours"] > 0 and r["torch/frozen"] > 0 and r["weight GB/s"] > 0 for r in rows)
    assert [r["GB/s"] > 0 for r in records if "GB/s" in r] == [True]


def test_shapes_are_checked():
    with pytest.raises(Exception, match="rows x in x out"):
        linear.shapes("8x4096")
