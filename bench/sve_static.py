"""Static instruction mix of the SVE BRGEMM microkernels (``python -m bench sve-static``).

SVE cannot be timed on this machine, so for each microkernel this reports, per k group of the main
unrolled k loop of a full register block: multiply-accumulate instructions (FMA/DOT/MMLA), vector
loads of B, broadcasts of A, permutes, scalar overhead, the MAC-to-load ratio, the multiply-adds per
instruction group at the chosen vector length, and the accumulator registers used.

>>> rows = analyse(64, 64, vl=256)
>>> [round(r["macs_per_load"], 2) for r in rows if r["dtype"] == "f32"]
[3.81, 2.4]
"""
from __future__ import annotations

import argparse
import json
from collections import Counter

from bench.options import json_option, side_options, summary
from tppasm.sve.microkernel import inner_loop

KERNELS = [("f32", "indexed"), ("f32", "dot"), ("bf16", "dot"), ("bf16", "mmla"), ("i8", "dot"), ("i8", "mmla"),
           ("u8i8", "dot"), ("u8i8", "mmla")]
MAC = {"fmla", "bfdot", "sdot", "udot", "usdot", "bfmmla", "smmla", "ummla", "usmmla"}
BROADCAST = {"ld1rw", "ld1rd", "ld1rqh", "ld1rqb", "ld1rqw", "ld1rh"}
LOAD = {"ld1w", "ld1h", "ld1b"}
PERMUTE = {"trn1", "trn2", "zip1", "zip2", "uzp1", "uzp2", "dup"}
# scalar multiply-adds done by one instruction per 128 bits of vector
MACS_PER_128 = {"fmla": 4, "bfdot": 8, "sdot": 16, "udot": 16, "usdot": 16, "bfmmla": 16,
                "smmla": 32, "ummla": 32, "usmmla": 32}


def analyse(m: int = 64, n: int = 64, vl: int = 256) -> list[dict]:
    """One record per microkernel: counts per k group and derived ratios."""
    rows = []
    for dtype, kernel in KERNELS:
        pl, mnemonics, groups = inner_loop(m, n, dtype, kernel, vl)
        c = Counter(mnemonics)
        mac = sum(c[i] for i in MAC)
        loads, bcasts = sum(c[i] for i in LOAD), sum(c[i] for i in BROADCAST)
        permutes = sum(c[i] for i in PERMUTE)
        overhead = sum(c.values()) - mac - loads - bcasts - permutes
        mac_op = next(i for i in MAC if c[i])
        acc = -(-pl.mr // 2) * 2 * pl.nv if kernel == "mmla" else pl.mr * pl.nv
        rows.append({
            "kernel": f"{dtype}/{kernel}", "dtype": dtype, "instruction": mac_op,
            "block": f"{pl.mr}x{pl.nv}vec", "accumulators": acc, "k_per_group": pl.group,
            "mac": mac / groups, "loads": loads / groups, "broadcasts": bcasts / groups,
            "permutes": permutes / groups, "overhead": overhead / groups,
            "macs_per_load": mac / (loads + bcasts),
            "scalar_macs_per_instr": mac * MACS_PER_128[mac_op] * (vl // 128) / sum(c.values()),
        })
    return rows


def format_table(rows: list[dict], vl: int) -> str:
    head = (f"{'kernel':<13}{'instr':<8}{'block':<9}{'acc':>4}{'k/grp':>6}{'mac':>7}{'loadB':>7}{'bcastA':>7}"
            f"{'perm':>6}{'ovh':>6}{'mac/ld':>8}{f'MAC/ins@{vl}':>12}")
    lines = [f"SVE BRGEMM static mix per k group (main loop, full block), VL {vl}", head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['kernel']:<13}{r['instruction']:<8}{r['block']:<9}{r['accumulators']:>4}{r['k_per_group']:>6}"
                     f"{r['mac']:>7.2f}{r['loads']:>7.2f}{r['broadcasts']:>7.2f}{r['permutes']:>6.2f}"
                     f"{r['overhead']:>6.2f}{r['macs_per_load']:>8.2f}{r['scalar_macs_per_instr']:>12.1f}")
    return "\n".join(lines)


def parse(argv=None):
    """The options of ``python -m bench sve-static``, checked (a bad one: argparse's error); no work done."""
    ap = argparse.ArgumentParser(allow_abbrev=False,
                                 prog="python -m bench sve-static", description=summary(__doc__))
    side_options(ap, "mn")
    ap.add_argument("--vl", type=int, default=256, choices=[128, 256, 512, 1024, 2048],
                    help="SVE vector length in bits, for the multiply-adds per instruction (default 256)")
    json_option(ap)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Print the table; ``--json FILE`` also writes the records.

    >>> main(["--m", "16", "--n", "16"])  # doctest: +ELLIPSIS
    SVE BRGEMM static mix ...
    0
    """
    args = parse(argv)
    rows = analyse(args.m, args.n, args.vl)
    print(format_table(rows, args.vl))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"bench": "sve-static", "vl": args.vl, "m": args.m, "n": args.n, **r} for r in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
