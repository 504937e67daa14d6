"""The normal chest of one phantom: geometry from a real lung mask, and its density layers.

Image coordinates: x to the right of the image is the patient's LEFT (frontal
PA/AP convention). Side index 0 = patient right (image left), 1 = patient left.
Every length is a fraction of the image side ``S``; ``u = S / 256`` scales the
few pixel-sized constants (line widths, blur).

Layers (float32, S x S, in arbitrary "density" units added up by render.py):
``body`` (soft-tissue thickness), ``air`` (lung air depth, subtracted),
``bone``, ``vessels`` (lung markings), ``heart`` and ``media`` (mediastinum).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from PIL import Image
from scipy.ndimage import gaussian_filter
from scipy.special import expit

from medclr.phantom import draw

GEOMETRY = {"ctr": None, "inflation": 1.0, "elevate": (0.0, 0.0), "scoliosis": 0.0, "aorta": 1.0,
            "mediastinum": 1.0, "view": "PA", "spurs": 0}


@dataclass
class Anatomy:
    S: int
    lungs: np.ndarray  # (2, S, S) soft lung masks after the heart/mediastinum carve
    lungs_full: np.ndarray  # (2, S, S) lung masks before the carve (pleural space outline)
    layers: dict
    cx: float
    top: float  # lung apex row
    lateral: np.ndarray  # (2, S) lateral lung edge x per row (nan where no lung)
    medial: np.ndarray  # (2, S) medial lung edge x per row
    bottom: np.ndarray  # (2, S) lowest lung row per column (nan where no lung)
    dome: np.ndarray  # (2, 2) x, y of each hemidiaphragm dome top
    heart_box: tuple  # x0, y0, x1, y1 of the heart shadow above the diaphragm
    ctr: float  # measured cardiothoracic ratio
    thoracic_width: float
    hila: np.ndarray  # (2, 2) x, y
    carina: tuple
    knob: tuple  # x, y, r of the aortic knob
    spine_x: np.ndarray  # (S,) spine centre per row
    ribs: list = field(default_factory=list)  # (side, points (n, 2), width) of posterior ribs


def _place_lung(mask: np.ndarray, w: int, h: int, x0: int, y0: int, S: int, sharp: float) -> np.ndarray:
    img = Image.fromarray(mask).resize((max(2, w), max(2, h)), Image.BILINEAR)
    v = np.asarray(img, dtype=np.float32) / 255.0
    v = np.clip((v - 0.5) * sharp + 0.5, 0.0, 1.0)
    out = np.zeros((S, S), np.float32)
    ys, xs = slice(max(0, y0), min(S, y0 + v.shape[0])), slice(max(0, x0), min(S, x0 + v.shape[1]))
    out[ys, xs] = v[ys.start - y0:ys.stop - y0, xs.start - x0:xs.stop - x0]
    return out


def _edges(m: np.ndarray, side: int):
    """lateral, medial x per row and bottom y per column of one lung (nan where absent)."""
    b = m > 0.5
    rows, cols = b.any(1), b.any(0)
    first = np.where(rows, np.argmax(b, 1), -1).astype(np.float32)
    last = np.where(rows, b.shape[1] - 1 - np.argmax(b[:, ::-1], 1), -1).astype(np.float32)
    first[~rows] = np.nan
    last[~rows] = np.nan
    bottom = np.where(cols, b.shape[0] - 1 - np.argmax(b[::-1, :], 0), -1).astype(np.float32)
    bottom[~cols] = np.nan
    return (first, last, bottom) if side == 0 else (last, first, bottom)


def _body(S, cx, top, base_y, half_lat, rng, u) -> np.ndarray:
    y = np.arange(S, dtype=np.float32)
    neck = 0.085 * S
    shoulder = 0.56 * S
    wall = rng.uniform(0.07, 0.17) * S
    hw = np.interp(y, [0, top - 0.09 * S, top + 0.0 * S, base_y, S], [neck, neck * 1.2, shoulder, half_lat + wall,
                                                                     half_lat + wall + 0.03 * S])
    hw = np.maximum(hw, np.where(y > top, half_lat + wall, 0))
    hw = gaussian_filter(hw, 4 * u)
    thick = np.interp(y, [0, top, base_y, S], [0.75, 0.95, 1.0, 1.1]).astype(np.float32)
    dx = np.abs(np.arange(S, dtype=np.float32) - cx)[None, :] / hw[:, None]
    body = thick[:, None] * np.power(np.clip(1 - dx * dx, 0, None), 0.35)
    if rng.random() < 0.45:  # breast shadows over the lower lungs, sharp inferolateral margin
        size, by = rng.uniform(0.13, 0.19) * S, base_y - rng.uniform(0.02, 0.08) * S
        for s in (-1, 1):
            prof, win = draw.ellipsoid((S, S), cx + s * (half_lat - 0.35 * size), by - 0.5 * size, 1.1 * size, size)
            rows = np.arange(win[0].start, win[0].stop, dtype=np.float32)[:, None]
            body[win] += 0.16 * np.sqrt(prof) * np.clip((rows - (by - 1.2 * size)) / (0.6 * size), 0, 1)
    return body.astype(np.float32)


def _spine(S, cx, top, geo, u, bone):
    y = np.arange(S, dtype=np.float32)
    span = max(1.0, S - top)
    offset = geo["scoliosis"] * S * np.sin(np.clip((y - top + 0.05 * S) / span, 0, 1) * np.pi)
    sx = (cx + offset).astype(np.float32)
    vh = 0.047 * S
    phase = ((y - top + 0.4 * vh) % vh) / vh
    body_half = (0.036 * S) * (1 + 0.12 * (y / S))
    disc = (phase > 0.84).astype(np.float32)
    xs = np.arange(S, dtype=np.float32)[None, :]
    d = np.abs(xs - sx[:, None]) / body_half[:, None]
    vert = np.clip(1.3 - d, 0, 0.3) / 0.3 * (1 - 0.75 * disc[:, None])
    rim = np.exp(-((d - 0.93) ** 2) / 0.006) * 0.5
    ped = np.exp(-(((np.abs(xs - sx[:, None]) - 0.027 * S) / (0.008 * S)) ** 2) -
                 ((phase[:, None] - 0.3) / 0.16) ** 2)
    fade = np.interp(y, [0, top + 0.6 * span, S], [1.0, 0.8, 0.45]).astype(np.float32)[:, None]
    bone += (fade * (0.04 * vert + 0.025 * rim + 0.045 * ped)).astype(np.float32)
    if geo["spurs"]:
        n = int(geo["spurs"])
        for k in range(n):
            yy = top + (3 + 2 * k) * vh + 0.84 * vh
            if yy >= S:
                break
            i = int(np.clip(yy, 0, S - 1))
            for s in (-1, 1):
                p = np.array([[sx[i] + s * 0.036 * S, yy - 0.012 * S], [sx[i] + s * 0.05 * S, yy],
                              [sx[i] + s * 0.036 * S, yy + 0.004 * S]])
                draw.band(bone, p, 0.006 * S + u, 0.25, mode="add")
    return sx


def _ribs(S, cx, top, sp, lat, sx, u, rng, bottom_y):
    """Posterior and anterior ribs as smooth bands (splatted centre lines, blurred, thresholded)."""
    post, ant, ribs = [], [], []
    for s, side in ((-1, 0), (1, 1)):
        lat_side = lat[side]
        valid = np.flatnonzero(~np.isnan(lat_side))
        for i in range(12):
            yi = top - 0.02 * S + i * sp * (1 - 0.012 * i)
            if yi > bottom_y + 0.5 * sp or not len(valid):
                break
            iy = int(np.clip(yi, 0, S - 1))
            yw = yi + (0.9 + 0.06 * i) * sp
            j = int(np.clip(yw, valid[0], valid[-1]))
            xw = lat_side[j] + s * 0.014 * S
            if i == 0:
                xw = cx + s * abs(xw - cx) * 0.62
            x0 = sx[iy] + s * 0.03 * S
            L = abs(xw - x0)
            p = [[x0, yi], [x0 + s * 0.35 * L, yi - 0.45 * sp], [xw - s * 0.05 * L, yw - 0.9 * sp],
                 [xw + s * 0.006 * S, yw + 0.1 * sp]]
            post.append(p)
            ribs.append((side, i, (0.40 + 0.004 * i) * sp))
            xa = cx + s * (0.09 + 0.012 * i) * S
            ant.append([[xw + s * 0.006 * S, yw + 0.1 * sp], [xw - s * 0.02 * S, yw + 1.0 * sp],
                        [xa + s * 0.09 * S, yw + 1.5 * sp], [xa, yw + 1.8 * sp]])
    shape = (S, S)
    sig = 0.165 * sp
    curves = draw.bezier_many(np.array(post), 24)
    ribs = [(side, curves[n], width) for n, (side, _, width) in enumerate(ribs)]
    pf = draw.line_field(shape, curves, sig)
    band = np.clip((pf - 0.3) / 0.2, 0, 1)
    core = np.clip((pf - 0.8) / 0.15, 0, 1)
    af = draw.line_field(shape, draw.bezier_many(np.array(ant), 20), 0.13 * sp)
    aband = np.clip((af - 0.3) / 0.25, 0, 1)
    return (0.12 * band - 0.04 * core + 0.055 * aband).astype(np.float32), ribs


def _clavicles_shoulders(S, cx, top, u, bone, view, rng):
    lift = 0.035 * S if view == "AP" else 0.0
    for s in (-1, 1):
        pts = draw.bezier([[cx + s * 0.04 * S, top + 0.075 * S - lift], [cx + s * 0.16 * S, top + 0.075 * S - lift],
                           [cx + s * 0.22 * S, top - 0.015 * S - lift], [cx + s * 0.38 * S, top + 0.01 * S - lift]], 24)
        clav = np.zeros((S, S), np.float32)
        w = np.linspace(0.032, 0.022, len(pts)) * S
        draw.band(clav, pts, w, 1.0)
        draw.band(clav, pts, w * 0.4, 0.55, mode="max")
        bone += 0.16 * clav
        # humeral head and scapula
        hx, hy = cx + s * rng.uniform(0.44, 0.50) * S, top + rng.uniform(-0.01, 0.03) * S
        draw.add_ellipsoid(bone, hx, hy, 0.075 * S, 0.08 * S, 0.18)
        shaft = np.array([[hx, hy], [hx + s * 0.10 * S, hy + 0.4 * S]])
        draw.band(bone, draw.bezier(shaft, 8), 0.06 * S, 0.12, mode="add")
        scap = np.zeros((S, S), np.float32)
        inner_x = cx + s * (0.27 if view == "AP" else 0.33) * S
        tri = np.array([[hx - s * 0.02 * S, hy + 0.02 * S], [inner_x, top + 0.06 * S], [inner_x + s * 0.03 * S,
                                                                                          top + 0.36 * S],
                        [hx, top + 0.2 * S]])
        from skimage.draw import polygon

        rr, cc = polygon(tri[:, 1], tri[:, 0], (S, S))
        scap[rr, cc] = 1.0
        bone += 0.07 * draw.blur_support(scap, 1.2 * u)


def _vessels(S, hila, lungs, rng, u) -> np.ndarray:
    """Branching pulmonary vessels from each hilum (5 generations), fading to the periphery."""
    roots = np.deg2rad(np.array([-125, -85, -45, -5, 35, 70, 100], np.float64))
    xs, ys, ang, ln, wt, sg = [], [], [], [], [], []
    for side in (0, 1):
        n = len(roots)
        sgn = -1.0 if side == 0 else 1.0
        xs.append(hila[side][0] + sgn * rng.uniform(0.0, 0.025, n) * S)
        ys.append(hila[side][1] + np.linspace(-0.04, 0.05, n) * S)
        ang.append(roots + rng.normal(0, 0.1, n))
        ln.append(0.09 * S * rng.uniform(0.8, 1.2, n))
        wt.append(np.full(n, 0.8))
        sg.append(np.full(n, -1.0 if side == 0 else 1.0))
    x, y, a, length, w, s = (np.concatenate(v) for v in (xs, ys, ang, ln, wt, sg))
    thick, thin = [], []
    for depth in range(5):
        x1, y1 = x + s * np.cos(a) * length, y + np.sin(a) * length
        mid = np.stack([(x + x1) / 2 + rng.normal(0, 0.008 * S, len(x)), (y + y1) / 2], 1)
        ctrl = np.stack([np.stack([x, y], 1), mid, np.stack([x1, y1], 1)], 1)
        (thick if depth < 2 else thin).append((ctrl, w))
        m = len(x)
        x, y = np.repeat(x1, 2), np.repeat(y1, 2)
        a = np.repeat(a, 2) + np.tile([-0.38, 0.38], m) + rng.normal(0, 0.12, 2 * m)
        length = np.repeat(length, 2) * rng.uniform(0.55, 0.75, 2 * m)
        w = np.repeat(w, 2) * 0.7
        s = np.repeat(s, 2)
    ctrl = np.concatenate([g[0] for g in thick + thin])
    wts = np.concatenate([g[1] for g in thick] + [g[1] * 0.85 for g in thin])
    out = draw.line_field((S, S), draw.bezier_many(ctrl, 6), 0.9 * u, wts)
    return out * (lungs[0] + lungs[1])


def build_anatomy(lung_pair: np.ndarray, aspect: float, S: int, rng: np.random.Generator, geo: dict) -> Anatomy:
    geo = {**GEOMETRY, **geo}
    u = S / 256.0
    view = geo["view"]
    w = int(S * rng.uniform(0.68, 0.78))
    h_base = w * float(np.clip(aspect, 0.72, 0.98)) * (0.95 if view == "AP" else 1.0)
    h = int(min(h_base * geo["inflation"], 0.8 * S))
    top = int(S * rng.uniform(0.08, 0.12))
    cx = S * (0.5 + rng.normal(0, 0.008))
    x0 = int(round(cx - w / 2))
    sharp = 1.5 * max(1.0, h / lung_pair.shape[-1])
    lungs = np.stack([_place_lung(lung_pair[j], w, int(h * (1 - geo["elevate"][j])), x0, top, S, sharp) for j in (0, 1)])
    lat, med, bot = zip(*(_edges(lungs[j], j) for j in (0, 1)))
    lat, med, bot = np.stack(lat), np.stack(med), np.stack(bot)
    both = ~np.isnan(lat[0]) & ~np.isnan(lat[1])
    tw = float(np.nanmax(lat[1][both] - lat[0][both]))
    domes = np.array([[np.nanargmin(np.where(np.isnan(bot[j]), np.inf, bot[j])), np.nanmin(bot[j])] for j in (0, 1)])
    # heart: right-atrial and left-ventricular borders per row, widest rows above the diaphragm
    ctr_target = geo["ctr"] if geo["ctr"] is not None else rng.uniform(0.40, 0.47)
    hw_heart = ctr_target * (1.06 if view == "AP" else 1.0) * tw
    x_r = cx - rng.uniform(0.28, 0.35) * hw_heart
    a_r, a_l = 0.4 * hw_heart, 0.6 * hw_heart
    xm = x_r + a_r
    row85 = int(np.clip(top + 0.85 * h, 0, S - 1))
    mcols = [np.nanmax(med[0][top:row85 + 1]) - 0.03 * S, np.nanmin(med[1][top:row85 + 1]) + 0.03 * S]
    y_hb = float(np.nanmean([bot[j][int(np.clip(mcols[j], 0, S - 1))] for j in (0, 1)])) + 0.01 * S
    hh = min(hw_heart * rng.uniform(0.8, 0.95), 0.6 * h)
    yt = y_hb - hh
    yy, xx = np.mgrid[0:S, 0:S].astype(np.float32)
    y1 = np.arange(S, dtype=np.float32)

    def grow(y_wide: float, lo: float) -> np.ndarray:
        t = np.clip((y1 - yt) / max(y_wide - yt, 1.0), 0, 1)
        g = lo + (1 - lo) * np.sin(0.5 * np.pi * t) ** 0.9
        return np.where(y1 < yt, 0.0, g)

    right = xm - a_r * grow(yt + 0.6 * hh, 0.55)  # right atrial border, widest mid-low
    left = xm + a_l * grow(yt + 0.82 * hh, 0.3)  # left ventricular border, apex near the diaphragm
    mid, half = (left + right) / 2, np.maximum((left - right) / 2, 1e-3)
    uu = (xx - mid[:, None]) / half[:, None]
    heart = np.sqrt(np.clip(1 - uu * uu, 0, None)) * (y1 >= yt)[:, None]
    heart = (heart * np.clip((y1 - yt) / (0.15 * hh), 0, 1)[:, None]).astype(np.float32)
    below = expit((yy - y_hb) / (1.5 * u))
    visible = heart * (1 - 0.65 * below)
    hb = (heart > 0) & (yy < y_hb)
    cols = np.flatnonzero(hb.any(0))
    rows = np.flatnonzero(hb.any(1))
    heart_box = ((float(cols[0]), float(rows[0]), float(cols[-1] + 1), float(y_hb)) if len(cols)
                 else (cx, y_hb, cx + 1, y_hb + 1))
    ctr = (heart_box[2] - heart_box[0]) / tw
    lungs_full = lungs.copy()
    carve = 0.7 * np.clip(heart * 4, 0, 1)
    # superior mediastinum, aortic knob, hila
    media = np.zeros((S, S), np.float32)
    heart_top = y_hb - hh
    y_ = np.arange(S, dtype=np.float32)
    mw = (0.036 * S * geo["mediastinum"]) * np.interp(y_, [0, top, heart_top], [0.8, 1.0, 1.25])
    dxm = (xx - (cx + 0.004 * S)) / mw[:, None]
    sup = np.sqrt(np.clip(1 - dxm * dxm, 0, None)) * (yy < heart_top + 0.03 * S)
    media += 0.15 * sup
    kr = 0.022 * S * geo["aorta"]
    knob = (cx + 0.035 * S + 0.5 * kr, top + 0.17 * h, kr)
    knob_mask = draw.add_ellipsoid(media, knob[0], knob[1], kr, kr * 1.1, 0.12)
    carve = np.maximum(carve, 0.95 * np.clip(sup * 3, 0, 1))
    carve[knob_mask] = np.maximum(carve[knob_mask], 0.92)
    # descending aorta along the left of the spine
    desc = draw.bezier([[knob[0], knob[1]], [cx + 0.04 * S, knob[1] + 0.1 * S], [cx + 0.03 * S, y_hb + 0.05 * S]], 16)
    draw.band(media, desc, 0.045 * S * geo["aorta"], 0.08, mode="add")
    lungs = lungs * (1 - carve)
    hila = np.array([[cx - rng.uniform(0.10, 0.12) * S, top + rng.uniform(0.40, 0.45) * h],
                     [cx + rng.uniform(0.09, 0.11) * S, top + rng.uniform(0.35, 0.40) * h]])
    for j in (0, 1):
        draw.add_ellipsoid(media, hila[j][0], hila[j][1], 0.03 * S, 0.05 * S, 0.22)
    layers = {"media": media, "heart": (0.14 * visible).astype(np.float32)}
    base_y = float(np.nanmax(domes[:, 1]))
    half_lat = max(cx - np.nanmin(lat[0]), np.nanmax(lat[1]) - cx)
    layers["body"] = _body(S, cx, top, base_y, half_lat, rng, u)
    # lung air: thicker centrally and towards the bases
    lsum = lungs[0] + lungs[1]
    depth = draw.blur(lsum, 0.035 * S)
    ramp = np.clip((yy - top) / max(h, 1), 0, 1)
    texture = 1 + 0.025 * draw.texture(rng, (S, S), 1.2 * u) + 0.04 * draw.texture(rng, (S, S), 6 * u)
    layers["air"] = (lsum * (0.45 + 0.55 * np.clip(depth * 1.6, 0, 1)) * (0.92 + 0.1 * ramp) * texture).astype(np.float32)
    # stomach bubble under the left dome
    air_abd = np.zeros((S, S), np.float32)
    if rng.random() < 0.8 and not np.isnan(domes[1][1]):
        draw.add_ellipsoid(air_abd, domes[1][0] + rng.uniform(-0.02, 0.03) * S, domes[1][1] + 0.05 * S,
                           rng.uniform(0.03, 0.05) * S, rng.uniform(0.02, 0.035) * S, 0.35)
    layers["air"] += air_abd
    # trachea and main bronchi
    carina = (cx - 0.005 * S, top + 0.3 * h)
    trach = np.zeros((S, S), np.float32)
    draw.band(trach, np.array([[cx - 0.002 * S, 0], [carina[0], carina[1]]]), 0.045 * S, 1.0)
    for j in (0, 1):
        draw.band(trach, draw.bezier([carina, [(carina[0] + hila[j][0]) / 2, carina[1] + 0.02 * S],
                                      [hila[j][0] * 0.6 + carina[0] * 0.4, hila[j][1] - 0.01 * S]], 10),
                  0.028 * S, 0.8)
    layers["air"] += 0.45 * draw.blur_support(trach, 1.0 * u)
    bone = np.zeros((S, S), np.float32)
    sx = _spine(S, cx, top, geo, u, bone)
    sp = h_base / 9.4
    rib_layer, ribs = _ribs(S, cx, top, sp, lat, sx, u, rng, base_y)
    chest = np.clip(draw.blur(lungs_full[0] + lungs_full[1], 0.04 * S) * 2.5, 0, 1)
    bone += rib_layer * (0.4 + 0.6 * chest)
    _clavicles_shoulders(S, cx, top, u, bone, view, rng)
    layers["bone"] = bone
    layers["vessels"] = _vessels(S, hila, lungs, rng, u)
    return Anatomy(S=S, lungs=lungs.astype(np.float32), lungs_full=lungs_full, layers=layers, cx=cx, top=float(top),
                   lateral=lat, medial=med, bottom=bot, dome=domes, heart_box=heart_box, ctr=float(ctr),
                   thoracic_width=tw, hila=hila, carina=carina, knob=knob, spine_x=sx, ribs=ribs)
