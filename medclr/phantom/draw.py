"""Small drawing primitives on float32 density layers (skimage.draw does the rasterising)."""

from __future__ import annotations

from math import comb

import numpy as np
from PIL import Image, ImageDraw
from skimage.draw import line_aa


def bezier(points, n: int = 24) -> np.ndarray:
    """(n, 2) samples (x, y) of the Bezier curve with control points ``points`` (k, 2), Bernstein form."""
    p = np.asarray(points, dtype=np.float64)
    t = np.linspace(0.0, 1.0, n)[:, None]
    k = len(p) - 1
    out = np.zeros((n, 2))
    for i in range(k + 1):
        out += comb(k, i) * (t ** i) * ((1 - t) ** (k - i)) * p[i]
    return out


def band(layer: np.ndarray, pts: np.ndarray, width, value: float = 1.0, mode: str = "max") -> None:
    """Rasterise a thick polyline (x, y points; width scalar or per point) into ``layer`` (PIL polygon fill)."""
    pts = np.asarray(pts, dtype=np.float64)
    if len(pts) < 2:
        return
    d = np.gradient(pts, axis=0)
    norm = np.hypot(d[:, 0], d[:, 1])[:, None] + 1e-9
    nrm = np.stack([-d[:, 1], d[:, 0]], axis=1) / norm
    w = (np.broadcast_to(np.asarray(width, dtype=np.float64), (len(pts),)) / 2.0)[:, None]
    poly = np.concatenate([pts + nrm * w, (pts - nrm * w)[::-1]])
    h, wd = layer.shape
    x0, y0 = max(0, int(np.floor(poly[:, 0].min()))), max(0, int(np.floor(poly[:, 1].min())))
    x1, y1 = min(wd, int(np.ceil(poly[:, 0].max())) + 1), min(h, int(np.ceil(poly[:, 1].max())) + 1)
    if x1 <= x0 or y1 <= y0:
        return
    img = Image.new("L", (x1 - x0, y1 - y0), 0)
    ImageDraw.Draw(img).polygon([(float(x - x0), float(y - y0)) for x, y in poly], fill=255)
    patch = np.asarray(img, dtype=np.float32) * (value / 255.0)
    win = layer[y0:y1, x0:x1]
    if mode == "max":
        np.maximum(win, patch, out=win)
    else:
        win += patch


def polyline(layer: np.ndarray, pts: np.ndarray, value: float = 1.0) -> None:
    """Anti-aliased 1-px polyline (max-composited)."""
    pts = np.round(np.asarray(pts)).astype(int)
    h, w = layer.shape
    for (x0, y0), (x1, y1) in zip(pts[:-1], pts[1:]):
        rr, cc, val = line_aa(int(y0), int(x0), int(y1), int(x1))
        ok = (rr >= 0) & (rr < h) & (cc >= 0) & (cc < w)
        rr, cc, val = rr[ok], cc[ok], val[ok]
        layer[rr, cc] = np.maximum(layer[rr, cc], value * val)


def ellipsoid(shape, cx, cy, ax, ay, theta: float = 0.0, box=None) -> tuple[np.ndarray, tuple[slice, slice]]:
    """Projected thickness sqrt(1 - r^2) of an ellipsoid, computed in its bounding window only.

    Returns (profile, (row slice, col slice)) so callers add it into a window of a layer.
    """
    h, w = shape
    r = max(ax, ay) + 2
    y0, y1 = max(0, int(cy - r)), min(h, int(cy + r) + 2)
    x0, x1 = max(0, int(cx - r)), min(w, int(cx + r) + 2)
    if y1 <= y0 or x1 <= x0:
        return np.zeros((0, 0), np.float32), (slice(0, 0), slice(0, 0))
    yy, xx = np.mgrid[y0:y1, x0:x1].astype(np.float32)
    dx, dy = xx - cx, yy - cy
    c, s = np.cos(theta), np.sin(theta)
    u = (c * dx + s * dy) / max(ax, 1e-3)
    v = (-s * dx + c * dy) / max(ay, 1e-3)
    prof = np.sqrt(np.clip(1.0 - u * u - v * v, 0.0, None)).astype(np.float32)
    return prof, (slice(y0, y1), slice(x0, x1))


def add_ellipsoid(layer: np.ndarray, cx, cy, ax, ay, value: float, theta: float = 0.0) -> np.ndarray:
    """Add an ellipsoid's projected thickness (times ``value``); returns its support mask (full size, bool)."""
    prof, win = ellipsoid(layer.shape, cx, cy, ax, ay, theta)
    layer[win] += value * prof
    mask = np.zeros(layer.shape, bool)
    mask[win] = prof > 0
    return mask


