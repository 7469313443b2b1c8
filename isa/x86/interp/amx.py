"""AMX semantics (palette 1: 8 tiles of up to 16 rows x 64 bytes) after the SDM pseudo-code.

- ``sttilecfg`` writes the loaded config back (64 zero bytes when tiles are not configured).
- ``ldtilecfg`` reads the 64-byte config (palette u8, start_row u8, 14 reserved zero bytes,
  colsb u16[16], rows u8[16]) and raises InvalidOpcode (the #GP) on palette > 1, a nonzero
  reserved byte, rows > 16, colsb > 64, an entry 8..15 that is not zero, or a tile with exactly
  one of rows/colsb zero; palette 0 releases the tiles. Tiles are zeroed.
- Tile instructions raise InvalidOpcode (the #UD) when tiles are not configured, a tile is not
  valid (rows = 0), dot-product tiles are not distinct, colsb is not a multiple of 4, or the
  shapes disagree: dst.rows == a.rows, a.colsb / 4 == b.rows, dst.colsb == b.colsb.
- ``tileloadd t, [base + index*scale + disp]``: row r (start_row <= r < rows) is colsb bytes at
  base + disp + r * (index * scale); bytes past colsb and rows past rows become zero.
- ``tdpbf16ps``: per row m, two fp32 partial sums (even and odd bf16 of each pair) start at 0
  and take, for k in order, one fused multiply-add each with DAZ/FTZ/RNE; then
  dst = dst + (even + odd), both additions DAZ/FTZ/RNE.
- ``tdpb[su][su]d``: dst.d[m][n] += sum over k of the 4 byte products (signedness per letter:
  first for the A tile, second for B), int32 wraparound.
"""

from __future__ import annotations

import numpy as np
from iced_x86 import Mnemonic as Mn
from iced_x86 import Register, RegisterExt

from .base import M64, InvalidOpcode, MemoryFault, gpr_index, refuse, with_ref
from .fp import daz, f32, fma32, from_bf16, ftz

_MAX_ROWS, _MAX_COLSB = 16, 64


def _ud(ins, why):
    raise InvalidOpcode(f"#UD: {why}")


def _tile(ins, i):
    reg = ins.op_register(i)
    if not RegisterExt.is_tmm(reg):
        refuse(ins, "expected a tile register")
    return RegisterExt.number(reg)


def _shape(m, ins, t):
    if m.tilecfg is None:
        _ud(ins, "tiles not configured")
    rows, colsb = m.tilecfg[0][t], m.tilecfg[1][t]
    if rows == 0:
        _ud(ins, f"tmm{t} is not configured (rows = 0)")
    return rows, colsb


def _sib(m, ins):
    """(base address closure, stride closure) of a sibmem operand."""
    if ins.memory_segment in (Register.FS, Register.GS) or ins.memory_base == Register.RIP:
        refuse(ins, "sibmem form")
    g, disp = m.g, ins.memory_displacement & M64
    b = None if ins.memory_base == Register.NONE else gpr_index(ins.memory_base)
    x = None if ins.memory_index == Register.NONE else gpr_index(ins.memory_index)
    scale = ins.memory_index_scale
    base = (lambda: disp) if b is None else (lambda: (g[b] + disp) & M64)
    stride = (lambda: 0) if x is None else (lambda: (g[x] * scale) & M64)
    return base, stride


def _ldtilecfg(m, ins):
    from .base import addr_fn
    a, nxt = addr_fn(m, ins), ins.next_ip

    def step():
        raw = bytes(m.rdv(a(), 64))
        palette, start = raw[0], raw[1]
        colsb = [int.from_bytes(raw[16 + 2 * i:18 + 2 * i], "little") for i in range(16)]
        rows = list(raw[48:64])
        if palette == 0:
            m.tilecfg, m.tile_start_row = None, 0
            m.tiles[:] = 0
            return nxt
        bad = (palette > 1 or any(raw[2:16]) or any(colsb[8:]) or any(rows[8:])
               or any(r > _MAX_ROWS or c > _MAX_COLSB or (r == 0) != (c == 0)
                      for r, c in zip(rows[:8], colsb[:8])))
        if bad:
            raise InvalidOpcode(f"#GP: invalid tile configuration {raw.hex()}")
        m.tilecfg = (rows[:8], colsb[:8])
        m.tile_start_row = start
        m.tiles[:] = 0
        m.stats.tile_ops.append(("ldtilecfg", (), (), 0, 0, 0, 0))
        return nxt
    return step


