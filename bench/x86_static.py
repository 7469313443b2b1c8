"""Static instruction mix of the x86 BRGEMM microkernels (``python -m bench x86-static``).

AVX-512 kernels cannot be timed on an AVX2 host, so this reports, per k group of the innermost
k loop of a full register tile of each generated kernel, the multiply-accumulate
instructions (``vfmadd231ps``, ``vdpbf16ps``, ``vpdpbusd``, ``vpmaddwd``), the vector loads of B,
the broadcasts of A, the other vector and scalar instructions, the MACs per load and the
accumulator registers, for AVX-512 (with BF16 and VNNI) and for AVX2 (bf16 by conversion, int8
by ``vpmaddwd``). Nothing is executed.

>>> row = next(r for r in analyse(64, 64, 64) if r["isa"] == "avx512" and r["dtype"] == "f32")
>>> row["accumulators"] >= 24, row["macs_per_load"] >= 2
(True, True)
"""
from __future__ import annotations

import argparse
import json
from collections import Counter

import iced_x86 as ix

from bench.options import json_option, side_options, summary
from tppasm.brgemm import Brgemm
from tppasm.x86.brgemm import Gen

CASES = [("avx512", "f32", ()), ("avx512", "bf16", ("avx512_bf16",)), ("avx512", "i8", ("avx512_vnni",)),
         ("avx2", "f32", ()), ("avx2", "bf16", ()), ("avx2", "i8", ())]
MAC = {"VFMADD231PS", "VDPBF16PS", "VPDPBUSD", "VPMADDWD"}
BROADCAST = {"VBROADCASTSS", "VPBROADCASTD"}
NOT_LOADS = {"PREFETCHT0", "PREFETCHT1", "PREFETCHT2", "LEA"}


def _k_loop(code: bytes) -> list:
    """The loop (a backward branch's range) with the most multiply-accumulates per instruction:
    the k loop of a full tile, not a tail tile's nor a setup loop."""
    ins = list(ix.Decoder(64, code, ip=0))
    best = None
    for br in ins:
        if br.is_jcc_short_or_near and br.near_branch_target < br.ip:
            body = [i for i in ins if br.near_branch_target <= i.ip < br.ip]
            macs = sum(_name(i) in MAC for i in body)
            key = (macs / len(body), macs)
            if best is None or key > best[0]:
                best = (key, body)
    return best[1]


def _name(i) -> str:
    return ix.Formatter(ix.FormatterSyntax.INTEL).format_mnemonic(i).upper()


def mix(isa: str, dtype: str, features, m: int, n: int, k: int) -> dict:
    """Counts per k group of the innermost loop of the (m, n, k) kernel for ``isa``/``features``."""
    desc = Brgemm(m=m, n=n, k=k, dtype=dtype)
    gen = Gen(desc, isa, frozenset(features))
    code = gen.build().code
    body = _k_loop(code)
    names = [_name(i) for i in body]
    count = Counter(names)
    mac = sum(count[x] for x in MAC)
    loads = [i for i, x in zip(body, names) if x not in NOT_LOADS and x not in MAC and x not in BROADCAST
             and any(i.op_kind(j) == ix.OpKind.MEMORY for j in range(i.op_count)) and i.op_kind(0) != ix.OpKind.MEMORY]
    bcasts = sum(count[x] for x in BROADCAST) + sum(1 for i in body if i.is_broadcast)
    accs = {i.op0_register for i, x in zip(body, names) if x in ("VFMADD231PS", "VDPBF16PS", "VPDPBUSD")}
    if not accs:                                   # AVX2 int8: vpmaddwd into a temporary, vpaddd into the accumulator
        accs = {i.op0_register for i, x in zip(body, names) if x == "VPADDD"}
    groups = max(mac // (max(len(accs), 1) * gen.dot.chain), 1)   # chain: MAC instructions per accumulator per group
    other = len(body) - mac - len(loads) - bcasts
    return {"isa": isa, "dtype": dtype, "features": "+".join(features) or "-", "tile": f"{len(accs) // gen.plan.vecs}x{gen.plan.vecs}vec",
            "accumulators": len(accs), "mac": mac / groups, "loads": len(loads) / groups, "broadcasts": bcasts / groups,
            "other": other / groups, "macs_per_load": mac / max(len(loads) + bcasts, 1)}


def analyse(m: int = 64, n: int = 64, k: int = 64) -> list[dict]:
    """One record per (isa, dtype) of :data:`CASES`."""
    return [mix(isa, dtype, feats, m, n, k) for isa, dtype, feats in CASES]


def format_table(rows: list[dict], m: int, n: int, k: int) -> str:
    head = (f"{'isa':<8}{'dtype':<6}{'features':<13}{'tile':<9}{'acc':>4}{'mac':>7}{'loadB':>7}{'bcastA':>7}"
            f"{'other':>7}{'mac/ld':>8}")
    lines = [f"x86 BRGEMM static mix per k group (innermost loop), m=n=k={m},{n},{k}", head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['isa']:<8}{r['dtype']:<6}{r['features']:<13}{r['tile']:<9}{r['accumulators']:>4}"
                     f"{r['mac']:>7.2f}{r['loads']:>7.2f}{r['broadcasts']:>7.2f}{r['other']:>7.2f}{r['macs_per_load']:>8.2f}")
    return "\n".join(lines)


def parse(argv=None):
    """The options of ``python -m bench x86-static``, checked (a bad one: argparse's error); no work done."""
    ap = argparse.ArgumentParser(allow_abbrev=False,
                                 prog="python -m bench x86-static", description=summary(__doc__))
    side_options(ap, "mnk")
    json_option(ap)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Print the table; ``--json FILE`` also writes the records.

    >>> main(["--m", "32", "--n", "32", "--k", "32"])  # doctest: +ELLIPSIS
    x86 BRGEMM static mix ...
    0
    """
    args = parse(argv)
    rows = analyse(args.m, args.n, args.k)
    print(format_table(rows, args.m, args.n, args.k))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"bench": "x86-static", "m": args.m, "n": args.n, "k": args.k, **r} for r in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