def blur(x: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian blur; wide kernels run on a block-averaged copy and are upsampled (smooth fields only)."""
    from scipy.ndimage import gaussian_filter

    x = np.asarray(x, dtype=np.float32)
    f = int(sigma / 1.5) if sigma >= 3 else 1
    if f < 2:
        return gaussian_filter(x, sigma, mode="nearest")
    h, w = x.shape
    hp, wp = -(-h // f) * f, -(-w // f) * f
    xp = np.pad(x, ((0, hp - h), (0, wp - w)), mode="edge")
    small = xp.reshape(hp // f, f, wp // f, f).mean(axis=(1, 3))
    small = gaussian_filter(small, np.sqrt(max(sigma * sigma - f * f / 12.0, 0.25)) / f, mode="nearest")
    big = Image.fromarray(small.astype(np.float32), mode="F").resize((wp, hp), Image.BILINEAR)
    return np.asarray(big, dtype=np.float32)[:h, :w]


_BANK: dict = {}


def texture(rng: np.random.Generator, shape, sigma: float) -> np.ndarray:
    """A smooth unit-std random field drawn from a small fixed bank (same in every process), randomly
    rolled and flipped by ``rng``: cheaper than fresh noise, and still a pure function of ``rng``."""
    key = (tuple(shape), round(float(sigma), 2))
    bank = _BANK.get(key)
    if bank is None:
        gen = np.random.default_rng(np.random.SeedSequence([20260, *key[0], int(key[1] * 100)]))
        bank = _BANK[key] = [smooth_noise(gen, shape, sigma) for _ in range(6)]
        if len(_BANK) > 64:
            _BANK.pop(next(iter(_BANK)))
    i, dy, dx, flip = (int(v) for v in rng.integers(0, [len(bank), shape[0], shape[1], 4]))
    out = np.roll(bank[i], (dy, dx), axis=(0, 1))
    if flip & 1:
        out = out[::-1]
    if flip & 2:
        out = out[:, ::-1]
    return out


def smooth_noise(rng: np.random.Generator, shape, sigma: float) -> np.ndarray:
    """Zero-mean, unit-std smooth random field with correlation length ~``sigma`` px (made at low resolution)."""
    from scipy.ndimage import gaussian_filter

    h, w = shape
    f = max(1.0, sigma / 1.5)
    sh, sw = int(np.ceil(h / f)) + 2, int(np.ceil(w / f)) + 2
    n = gaussian_filter(rng.standard_normal((sh, sw)).astype(np.float32), 1.5 if f > 1 else sigma, mode="wrap")
    if f > 1:
        n = np.asarray(Image.fromarray(n, mode="F").resize((int(round(sw * f)), int(round(sh * f))), Image.BILINEAR))
    n = n[:h, :w]
    sd = float(n.std()) or 1.0
    return ((n - float(n.mean())) / sd).astype(np.float32)


def bezier_many(ctrl: np.ndarray, n: int) -> np.ndarray:
    """Vectorised Bezier: control points (m, k, 2) -> samples (m, n, 2)."""
    ctrl = np.asarray(ctrl, dtype=np.float64)
    k = ctrl.shape[1] - 1
    t = np.linspace(0.0, 1.0, n)
    basis = np.stack([comb(k, i) * t ** i * (1 - t) ** (k - i) for i in range(k + 1)], axis=1)  # (n, k+1)
    return np.einsum("nk,mkd->mnd", basis, ctrl)


def splat(shape, pts: np.ndarray, weights=None) -> np.ndarray:
    """Bilinear splat of points (N, 2) as (x, y) with ``weights`` into a new float32 image."""
    h, w = shape
    pts = np.asarray(pts, dtype=np.float64).reshape(-1, 2)
    wt = np.ones(len(pts)) if weights is None else np.broadcast_to(np.asarray(weights, np.float64).ravel(), (len(pts),))
    x, y = pts[:, 0], pts[:, 1]
    x0, y0 = np.floor(x).astype(np.int64), np.floor(y).astype(np.int64)
    fx, fy = x - x0, y - y0
    xi = np.concatenate([x0, x0 + 1, x0, x0 + 1])
    yi = np.concatenate([y0, y0, y0 + 1, y0 + 1])
    ww = np.concatenate([wt * (1 - fx) * (1 - fy), wt * fx * (1 - fy), wt * (1 - fx) * fy, wt * fx * fy])
    ok = (xi >= 0) & (xi < w) & (yi >= 0) & (yi < h)
    out = np.bincount(yi[ok] * w + xi[ok], weights=ww[ok], minlength=h * w)
    return out.reshape(h, w).astype(np.float32)


def dense(curves: np.ndarray, step: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Resample polylines (m, n, 2) to points about ``step`` px apart; returns (points (P, 2), curve index (P,))."""
    seg = np.diff(curves, axis=1)
    length = np.hypot(seg[..., 0], seg[..., 1])  # (m, n-1)
    reps = np.maximum(1, np.ceil(length / step)).astype(np.int64)
    starts = curves[:, :-1].reshape(-1, 2)
    deltas = seg.reshape(-1, 2)
    r = reps.ravel()
    idx = np.repeat(np.arange(len(r)), r)
    frac = (np.arange(r.sum()) - np.repeat(np.cumsum(r) - r, r)) / np.repeat(r, r)
    pts = starts[idx] + deltas[idx] * frac[:, None]
    return pts, idx // (curves.shape[1] - 1)


def line_field(shape, curves: np.ndarray, sigma: float, weights=None) -> np.ndarray:
    """Curves splatted and blurred by ``sigma``, scaled so a long straight curve peaks at 1 (x its weight)."""
    pts, cidx = dense(curves, 0.5)
    wt = 0.5 if weights is None else 0.5 * np.asarray(weights, np.float64)[cidx]
    field = blur(splat(shape, pts, wt), sigma)
    return field * np.float32(np.sqrt(2 * np.pi) * sigma)


def blur_support(layer: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian blur of a sparse layer, computed only over the bounding box of its support (+4 sigma)."""
    from scipy.ndimage import gaussian_filter

    rows, cols = np.flatnonzero(layer.any(1)), np.flatnonzero(layer.any(0))
    if not len(rows):
        return layer
    pad = int(4 * sigma) + 2
    r0, r1 = max(0, rows[0] - pad), min(layer.shape[0], rows[-1] + pad + 1)
    c0, c1 = max(0, cols[0] - pad), min(layer.shape[1], cols[-1] + pad + 1)
    out = np.zeros_like(layer)
    out[r0:r1, c0:c1] = gaussian_filter(layer[r0:r1, c0:c1], sigma, mode="constant")
    return out
