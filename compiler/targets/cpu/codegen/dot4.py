"""The 4-wide u8 x s8 dot product (compiler.tensor.ops.int8_matmul's `dot4`) as the CPU's integer dot instructions.

A vectorized store `acc[i] = acc[i] + sum_{j<4} int32(a[p + j]) * int32(w[q + j])` — `a` u8 and the same for every
lane (one row's 4 activations), `w` s8 stepping by 4 bytes per lane (the packed weight: 4 k per column), `acc`
int32 stepping by one — is one `vpdpbusd` per 16 lanes (AVX-512 VNNI) or per 8 (AVX-VNNI / AVX512-VL): each int32
lane adds the 4 products of its 4 bytes of `w` with the 4 broadcast bytes of `a`, exactly.

Without VNNI, `vpmaddubsw` multiplies u8 by s8 and adds adjacent pairs into int16 *saturating*: 2 * 255 * -128 =
-65280 does not fit. onnxruntime avoids that by quantizing weights to 7 bits (`reduce_range`), which changes the
model's numbers; here the weight byte is split instead, w = 64 * h + l with l = w & 63 in [0, 63] and h = w >> 6 in
[-2, 1], so both pair sums fit (2 * 255 * 63 = 32130) and the result is exact for any s8 weight:
    vpmaddwd(vpmaddubsw(a, l), 1) + vpmaddwd(vpmaddubsw(a, h), 64)
twice the instructions of the 7-bit form; `h` and `l` are computed once per weight vector and shared by the rows
of a register block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from compiler.schedule.loopir import Store
from compiler.schedule.simplify import linear
from compiler.tensor.te import Binary, Cast, Expr, Load

DOT = 4


@dataclass(frozen=True)
class Dot4:
    """A matched store: its accumulator load and the 4 (activation, weight) loads, in k order."""

    acc: Load
    a: Load  # the activation byte of k = 0: the 4 bytes from it are loaded as one int32
    w: Load  # the weight byte of k = 0, lane 0: 4 * lanes bytes from it


@dataclass(frozen=True)
class Dot4ISA:
    """Which dot-product instructions the target has, from its LLVM feature string."""

    vnni512: bool  # vpdpbusd zmm (AVX512-VNNI)
    vnni256: bool  # vpdpbusd ymm (AVX-VNNI, or AVX512-VNNI with VL)
    bw512: bool  # vpmaddubsw / vpmaddwd zmm (AVX512-BW)
    avx2: bool  # vpmaddubsw / vpmaddwd ymm

    @staticmethod
    def of(features: str) -> Dot4ISA:
        on = {f[1:] for f in features.split(",") if f.startswith("+")}

        def has(name: str) -> bool:  # an AVX-512 extension is off with avx512f (TILEFARM_CPU_FEATURES=-avx512f)
            return name in on and (not name.startswith("avx512") or "avx512f" in on)

        return Dot4ISA(
            vnni512=has("avx512vnni"),
            vnni256=has("avxvnni") or (has("avx512vnni") and has("avx512vl")),
            bw512=has("avx512bw"),
            avx2=has("avx2"),
        )

    def chunk(self, width: int) -> tuple[int, bool] | None:
        """(lanes per instruction, VNNI or not) for a vectorized loop of `width` int32 lanes, or None: no form."""
        for lanes, vnni, ok in ((16, True, self.vnni512), (8, True, self.vnni256), (16, False, self.bw512),
                                (8, False, self.avx2)):  # fmt: skip
            if ok and width % lanes == 0:
                return lanes, vnni
        return None


def _terms(e: Expr) -> list[Expr]:
    if isinstance(e, Binary) and e.op == "add" and e.dtype == "int32":
        return _terms(e.a) + _terms(e.b)
    return [e]


def _byte_load(e: Expr, dtype: str) -> Load | None:
    if isinstance(e, Cast) and e.dtype == "int32" and isinstance(e.a, Load) and e.a.dtype == dtype:
        return e.a
    return None


def _offsets(loads: list[Load]) -> list[int] | None:
    """Each load's index minus the lowest one's, when they differ by constants only."""
    terms0, c0 = linear(loads[0].indices[0])
    out = []
    for ld in loads:
        terms, c = linear(ld.indices[0])
        if terms != terms0:
            return None
        out.append(c - c0)
    return [c - min(out) for c in out]


def match(s: Store, lane: str, coeff: Callable[[Expr, str], int | None]) -> Dot4 | None:
    """The dot product `s` stores, if it is one (see the module docstring), for the vectorized loop `lane`."""
    if coeff(s.index, lane) != 1:
        return None
    acc: Load | None = None
    pairs: list[tuple[Load, Load]] = []
    for t in _terms(s.value):
        if isinstance(t, Load) and t.buffer == s.buffer and t.indices[0] == s.index and acc is None:
            acc = t
            continue
        if not (isinstance(t, Binary) and t.op == "mul"):
            return None
        a, w = _byte_load(t.a, "uint8"), _byte_load(t.b, "int8")
        if a is None or w is None:
            a, w = _byte_load(t.b, "uint8"), _byte_load(t.a, "int8")
        if a is None or w is None or coeff(a.indices[0], lane) != 0 or coeff(w.indices[0], lane) != DOT:
            return None
        pairs.append((a, w))
    if acc is None or len(pairs) != DOT:
        return None
    a_off, w_off = _offsets([a for a, _ in pairs]), _offsets([w for _, w in pairs])
    if a_off is None or w_off is None or sorted(a_off) != list(range(DOT)):
        return None
    order = sorted(range(DOT), key=lambda j: a_off[j])
    if [w_off[j] - w_off[order[0]] for j in order] != list(range(DOT)):
        return None  # activation byte j must meet weight byte j
    first = order[0]
    return Dot4(acc, pairs[first][0], pairs[first][1])
