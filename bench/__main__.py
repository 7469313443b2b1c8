"""``python -m bench SUITE [--json FILE] [...]``: suites are isa, tpp, gemm, pool, cache, sve-static,
amx-static, x86-static, bert, llm, conv, spmm, ddp, all."""
import importlib
import sys

SUITES = {
    "isa": ["bench.isa"],
    "tpp": ["bench.tpp_gemm", "bench.tpp_eltwise"],
    "gemm": ["bench.gemm"],
    "pool": ["bench.pool"],
    "cache": ["bench.cache"],
    "sve-static": ["bench.sve_static"],
    "amx-static": ["bench.amx_static"],
    "x86-static": ["bench.x86_static"],
    "bert": ["bench.bert"],
    "llm": ["bench.llm"],
    "conv": ["bench.conv"],
    "spmm": ["bench.spmm"],
    "ddp": ["bench.ddp_mlp"],
}


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in (*SUITES, "all"):
        print(__doc__)
        return 2
    suite, rest = argv[0], argv[1:]
    names = [m for s in SUITES.values() for m in s] if suite == "all" else SUITES[suite]
    json_path = None
    if "--json" in rest:
        i = rest.index("--json")
        json_path = rest[i + 1]
    for n, name in enumerate(names):
        mod = importlib.import_module(name)
        extra = list(rest)
        if json_path and len(names) > 1:
            extra[extra.index("--json") + 1] = json_path.replace(".json", "") + f".{name.split('.')[-1]}.json"
        mod.main(extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
