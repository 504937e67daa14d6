"""Lung, pleural and cardiac findings drawn as their radiographic signs.

Every drawing function takes (canvas, finding, rng) and returns a list of
boolean masks, one per ground-truth box (a bilateral finding gets one box per
lung). It changes the canvas layers only: ``air_scale`` (fraction of lung air
left: fluid and consolidation replace air), ``air_add`` (extra air: pneumothorax),
``extra`` (added density), ``vessel_scale`` (lung markings) and ``metal``.
Findings that change the anatomy itself (heart size, inflation, a raised
hemidiaphragm, the spine, the aorta) do so through ``geometry()``, before the
anatomy is built.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.ndimage import distance_transform_edt, gaussian_filter
from scipy.special import expit

from medclr.phantom import draw
from medclr.phantom.anatomy import Anatomy

CTR_BY_SEVERITY = {"borderline": (0.51, 0.53), "mild": (0.53, 0.57), "moderate": (0.57, 0.63), "severe": (0.63, 0.70),
                   "": (0.53, 0.62)}
ZONE_FRAC = {  # (fraction of lung height from the apex, fraction medial -> lateral)
    "apex": (0.07, 0.5), "upper": (0.25, 0.55), "mid": (0.5, 0.55), "perihilar": (0.45, 0.2),
    "lingula": (0.64, 0.25), "middle lobe": (0.64, 0.25), "lower": (0.74, 0.5), "base": (0.86, 0.55),
    "diffuse": (0.5, 0.5), "": (0.7, 0.5),
}


@dataclass
class Canvas:
    anat: Anatomy
    air_scale: np.ndarray
    air_add: np.ndarray
    extra: np.ndarray
    vessel_scale: np.ndarray
    metal: np.ndarray

    @classmethod
    def empty(cls, anat: Anatomy) -> Canvas:
        S = anat.S
        return cls(anat, np.ones((S, S), np.float32), np.zeros((S, S), np.float32), np.zeros((S, S), np.float32),
                   np.ones((S, S), np.float32), np.zeros((S, S), np.float32))


def geometry(findings: list[dict], view: str, rng: np.random.Generator) -> dict:
    """Anatomy modifiers implied by the findings (heart size, inflation, diaphragm, spine, aorta, mediastinum)."""
    geo: dict = {"view": view}
    names = {f["name"]: f for f in findings if not f["name"].startswith("other:")}
    if "cardiomegaly" in names:
        geo["ctr"] = float(rng.uniform(*CTR_BY_SEVERITY.get(names["cardiomegaly"]["severity"], (0.53, 0.62))))
    elif "hypoinflation" in names:
        geo["ctr"] = float(rng.uniform(0.44, 0.47))
    elif "hyperinflation" in names:
        geo["ctr"] = float(rng.uniform(0.37, 0.42))
    if "hyperinflation" in names:
        geo["inflation"] = float(rng.uniform(1.10, 1.18))
    elif "hypoinflation" in names:
        geo["inflation"] = float(rng.uniform(0.82, 0.88))
    if "elevated_hemidiaphragm" in names:
        side = names["elevated_hemidiaphragm"]["side"]
        d = float(rng.uniform(0.09, 0.15))
        geo["elevate"] = (d if side in ("right", "bilateral") else 0.0, d if side in ("left", "bilateral") else 0.0)
    if "scoliosis" in names:
        sign = 1.0 if names["scoliosis"]["side"] == "left" else (-1.0 if names["scoliosis"]["side"] == "right"
                                                                 else float(rng.choice([-1.0, 1.0])))
        geo["scoliosis"] = sign * float(rng.uniform(0.02, 0.04))
    if "tortuous_aorta" in names:
        geo["aorta"] = float(rng.uniform(1.35, 1.7))
    if "mediastinal_widening" in names:
        geo["mediastinum"] = float(rng.uniform(1.45, 1.8))
    if "degenerative_spine" in names:
        geo["spurs"] = int(rng.integers(3, 6))
    return geo


def sides_of(f: dict) -> tuple[int, ...]:
    return {"right": (0,), "left": (1,), "bilateral": (0, 1)}.get(f["side"], (0,))


def lung_rows(anat: Anatomy, j: int) -> tuple[int, int]:
    rows = np.flatnonzero(~np.isnan(anat.lateral[j]))
    return int(rows[0]), int(rows[-1])


def zone_point(anat: Anatomy, j: int, zone: str, rng: np.random.Generator, jitter: float = 0.04) -> tuple[float, float]:
    fy, fx = ZONE_FRAC.get(zone, ZONE_FRAC[""])
    r0, r1 = lung_rows(anat, j)
    y = r0 + np.clip(fy + rng.normal(0, jitter), 0.04, 0.93) * (r1 - r0)
    yi = int(np.clip(y, r0, r1))
    xm, xl = anat.medial[j][yi], anat.lateral[j][yi]
    x = xm + np.clip(fx + rng.normal(0, jitter), 0.12, 0.88) * (xl - xm)
    return float(x), float(y)


def _in_lung(anat: Anatomy, j: int, field: np.ndarray) -> np.ndarray:
    return field * anat.lungs_full[j]


def pleural_effusion(cv: Canvas, f: dict, rng) -> list:
    a, S = cv.anat, cv.anat.S
    frac_range = {"small": (0.1, 0.16), "moderate": (0.22, 0.34), "large": (0.42, 0.58)}.get(f["size"], (0.12, 0.3))
    yy, xx = np.mgrid[0:S, 0:S].astype(np.float32)
    masks = []
    for j in sides_of(f):
        r0, r1 = lung_rows(a, j)
        lowest = float(np.nanmax(a.bottom[j]))
        frac = rng.uniform(*frac_range)
        level = lowest - frac * (r1 - r0)
        row = int(np.clip(level, r0, r1))
        xm, xl = a.medial[j][row], a.lateral[j][row]
        t = np.clip((xx - xm) / (xl - xm + 1e-6), 0, 1.3)
        surface = level - 0.8 * frac * (r1 - r0) * t ** 2.2 - 0.015 * S * t
        fluid = expit((yy - surface) / (0.014 * S))
        pleural = gaussian_filter(a.lungs_full[j], 0.012 * S)
        fluid = fluid * np.clip(pleural * 1.6, 0, 1) * (yy > r0)
        cv.air_scale *= 1 - 0.95 * fluid
        cv.vessel_scale *= 1 - fluid
        cv.extra += 0.1 * fluid
        masks.append(fluid > 0.5)
    return masks


def pneumothorax(cv: Canvas, f: dict, rng) -> list:
    a, S, u = cv.anat, cv.anat.S, cv.anat.S / 256
    masks = []
    yy = np.arange(S, dtype=np.float32)[:, None]
    for j in sides_of(f):
        lung = a.lungs_full[j] > 0.5
        r0, r1 = lung_rows(a, j)
        width = float(np.nanmax(np.abs(a.lateral[j] - a.medial[j])))
        depth = width * rng.uniform(*{"small": (0.05, 0.08), "moderate": (0.1, 0.16), "large": (0.2, 0.3)}.get(
            f["size"], (0.07, 0.14)))
        reach = 0.9 if f["size"] == "large" else (0.5 if f["zone"] in ("apex", "upper", "") else 0.8)
        # distance to the lateral/apical chest wall only: medial and basal exteriors count as inside
        cols = np.arange(S)[None, :]
        med = a.medial[j][:, None]
        medial_side = (cols > med) if j == 0 else (cols < med)
        below = yy > (r0 + 0.3 * (r1 - r0))
        inside = lung | (np.nan_to_num(medial_side, nan=0).astype(bool) & (yy > r0)) | \
            (below & np.isnan(a.lateral[j])[:, None])
        dt = distance_transform_edt(inside)
        taper = np.clip(1 - (yy - r0) / (reach * (r1 - r0)), 0, 1) ** 0.7
        limit = depth * taper
        ptx = lung & (dt < limit)
        line = lung & (dt >= limit) & (dt < limit + 1.3 * u) & (limit > 1)
        collapsed = lung & ~ptx
        cv.air_add += 0.3 * draw.blur_support(ptx.astype(np.float32), 0.5 * u)
        cv.vessel_scale *= 1 - ptx
        rim = collapsed & (dt < limit + 0.03 * S) & (limit > 1)
        cv.air_scale *= 1 - 0.15 * rim * np.clip(1 - (dt - limit) / (0.03 * S), 0, 1)
        cv.extra += 0.25 * draw.blur_support(line.astype(np.float32), 0.4 * u)
        masks.append(ptx | rim)
    return masks


def edema(cv: Canvas, f: dict, rng) -> list:
    """Bilateral perihilar haze, upper-zone vascular prominence and Kerley B lines at the lateral bases."""
    a, S, u = cv.anat, cv.anat.S, cv.anat.S / 256
    amp = {"mild": 0.35, "moderate": 0.55, "severe": 0.75}.get(f["severity"], 0.5)
    yy, xx = np.mgrid[0:S, 0:S].astype(np.float32)
    texture = 0.75 + 0.25 * draw.texture(rng, (S, S), 3 * u)
    curves, owner = [], []
    for j in (0, 1):
        s = -1 if j == 0 else 1
        r0, r1 = lung_rows(a, j)
        for _ in range(int(rng.integers(4, 8))):
            y = r1 - rng.uniform(0.05, 0.22) * (r1 - r0)
            x = a.lateral[j][int(y)] - s * rng.uniform(0.002, 0.01) * S
            curves.append([[x, y], [x - s * 0.02 * S, y + rng.normal(0, 0.002 * S)]])
            owner.append(j)
    masks = []
    for j in (0, 1):
        hx, hy = a.hila[j]
        g = np.exp(-((xx - hx) / (0.13 * S)) ** 2 - ((yy - hy) / (0.16 * S)) ** 2)
        haze = np.clip(g * texture, 0, 1) * a.lungs_full[j]
        vessels = np.exp(-((xx - hx) / (0.12 * S)) ** 2 - ((yy - hy + 0.06 * S) / (0.14 * S)) ** 2)
        cv.air_scale *= 1 - 0.75 * amp * haze
        cv.extra += 0.06 * amp * haze
        cv.vessel_scale *= 1 + 0.8 * amp * vessels * (a.lungs_full[j] > 0.5)
        mine = [c for c, o in zip(curves, owner) if o == j]
        lines = draw.line_field((S, S), draw.bezier_many(np.array(mine), 4), 0.5 * u) * a.lungs_full[j]
        cv.extra += 0.06 * amp * lines
        masks.append((a.lungs_full[j] > 0.5) & ((haze > 0.15) | (vessels > 0.15) | (draw.blur(lines, 1.5 * u) > 0.05)))
    return masks


def airspace(cv: Canvas, f: dict, rng, boxes=None) -> list:
    """Consolidation, pneumonia and airspace opacity: patchy opacity at a zone."""
    a, S, u = cv.anat, cv.anat.S, cv.anat.S / 256
    dens = {"consolidation": 0.9, "pneumonia": 0.85, "opacity": 0.6}[f["name"]]
    yy, xx = np.mgrid[0:S, 0:S].astype(np.float32)
    masks = []
    for j in sides_of(f):
        x, y = zone_point(a, j, f["zone"], rng)
        if boxes is not None and len(boxes):
            bw, bh = boxes[int(rng.integers(len(boxes)))][2:]
        else:
            bw, bh = rng.uniform(0.15, 0.28, 2)
        rx, ry = np.clip(bw * 0.42, 0.05, 0.14) * S, np.clip(bh * 0.42, 0.05, 0.15) * S
        env = np.exp(-((xx - x) / rx) ** 2 - ((yy - y) / ry) ** 2)
        patch = np.clip(env * (0.8 + 0.45 * draw.texture(rng, (S, S), 0.02 * S)) - 0.3, 0, 0.7) / 0.7
        patch = gaussian_filter(patch, 0.8 * u) * a.lungs_full[j]
        cv.air_scale *= 1 - dens * patch
        cv.extra += 0.05 * patch
        cv.vessel_scale *= 1 - 0.5 * patch
        masks.append(patch > 0.3)
    return masks


def atelectasis(cv: Canvas, f: dict, rng) -> list:
    a, S, u = cv.anat, cv.anat.S, cv.anat.S / 256
    masks = []
    for j in sides_of(f):
        s = -1 if j == 0 else 1
        x, y = zone_point(a, j, f["zone"] or "lower", rng, jitter=0.03)
        layer = np.zeros((S, S), np.float32)
        if f["kind"] == "wedge":
            hx, hy = a.hila[j]
            tip = [hx + s * 0.02 * S, hy + 0.02 * S]
            wall = [x + s * 0.06 * S, y - 0.04 * S], [x + s * 0.06 * S, y + 0.05 * S]
            from skimage.draw import polygon

            pts = np.array([tip, wall[0], wall[1]])
            rr, cc = polygon(pts[:, 1], pts[:, 0], (S, S))
            layer[rr, cc] = 1.0
            layer = draw.blur_support(layer, 1.5 * u)
        else:
            half = rng.uniform(0.05, 0.09) * S
            tilt = rng.uniform(-0.25, 0.25)
            curve = [[x - half, y - tilt * half], [x, y + rng.normal(0, 0.006 * S)], [x + half, y + tilt * half]]
            f_ = draw.line_field((S, S), draw.bezier_many(np.array([curve]), 12), 0.006 * S + 0.6 * u)
            layer = np.clip(f_ * 1.4, 0, 1)
        layer *= a.lungs_full[j]
        cv.air_scale *= 1 - 0.75 * layer
        cv.extra += 0.05 * layer
        masks.append(layer > 0.3)
    return masks


def nodule(cv: Canvas, f: dict, rng, boxes=None) -> list:
    a, S = cv.anat, cv.anat.S
    kind = f["kind"] or "nodule"
    masks = []
    n = int(max(1, f["count"] if f["count"] > 1 else 1))
    sides = sides_of(f)
    for i in range(n):
        j = sides[i % len(sides)]
        x, y = zone_point(a, j, f["zone"] if i == 0 else "", rng, jitter=0.12 if i else 0.05)
        if kind == "calcified":
            r, dens = rng.uniform(0.006, 0.011) * S, 0.55
        elif kind == "mass":
            base = boxes["mass"] if boxes and len(boxes.get("mass", [])) else None
            r = (np.clip(base[int(rng.integers(len(base)))][2] * 0.35, 0.03, 0.07) if base is not None
                 else rng.uniform(0.035, 0.06)) * S
            dens = 0.35
        else:
            base = boxes["nodule"] if boxes and len(boxes.get("nodule", [])) else None
            r = (np.clip(base[int(rng.integers(len(base)))][2] * 0.25, 0.01, 0.025) if base is not None
                 else rng.uniform(0.012, 0.022)) * S
            dens = 0.45
        prof, win = draw.ellipsoid((S, S), x, y, r, r * rng.uniform(0.85, 1.15), rng.uniform(0, np.pi))
        if kind == "mass":
            prof = np.clip(prof * (1 + 0.25 * draw.smooth_noise(rng, prof.shape, max(1.0, r / 3))), 0, None)
        cv.extra[win] += dens * prof
        cv.air_scale[win] *= 1 - 0.5 * (prof > 0)
        m = np.zeros((S, S), bool)
        m[win] = prof > 0.05
        masks.append(m)
    return masks


def interstitial(cv: Canvas, f: dict, rng) -> list:
    a, S, u = cv.anat, cv.anat.S, cv.anat.S / 256
    n = draw.texture(rng, (S, S), 1.6 * u)
    net = np.exp(-(n / 0.3) ** 2)
    yy = np.arange(S, dtype=np.float32)[:, None]
    masks = []
    for j in (0, 1):
        r0, r1 = lung_rows(a, j)
        env = np.clip((yy - r0) / (r1 - r0 + 1e-6), 0, 1) if f["zone"] not in ("diffuse", "upper", "apex") else 0.8
        layer = net * env * a.lungs_full[j]
        cv.extra += 0.09 * layer
        cv.air_scale *= 1 - 0.15 * env * a.lungs_full[j]
        masks.append((env * a.lungs_full[j]) > 0.5)
    return masks


def vascular_prominence(cv: Canvas, f: dict, rng) -> list:
    a, S = cv.anat, cv.anat.S
    yy, xx = np.mgrid[0:S, 0:S].astype(np.float32)
    masks = []
    for j in (0, 1):
        hx, hy = a.hila[j]
        g = np.exp(-((xx - hx) / (0.12 * S)) ** 2 - ((yy - hy) / (0.14 * S)) ** 2)
        cv.vessel_scale *= 1 + 1.0 * g
        masks.append((g > 0.35) & (a.lungs_full[j] > 0.5))
    return masks


def scarring(cv: Canvas, f: dict, rng) -> list:
    a, S, u = cv.anat, cv.anat.S, cv.anat.S / 256
    masks = []
    for j in sides_of(f):
        x, y = zone_point(a, j, f["zone"] or "apex", rng, jitter=0.03)
        curves = [[[x + rng.normal(0, 0.02 * S), y + rng.normal(0, 0.02 * S)],
                   [x + rng.normal(0, 0.03 * S), y + rng.normal(0, 0.03 * S)],
                   [x + rng.normal(0, 0.05 * S), y + rng.normal(0, 0.04 * S)]] for _ in range(int(rng.integers(2, 5)))]
        lines = draw.line_field((S, S), draw.bezier_many(np.array(curves), 10), 0.8 * u) * a.lungs_full[j]
        cv.extra += 0.1 * np.clip(lines, 0, 1.5)
        cv.air_scale *= 1 - 0.3 * np.clip(lines, 0, 1)
        masks.append(lines > 0.25)
    return masks


def pleural_thickening(cv: Canvas, f: dict, rng) -> list:
    a, S = cv.anat, cv.anat.S
    masks = []
    for j in sides_of(f):
        lung = a.lungs_full[j] > 0.5
        dt = distance_transform_edt(lung)
        r0, r1 = lung_rows(a, j)
        yy = np.arange(S)[:, None]
        region = (yy < r0 + 0.25 * (r1 - r0)) if f["zone"] in ("apex", "upper", "") else (yy > r0 + 0.4 * (r1 - r0))
        band = lung & (dt < rng.uniform(0.008, 0.016) * S) & region
        soft = draw.blur_support(band.astype(np.float32), 0.6 * S / 256)
        cv.extra += 0.12 * soft
        cv.air_scale *= 1 - 0.7 * soft
        masks.append(band)
    return masks


def cardiomegaly(cv: Canvas, f: dict, rng) -> list:
    a = cv.anat
    x0, y0, x1, y1 = (int(round(v)) for v in a.heart_box)
    m = np.zeros((a.S, a.S), bool)
    m[max(0, y0):y1, max(0, x0):x1] = True
    return [m]
