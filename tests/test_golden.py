"""Generated machine code is byte-for-byte what tests/golden_hashes.json recorded (see tests/golden.py).

A change to any generator that alters its output fails here until the hashes are renewed on purpose
with ``python -m tests.golden --update`` (and the diff of tests/golden_hashes.json reviewed).
"""
import json

from tests import golden


def test_generated_code_matches_the_golden_hashes():
    want = json.loads(golden.HASHES.read_text())
    got = golden.compute()
    changed = sorted(k for k in want if got.get(k) != want[k])
    assert set(got) == set(want), "the golden cases changed: run python -m tests.golden --update"
    assert not changed, (f"{len(changed)} of {len(want)} generated kernels/nests changed, e.g. {changed[:3]}; if "
                         "that is intended, run python -m tests.golden --update and review the diff")


def test_the_golden_set_covers_every_isa_and_kind():
    names = json.loads(golden.HASHES.read_text())
    for isa in golden.ISAS:
        kinds = {name.split()[1].split("(")[0] for name in names if name.startswith(isa + " ")}
        assert kinds >= {"Brgemm", "Unary", "Binary", "Ternary", "Reduce", "Transform"}, (isa, kinds)
    assert sum(name.startswith("nest ") for name in names) == 2 * len(golden.SPECS)
