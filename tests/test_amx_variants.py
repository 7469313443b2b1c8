"""bench.amx_variants: every variant it times computes the BRGEMM (in the interpreter here, natively
on AMX hosts), the kernels without prefetch have none, its native driver calls a kernel as often as
asked, and its timing path gives every variant a record (with stand-ins for the AMX code)."""
from dataclasses import replace

import numpy as np
import pytest

from bench import amx_variants
from bench.amx_variants import CASES, VARIANTS, Case, driver, generated, operands, relative_error
from isa.cpu import host
from isa.x86 import Function, qword, rax, rdi

from tests.tpp.test_amx import Env

SMALL = [replace(c, k=256) if c.lda else replace(c, count=min(c.count, 5))    # the prefill cases:
         for c in CASES]                                  # their leading dimensions, k cut short


def _run(case, variant, seed=0):
    A, B, C, ref = operands(case, np.random.default_rng(seed))
    fn, setup = generated(case, variant)
    env = Env()
    if setup is not None:
        env.call(setup)
    env.call(fn, [env.ptr(A), env.ptr(B), env.ptr(C), case.count])
    if env.m is not None:
        env.sync()
    return fn, C, ref


@pytest.mark.parametrize("case,variant", [(c, v) for c in SMALL for v in c.variants],
                         ids=lambda x: x.what if isinstance(x, Case) else x)
def test_every_variant_computes_the_brgemm(case, variant):
    _, C, ref = _run(case, variant)
    assert relative_error(C, ref) < (1e-5 if case.dtype == "bf16" else 1e-12)      # the poison is gone too


def test_without_prefetch_the_kernel_has_none_and_the_same_result():
    case = SMALL[0]
    with_pf, c1, _ = _run(case, "unchunked")
    without, c2, _ = _run(case, "no prefetch")
    assert "prefetcht0" in with_pf.disassemble() and "prefetcht0" not in without.disassemble()
    assert np.array_equal(c1, c2)


def test_without_the_stream_hint_every_tile_load_is_plain_and_the_result_the_same():
    case = next(c for c in SMALL if c.what.startswith("B's panel"))
    hinted, c1, _ = _run(case, "unchunked")
    plain, c2, _ = _run(case, "no stream hint")
    assert "tileloaddt1" in hinted.disassemble() and "tileloaddt1" not in plain.disassemble()
    assert np.array_equal(c1, c2)


def test_the_kernel_configured_once_leaves_the_tiles_to_its_caller():
    case = SMALL[0]
    every_call, _, _ = _run(case, "unchunked")
    once, c_once, ref = _run(case, "configured once")
    assert "sttilecfg" in every_call.disassemble()
    assert "tilecfg" not in once.disassemble() and relative_error(c_once, ref) < 1e-5


def test_the_contiguous_case_does_the_goal_shapes_work_in_1_kib_a_tiles():
    goal, flat = CASES[0], next(c for c in CASES if "contiguous" in c.what)
    assert flat.work == goal.work and flat.desc().lda * 2 * 16 == 1024


def test_the_prefill_cases_differ_only_in_the_leading_dimension():
    a, b = CASES[-2], CASES[-1]
    assert (a.m, a.n, a.k, a.count) == (b.m, b.n, b.k, b.count)
    assert a.lda * 2 % 4096 == 0 and b.lda * 2 % 4096 == 64


def test_the_driver_calls_the_kernel_trips_times_with_its_arguments():
    bump = Function("bump", ["ptr", "ptr", "ptr", "i64"])
    bump.asm.add(qword[rdi], 1)
    drive = driver(bump.finalize())
    counter = np.zeros(1, np.int64)
    for trips in (0, 1, 7):
        counter[0] = 0
        drive(trips, counter.ctypes.data, 0, 0, 0)
        assert counter[0] == trips


def test_the_driver_runs_the_setup_once_before_the_calls():
    counters = np.zeros(2, np.int64)
    bump = Function("bump", ["ptr", "ptr", "ptr", "i64"])
    bump.asm.add(qword[rdi], 1)
    setup = Function("setup", [])
    setup.asm.mov(rax, counters.ctypes.data + 8)
    setup.asm.add(qword[rax], 1)
    drive = driver(bump.finalize(), setup.finalize())
    drive(7, counters.ctypes.data, 0, 0, 0)
    assert counters.tolist() == [7, 1]


def test_each_variant_gets_a_record_and_a_kernel_that_writes_nothing_an_infinite_error(monkeypatch):
    """The timing path with stand-ins (AMX code cannot run natively here): a native kernel that
    returns at once, and a spinning peak loop."""
    from bench import peaks
    nothing = Function("nothing", ["ptr", "ptr", "ptr", "i64"]).finalize()
    no_setup = Function("no_setup", []).finalize()
    monkeypatch.setattr(amx_variants, "generated",
                        lambda case, name: (nothing, None if VARIANTS[name][2] else no_setup))
    monkeypatch.setattr(peaks, "peak_loop", lambda dtype, unit: (lambda: sum(range(200)), 1e6))
    case = replace(CASES[0], count=2)
    got = amx_variants.time_case(case, rounds=3, rng=np.random.default_rng(0), trips=5)
    assert [r["variant"] for r in got] == list(case.variants)
    for r in got:
        assert r["max_rel_err"] == float("inf") and r["pct_peak"] > 0 and r["us"] > 0
        assert r["pct_peak"] <= r["pct_peak_q90"]


def test_options_are_checked(capsys):
    with pytest.raises(SystemExit):
        amx_variants.parse(["--rounds", "0"])
    assert "--rounds" in capsys.readouterr().err


@pytest.mark.skipif("amx" in host().levels, reason="an AMX host times the variants")
def test_without_amx_nothing_is_timed_and_it_says_so(capsys):
    assert amx_variants.run(rounds=1) is None
    assert "no native AMX" in capsys.readouterr().out
