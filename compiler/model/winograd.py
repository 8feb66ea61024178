"""Winograd F(m x m, 3 x 3) transform matrices (Lavin & Gray's construction over the points 0, +-1, +-2, +-1/2), and a
conv weight transformed by them at compile time (the winograd_convs pass); the op's compute is tensor.ops.winograd."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from compiler.base.errors import InvalidExpr

KERNEL = 3
_POINTS = (Fraction(0), Fraction(1), Fraction(-1), Fraction(2), Fraction(-2), Fraction(1, 2), Fraction(-1, 2))


def _poly(roots: list[Fraction]) -> list[Fraction]:
    """Coefficients, lowest power first, of prod (x - r)."""
    coef = [Fraction(1)]
    for r in roots:
        coef = [(coef[d - 1] if d else 0) - r * (coef[d] if d < len(coef) else 0) for d in range(len(coef) + 1)]
    return coef


def winograd_matrices(m: int, r: int = KERNEL) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A^T (m x a), G (a x r) and B^T (a x a), a = m + r - 1, of F(m, r): y = A^T [(G g) . (B^T d)]."""
    a = m + r - 1
    if m < 1 or a - 1 > len(_POINTS):
        raise InvalidExpr(f"winograd: output tile {m} is not supported (1 to {len(_POINTS) - r + 2})")
    pts = list(_POINTS[: a - 1])
    at = [[p**j for p in pts] + [Fraction(int(j == m - 1))] for j in range(m)]
    g = []
    for i, p in enumerate(pts):
        denom = Fraction(1)
        for q in pts[:i] + pts[i + 1 :]:
            denom *= p - q
        g.append([p**j / denom for j in range(r)])
    g.append([Fraction(int(j == r - 1)) for j in range(r)])
    bt = [_poly(pts[:i] + pts[i + 1 :]) + [Fraction(0)] for i in range(len(pts))] + [_poly(pts)]
    as_array = lambda rows: np.array([[float(x) for x in row] for row in rows])  # noqa: E731
    return as_array(at), as_array(g), as_array(bt)


def winograd_weight(w: np.ndarray, m: int, block: int) -> np.ndarray:
    """An F x C x 3 x 3 conv weight transformed (U = G g G^T, in float64) and laid out a x a x F/block x C x block."""
    F, C, KH, KW = w.shape
    if (KH, KW) != (KERNEL, KERNEL) or F % block:
        raise InvalidExpr(f"winograd_weight: needs an F x C x 3 x 3 weight with F a multiple of {block}, got {w.shape}")
    _, g, _ = winograd_matrices(m)
    u = np.einsum("ar,fcrs,bs->abfc", g, w.astype(np.float64), g)
    a = m + KERNEL - 1
    u = u.reshape(a, a, F // block, block, C).transpose(0, 1, 2, 4, 3)
    return np.ascontiguousarray(u.astype(w.dtype))