def _sttilecfg(m, ins):
    from .base import addr_fn
    a, nxt = addr_fn(m, ins), ins.next_ip

    def step():
        raw = bytearray(64)
        if m.tilecfg is not None:
            rows, colsb = m.tilecfg
            raw[0], raw[1] = 1, m.tile_start_row
            for i in range(8):
                raw[16 + 2 * i:18 + 2 * i] = colsb[i].to_bytes(2, "little")
                raw[48 + i] = rows[i]
        m.wrv(a(), np.frombuffer(bytes(raw), np.uint8))
        m.stats.tile_ops.append(("sttilecfg", (), (), 0, 0, 0, 0))
        return nxt
    return step


def _tilerelease(m, ins):
    nxt = ins.next_ip

    def step():
        m.tilecfg, m.tile_start_row = None, 0
        m.tiles[:] = 0
        m.stats.tile_ops.append(("tilerelease", (), (), 0, 0, 0, 0))
        return nxt
    return step


def _tilezero(m, ins):
    t, nxt = _tile(ins, 0), ins.next_ip

    def step():
        _shape(m, ins, t)
        m.tiles[t] = 0
        m.tile_start_row = 0                # the SDM's zero_tilecfg_start()
        m.stats.tile_ops.append(("tilezero", (t,), (), 0, 0, 0, 0))
        return nxt
    return step


def _tileload(m, ins):
    t, (base, stride) = _tile(ins, 0), _sib(m, ins)
    ip, name, nxt = ins.ip, "tileloadd" if ins.mnemonic == Mn.TILELOADD else "tileloaddt1", ins.next_ip

    def step():
        rows, colsb = _shape(m, ins, t)
        a0, s = base(), stride()
        m.stats.tile_loads.append((ip, name, a0))
        m.stats.tile_ops.append((name, (t,), (), a0, s, colsb, rows))
        tile = m.tiles[t]
        for r in range(m.tile_start_row, rows):
            try:
                tile[r, :colsb] = m.rdv((a0 + r * s) & M64, colsb)
            except MemoryFault:
                m.tile_start_row = r  # restartable, as on hardware
                raise
            tile[r, colsb:] = 0
        tile[rows:] = 0
        m.tile_start_row = 0
        return nxt
    return step


def _tilestore(m, ins):
    t, (base, stride), nxt = _tile(ins, 1), _sib(m, ins), ins.next_ip

    def step():
        rows, colsb = _shape(m, ins, t)
        a0, s = base(), stride()
        m.stats.tile_ops.append(("tilestored", (), (t,), a0, s, colsb, rows))
        tile = m.tiles[t]
        for r in range(m.tile_start_row, rows):
            m.wrv((a0 + r * s) & M64, tile[r, :colsb])
        m.tile_start_row = 0
        return nxt
    return step


def _dot_shapes(m, ins):
    d, a, b = _tile(ins, 0), _tile(ins, 1), _tile(ins, 2)
    if len({d, a, b}) != 3:
        _ud(ins, "tile operands must be distinct")
    (dr, dc), (ar, ac), (br, bc) = _shape(m, ins, d), _shape(m, ins, a), _shape(m, ins, b)
    m.stats.tile_ops.append(("tdp", (d,), (d, a, b), 0, 0, dc, dr))
    if dc % 4 or ac % 4 or bc % 4:
        _ud(ins, "colsb not a multiple of 4")
    if dr != ar or ac // 4 != br or dc != bc:
        _ud(ins, f"shape mismatch: dst {dr}x{dc}B, a {ar}x{ac}B, b {br}x{bc}B")
    m.tile_start_row = 0                    # (every tdp* ends with the SDM's zero_tilecfg_start())
    return d, a, b, dr, ac // 4, dc // 4


