"""``python -m bench``'s command line refuses bad options up front: argparse's error (exit status 2)
naming the option, what it expects and an example, before any suite work, never a traceback, a
crash (``--threads 99999`` took torch down) or a silently accepted zero or empty list. Parsed
through the suites' real parsers (``parse(argv)``), which do no work."""
import importlib
import types

import pytest

import bench.__main__ as bench_main
from isa.pool import MAX_THREADS


def refused(capsys, parse, argv):
    """stderr of ``parse(argv)``, which must exit as argparse's error does."""
    with pytest.raises(SystemExit) as e:
        parse(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("module, argv, words", [
    ("linear", ["--threads", "99999"], f"argument --threads: '99999': expected a number of threads (0: all CPUs) "
                                       f"from 0 to {MAX_THREADS}, e.g. --threads 2"),
    ("linear", ["--threads", "-1"], "argument --threads: '-1'"),
    ("linear", ["--rounds", "0"], "argument --rounds: '0': expected a positive number of rounds, e.g. --rounds 9"),
    ("linear", ["--sweep-mib", "x"], "argument --sweep-mib: 'x'"),
    ("linear", ["--shapes", "8x4096"], "argument --shapes: '8x4096': expected rows x in x out triples"),
    ("linear", ["--dtypes", "f16"], "argument --dtypes: 'f16': expected dtypes out of f32, bf16"),
    ("gemm", ["--sizes", ""], "argument --sizes: '': expected sizes N or MxNxK (positive), comma separated, "
                              "each once, e.g. --sizes 512,1000x700x300"),
    ("gemm", ["--sizes", "64x32"], "argument --sizes: '64x32'"),
    ("gemm", ["--sizes", "512,"], "argument --sizes: '512,'"),
    ("gemm", ["--threads", "a"], "argument --threads: 'a': expected numbers of threads from 1 to"),
    ("gemm", ["--threads", "1,,2"], "e.g. --threads 1,2"),
    ("gemm", ["--tune-seconds", "-1"], "argument --tune-seconds: '-1': expected a number of seconds, 0 or more"),
    ("gemm", ["--tune-seconds", "nan"], "argument --tune-seconds: 'nan'"),
    ("gemm", ["--threads", "1,2,1"], "argument --threads: '1,2,1': expected numbers of threads from 1 to 4096, "
                                     "comma separated, each once"),
    ("gemm", ["--dtypes", "f32,f32"], "comma separated, each once"),
    ("gemm", ["--no-tune", "--fresh", "--tune-clock", "cpu"],
     "--no-tune times the fixed configuration alone: --fresh, --tune-clock would do nothing; drop them or --no-tune"),
    ("mlp", ["--no-tune", "--tune-seconds", "5"], "--tune-seconds would do nothing; drop it or --no-tune"),
    ("mlp", ["--rows", "0"], "argument --rows: '0': expected a positive number of rows, e.g. --rows 512"),
    ("mlp", ["--channels", "-8"], "argument --channels: '-8'"),
    ("mlp", ["--layers", "0"], "argument --layers: '0'"),
    ("bert", ["--runs", "0"], "argument --runs: '0': expected a positive number of runs, e.g. --runs 7"),
    ("bert", ["--corpus", "0"], "argument --corpus: '0': expected a positive number of sentences, e.g. --corpus 256"),
    ("bert", ["--profile", "--corpus", "8"], "argument --corpus: not allowed with argument --profile"),
    ("bert", ["--shapes", "1x1000"], "argument --shapes: '1x1000': expected batch x tokens pairs of positive "
                                     "sizes, size 2 at most 512"),
    ("bert", ["--shapes", "1x32x8"], "argument --shapes: '1x32x8'"),
    ("bert", ["--clock", "cpu"], "--clock cpu measures the calling thread only: use it with --threads 1"),
    ("llm", ["--runs", "0"], "argument --runs: '0'"),
    ("llm", ["--dtypes", "f32"], "argument --dtypes: 'f32': expected dtypes out of bf16, i8"),
    ("llm", ["--prompt", "0"], "argument --prompt: '0': expected a positive number of prompt tokens"),
    ("llm", ["--small", "--prompt", "128"], "--prompt 128: the next token goes at position prompt"),
    ("conv", ["--batch", "0"], "argument --batch: '0': expected positive numbers of batch sizes, comma separated"),
    ("conv", ["--layers", "conv1,res9"], "argument --layers: 'conv1,res9': expected layer names out of conv1, "),
    ("conv", ["--clock", "cpu", "--threads", "2"], "use it with --threads 1"),
    ("spmm", ["--sparsities", "0.5,1.5"], "argument --sparsities: '0.5,1.5': expected sparsities from 0 to 1"),
    ("spmm", ["--size", "100"], "argument --size: 100 is not a multiple of 64"),
    ("spmm", ["--blocks", "6"], "argument --blocks: block size 6 does not divide --size 1024"),
    ("spmm", ["--size", "192", "--blocks", "3"], "argument --blocks: block size 3 is odd"),
    ("pool", ["--regions", "-1"], "argument --regions: '-1': expected a positive number of regions"),
    ("pool", ["--runs", "0"], "argument --runs: '0'"),
    ("cache", ["--repeat", "0"], "argument --repeat: '0'"),
    ("amx_micro", ["--rounds", "0"], "expected a positive number of rounds"),
    ("x86_static", ["--m", "0"], "argument --m: '0': expected a positive number of rows m, e.g. --m 64"),
    ("sve_static", ["--n", "-1"], "argument --n: '-1'"),
    ("tpp_gemm", ["--shapes", "bf16:64"], "argument --shapes: 'bf16:64': expected dtype:size:count triples"),
    ("tpp_gemm", ["--shapes", "f16:64:16"], "argument --shapes: 'f16:64:16'"),
    ("tpp_eltwise", ["--shapes", "i8:0:16"], "argument --shapes: 'i8:0:16'"),
    ("tpp_eltwise", ["--quik"], "unrecognized arguments: --quik"),
    ("ddp_mlp", ["--lr", "0"], "argument --lr: '0': expected a positive learning rate, e.g. --lr 0.003"),
    ("ddp_mlp", ["--ranks", "100000"], "argument --ranks: '100000': expected a number of ranks from 1 to"),
    ("ddp_mlp", ["--seed", "-1"], "argument --seed: '-1'"),
    ("tune_score", ["--threads", "0"], "argument --threads: '0'"),
    ("tune_score", ["--seconds", "0"], "argument --seconds: '0': expected a number of seconds, above 0"),
])
def test_a_bad_option_is_refused_before_any_work(capsys, module, argv, words):
    err = refused(capsys, importlib.import_module(f"bench.{module}").parse, argv)
    assert words in err and "Traceback" not in err


@pytest.mark.parametrize("module", sorted({m for names in bench_main.SUITES.values() for m in names}))
def test_every_suite_parses_its_defaults_and_checks_its_json_file(capsys, tmp_path, module):
    """Every suite module has ``parse``; its defaults pass its own checks, a --json it could not write does not."""
    parse = importlib.import_module(module).parse
    assert parse([]).json is None
    err = refused(capsys, parse, ["--json", str(tmp_path / "missing" / "x.json")])
    assert "argument --json:" in err and "does not exist (create it first), e.g. --json run.json" in err


def test_defaults_and_good_values_parse_as_before():
    from bench import conv, gemm, linear, spmm
    args = gemm.parse([])
    assert (args.sizes, args.threads, args.dtypes) == (None, [1, 2], ["f32", "bf16"])
    assert gemm.parse(["--sizes", "512,64x32x16", "--tune-seconds", "0"]).sizes == [(512,) * 3, (64, 32, 16)]
    assert gemm.parse([]).tune_clock == "wall" and gemm.parse(["--tune-clock", "cpu"]).tune_clock == "cpu"
    assert linear.parse([]).threads == 0 and linear.parse(["--threads", "1"]).threads == 1
    assert conv.parse(["--batch", "2", "--layers", "conv1"]).layers == ["conv1"]
    assert spmm.parse(["--size", "128", "--blocks", "4,8", "--dtypes", "f32"]).blocks == [4, 8]


def test_an_output_file_must_be_a_file(capsys, tmp_path):
    from bench import amx_micro, tune_score, x86_static
    assert "expected the name of a file to write, not a directory" in refused(capsys, x86_static.parse,
                                                                              ["--json", str(tmp_path)])
    assert "argument --figures:" in refused(capsys, amx_micro.parse, ["--figures", str(tmp_path / "a" / "f.json")])
    assert "argument --exhaustive:" in refused(capsys, tune_score.parse, ["--exhaustive", str(tmp_path) + "/"])
    assert tune_score.parse(["--lock", ""]).lock == ""


@pytest.fixture
def no_suite(monkeypatch):
    """bench.__main__.run recording its calls instead of running a suite."""
    calls = []
    monkeypatch.setattr(bench_main, "run", lambda *a: calls.append(a))
    return calls


@pytest.mark.parametrize("argv, words", [
    (["--json", "{tmp}/missing/run.json"], "argument --json: '{tmp}/missing/run.json': directory"),
    (["--json={tmp}/missing/run.json"], "argument --json:"),
    (["--plot", "{tmp}/run.txt"], "argument --plot: '{tmp}/run.txt': expected a name ending in a format "
                                  "matplotlib writes (.png, .svg, .pdf, ...), e.g. --plot run.png"),
    (["--plot", "{tmp}/missing/run.png"], "does not exist"),
    (["--quick", "--json"], "argument --json: expected one argument"),
])
def test_bench_refuses_a_bad_json_or_plot_before_the_suite_runs(capsys, tmp_path, no_suite, argv, words):
    argv = [a.format(tmp=tmp_path) for a in argv]
    err = refused(capsys, bench_main.main, ["gemm"] + argv)
    assert words.format(tmp=tmp_path) in err and "usage: python -m bench gemm" in err
    assert no_suite == []


def test_bench_passes_good_files_and_the_rest_to_the_suite(tmp_path, no_suite):
    pytest.importorskip("matplotlib")
    out, png = str(tmp_path / "run.json"), str(tmp_path / "run.png")
    assert bench_main.main(["gemm", "--quick", f"--json={out}", "--threads", "1", "--plot", png]) == 0
    assert no_suite == [(["bench.gemm"], ["--quick", "--threads", "1"], out, png)]


def test_bench_help_is_not_an_error_and_all_takes_no_suite_options(capsys, no_suite):
    for argv in (["--help"], ["-h"], ["all", "--help"]):
        assert bench_main.main(argv) == 0
        assert "suites are isa, tpp, gemm" in capsys.readouterr().out
    assert bench_main.main([]) == 2
    err = refused(capsys, bench_main.main, ["all", "--threads", "1"])
    assert "'all' runs every suite with its defaults" in err and "python -m bench gemm --threads 1" in err
    assert no_suite == []


def test_bench_says_when_its_records_cannot_be_written(capsys, tmp_path, monkeypatch):
    """The file was checked writable before the run; a failing write at the end (a full disk, a
    device) is a message naming it, not a traceback."""
    def fail(*a, **k):
        raise OSError(28, "No space left on device", str(tmp_path / "run.json"))
    suite = types.SimpleNamespace(main=lambda argv: 0)                  # a suite module that records nothing
    monkeypatch.setattr(bench_main, "importlib", types.SimpleNamespace(import_module=lambda name: suite))
    monkeypatch.setattr(bench_main, "open", fail, raising=False)
    with pytest.raises(SystemExit, match=r"cannot write .*run.json: No space left on device"):
        bench_main.run(["bench.isa"], [], str(tmp_path / "run.json"))


HUGE = "99999999999999999999"


@pytest.mark.parametrize("module, argv, words", [
    ("gemm", ["--sizes", HUGE], f"argument --sizes: '{HUGE}': expected sizes N or MxNxK (positive), comma "
                                f"separated, each once; {HUGE} is over the limit of 65536, e.g. --sizes 512"),
    ("gemm", ["--sizes", "64x65537x8"], "65537 is over the limit of 65536"),
    ("mlp", ["--rows", HUGE], f"argument --rows: '{HUGE}': expected a positive number of rows; {HUGE} is over "
                              "the limit of 1048576, e.g. --rows 512"),
    ("mlp", ["--channels", "65537"], "argument --channels: '65537'"),
    ("conv", ["--batch", f"1,{HUGE}"], "is over the limit of 1024, e.g. --batch 1,8"),
    ("x86_static", ["--k", "4294967296"], "argument --k: '4294967296': expected a positive number of inner k; "
                                          "4294967296 is over the limit of 65536, e.g. --k 64"),
    ("sve_static", ["--m", HUGE], "argument --m:"),
    ("spmm", ["--size", str(1 << 40)], "is over the limit of 65536"),
    ("ddp_mlp", ["--batch", HUGE], "argument --batch:"),
    ("ddp_mlp", ["--width", HUGE], "argument --width:"),
    ("ddp_mlp", ["--seed", str(2 ** 70)], "is over the limit of 4294967295, e.g. --seed 0"),
    ("linear", ["--shapes", "8x99999999x8"], "argument --shapes: '8x99999999x8'"),
    ("tpp_gemm", ["--shapes", "f32:999999:1"], "999999 is over the limit of 65536"),
])
def test_absurd_sizes_are_refused_before_any_work(capsys, module, argv, words):
    err = refused(capsys, importlib.import_module(f"bench.{module}").parse, argv)
    assert words in err and "Traceback" not in err


def test_sizes_up_to_the_limits_parse():
    from bench import ddp_mlp, gemm, x86_static
    assert gemm.parse(["--sizes", "65536x1x1"]).sizes == [(65536, 1, 1)]
    assert x86_static.parse(["--k", "65536"]).k == 65536
    assert ddp_mlp.parse(["--seed", str((1 << 32) - 1)]).seed == (1 << 32) - 1