def _bf16_dot(m, ins):
    nxt = ins.next_ip

    def step():
        d, a, b, M, K, N = _dot_shapes(m, ins)
        T = m.tiles
        A = from_bf16(T[a, :M, :4 * K].view(np.uint16).reshape(M, K, 2))
        B = from_bf16(T[b, :K, :4 * N].view(np.uint16).reshape(K, N, 2))
        acc = np.zeros((M, N, 2), f32)
        for k in range(K):
            acc = fma32(A[:, k, None, :], B[None, k, :, :], acc, daz_ftz=True)
        C = T[d, :M, :4 * N].view(f32)
        with np.errstate(all="ignore"):
            pair = ftz(daz(acc[..., 0]) + daz(acc[..., 1]))
            out = ftz(daz(C) + pair)
        T[d, :M, :4 * N] = out.view(np.uint8).reshape(M, 4 * N)
        T[d, :M, 4 * N:] = 0
        T[d, M:] = 0
        return nxt
    return step


def _int_dot(sa: bool, sb: bool):
    ta, tb = (np.int8 if sa else np.uint8), (np.int8 if sb else np.uint8)

    def build(m, ins):
        nxt = ins.next_ip

        def step():
            d, a, b, M, K, N = _dot_shapes(m, ins)
            T = m.tiles
            A = T[a, :M, :4 * K].view(ta).reshape(M, K, 4).astype(np.int64)
            B = T[b, :K, :4 * N].view(tb).reshape(K, N, 4).astype(np.int64)
            C = T[d, :M, :4 * N].view(np.int32).astype(np.int64)
            out = (C + np.einsum("mkq,knq->mn", A, B)).astype(np.int32)
            T[d, :M, :4 * N] = out.view(np.uint8).reshape(M, 4 * N)
            T[d, :M, 4 * N:] = 0
            T[d, M:] = 0
            return nxt
        return step
    return build


AMX = {
    Mn.LDTILECFG: with_ref(_ldtilecfg, "load palette/rows/colsb from m512 (validated: #GP), zero tiles"),
    Mn.STTILECFG: with_ref(_sttilecfg, "m512 = the loaded config (palette 1), all zeros when tiles are not configured"),
    Mn.TILERELEASE: with_ref(_tilerelease, "unconfigure and zero all tiles"),
    Mn.TILEZERO: with_ref(_tilezero, "tile = 0"),
    Mn.TILELOADD: with_ref(_tileload, "tile.row[r] = mem[base + disp + r*index*scale : +colsb]"),
    Mn.TILELOADDT1: with_ref(_tileload, "as tileloadd (the T1 hint is not modelled)"),
    Mn.TILESTORED: with_ref(_tilestore, "mem[base + disp + r*index*scale : +colsb] = tile.row[r]"),
    Mn.TDPBF16PS: with_ref(_bf16_dot, "C[m,n] += sum_k A[m,2k:2k+2] . B[k,2n:2n+2] (SDM order, DAZ/FTZ/RNE)"),
    Mn.TDPBSSD: with_ref(_int_dot(True, True), "C.d += sum4(s8 A * s8 B) (wraps)"),
    Mn.TDPBSUD: with_ref(_int_dot(True, False), "C.d += sum4(s8 A * u8 B) (wraps)"),
    Mn.TDPBUSD: with_ref(_int_dot(False, True), "C.d += sum4(u8 A * s8 B) (wraps)"),
    Mn.TDPBUUD: with_ref(_int_dot(False, False), "C.d += sum4(u8 A * u8 B) (wraps)"),
}
