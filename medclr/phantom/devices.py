"""Devices, bones, mediastinum and global findings; and the name -> drawing function registry."""

from __future__ import annotations

import numpy as np

from medclr.phantom import draw, lesions as L
from medclr.phantom.lesions import Canvas, sides_of


def _wire(cv: Canvas, ctrl, width: float, value: float) -> np.ndarray:
    S = cv.anat.S
    layer = np.zeros((S, S), np.float32)
    draw.band(layer, draw.bezier(ctrl, 40), width, 1.0)
    layer = draw.blur_support(layer, 0.35 * S / 256)
    cv.metal += value * layer
    return layer > 0.2


def central_line(cv: Canvas, f: dict, rng) -> list:
    a, S = cv.anat, cv.anat.S
    cx, top = a.cx, a.top
    tip = (cx - 0.03 * S, a.carina[1] + rng.uniform(0.04, 0.09) * S)
    left = f["side"] == "left"
    kind = f["kind"] or rng.choice(["ij", "subclavian", "picc"])
    if kind == "ij":
        x = cx + (0.07 if left else -0.07) * S
        ctrl = [[x, 0], [x * 0.9 + cx * 0.1, top + 0.05 * S], [cx - 0.03 * S, a.carina[1] - 0.05 * S], tip]
    elif kind == "picc":
        edge = S - 1 if left else 0
        ctrl = [[edge, top + 0.2 * S], [cx + (0.35 if left else -0.35) * S, top - 0.02 * S],
                [cx + (0.1 if left else -0.1) * S, top + 0.02 * S], [cx - 0.04 * S, a.carina[1]], tip]
    else:
        ctrl = [[cx + (0.3 if left else -0.3) * S, top + 0.02 * S], [cx + (0.12 if left else -0.12) * S, top + 0.01 * S],
                [cx - 0.04 * S, a.carina[1] - 0.03 * S], tip]
    return [_wire(cv, np.array(ctrl), 0.006 * S + 0.6, 0.7)]


def tube(cv: Canvas, f: dict, rng) -> list:
    a, S = cv.anat, cv.anat.S
    cx = a.cx
    if (f["kind"] or ("et" if rng.random() < 0.6 else "ng")) == "et":
        end = a.carina[1] - rng.uniform(0.03, 0.06) * S
        ctrl = np.array([[cx - 0.004 * S, 0], [cx - 0.004 * S, end * 0.5], [a.carina[0], end]])
        m = _wire(cv, ctrl, 0.02 * S, 0.18)
        _wire(cv, ctrl, 0.004 * S + 0.5, 0.5)
        return [m]
    dome = a.dome[1]
    ctrl = np.array([[cx + 0.01 * S, 0], [cx + 0.02 * S, a.carina[1]], [cx + 0.02 * S, dome[1]],
                     [dome[0], dome[1] + 0.07 * S]])
    return [_wire(cv, ctrl, 0.008 * S + 0.5, 0.55)]


def pacemaker(cv: Canvas, f: dict, rng) -> list:
    a, S = cv.anat, cv.anat.S
    s = -1 if f["side"] == "right" else 1
    gx, gy = a.cx + s * rng.uniform(0.2, 0.26) * S, a.top + rng.uniform(0.06, 0.12) * S
    gen = np.zeros((S, S), np.float32)
    draw.add_ellipsoid(gen, gx, gy, 0.04 * S, 0.03 * S, 1.0, rng.uniform(-0.3, 0.3))
    gen = np.clip(gen * 4, 0, 1)
    cv.metal += 1.6 * gen
    masks = [gen > 0.1]
    x0, y0, x1, y1 = a.heart_box
    for tipx, tipy in ((x0 + 0.25 * (x1 - x0), y0 + 0.35 * (y1 - y0)), (x0 + 0.6 * (x1 - x0), y1 - 0.06 * S)):
        ctrl = np.array([[gx, gy], [gx - s * 0.08 * S, gy - 0.03 * S], [a.cx - 0.03 * S, a.carina[1]],
                         [a.cx - 0.04 * S, y0], [tipx, tipy]])
        masks[0] |= _wire(cv, ctrl, 0.006 * S + 0.5, 0.8)
    return masks


def sternotomy(cv: Canvas, f: dict, rng) -> list:
    a, S = cv.anat, cv.anat.S
    layer = np.zeros((S, S), np.float32)
    n = int(rng.integers(5, 8))
    ys = np.linspace(a.top + 0.1 * S, a.heart_box[1] + 0.35 * (a.heart_box[3] - a.heart_box[1]), n)
    for y in ys:
        x = a.cx + rng.normal(0, 0.004 * S)
        t = np.linspace(0, 2 * np.pi, 24)
        ring = np.stack([x + 0.012 * S * np.cos(t), y + 0.006 * S * np.sin(t)], 1)
        draw.band(layer, ring, 0.004 * S + 0.6, 1.0)
    layer = draw.blur_support(layer, 0.3 * S / 256)
    cv.metal += 1.1 * layer
    return [layer > 0.2]


def surgical_clips(cv: Canvas, f: dict, rng) -> list:
    a, S = cv.anat, cv.anat.S
    if f["kind"] == "abdomen":
        x, y = a.dome[0][0] + 0.03 * S, a.dome[0][1] + 0.08 * S
    elif f["kind"] == "valve":
        x0, y0, x1, y1 = a.heart_box
        x, y = x0 + 0.45 * (x1 - x0), y0 + 0.45 * (y1 - y0)
    else:
        x, y = a.cx + rng.uniform(-0.05, 0.07) * S, a.top + rng.uniform(0.15, 0.35) * S
    layer = np.zeros((S, S), np.float32)
    if f["kind"] == "valve":
        t = np.linspace(0, 2 * np.pi, 30)
        draw.band(layer, np.stack([x + 0.025 * S * np.cos(t), y + 0.018 * S * np.sin(t)], 1), 0.006 * S + 0.5, 1.0)
    else:
        for _ in range(int(rng.integers(3, 7))):
            px, py = x + rng.normal(0, 0.02 * S), y + rng.normal(0, 0.02 * S)
            ang = rng.uniform(0, np.pi)
            d = 0.007 * S * np.array([np.cos(ang), np.sin(ang)])
            draw.band(layer, np.array([[px, py] - d, [px, py] + d]), 0.004 * S + 0.6, 1.0)
    layer = draw.blur_support(layer, 0.3 * S / 256)
    cv.metal += 1.3 * layer
    return [layer > 0.2]


def fracture(cv: Canvas, f: dict, rng) -> list:
    a, S = cv.anat, cv.anat.S
    masks = []
    for j in sides_of(f):
        ribs = [r for r in a.ribs if r[0] == j][3:9] or [r for r in a.ribs if r[0] == j]
        _, pts, width = ribs[int(rng.integers(len(ribs)))]
        p = pts[int(rng.uniform(0.55, 0.85) * (len(pts) - 1))]
        healed = f["kind"] == "healed" or rng.random() < 0.5
        prof, win = draw.ellipsoid((S, S), p[0], p[1], 0.7 * width, 0.75 * width)
        if healed:
            cv.extra[win] += 0.12 * np.clip(prof * 2, 0, 1)
        else:  # a lucent gap across the rib cortex
            gap, gwin = draw.ellipsoid((S, S), p[0], p[1], 0.18 * width, 0.7 * width, rng.uniform(-0.5, 0.5))
            cv.extra[gwin] -= 0.12 * np.clip(gap * 3, 0, 1)
        m = np.zeros((S, S), bool)
        m[win] = prof > 0
        masks.append(m)
    return masks


def calcified_nodes(cv: Canvas, f: dict, rng) -> list:
    a, S = cv.anat, cv.anat.S
    masks = []
    for j in sides_of(f) if f["side"] else (int(rng.integers(2)),):
        hx, hy = a.hila[j]
        m = np.zeros((S, S), bool)
        for _ in range(int(rng.integers(2, 4))):
            r = rng.uniform(0.006, 0.01) * S
            prof, win = draw.ellipsoid((S, S), hx + rng.normal(0, 0.015 * S), hy + rng.normal(0, 0.02 * S), r, r)
            cv.extra[win] += 0.45 * prof
            m[win] |= prof > 0
        masks.append(m)
    return masks


def aortic_calcification(cv: Canvas, f: dict, rng) -> list:
    a, S = cv.anat, cv.anat.S
    x, y, r = a.knob
    t = np.linspace(-1.2, 0.6, 16)
    arc = np.stack([x + 0.85 * r * np.cos(t), y + 0.9 * r * np.sin(t)], 1)
    layer = np.zeros((S, S), np.float32)
    draw.band(layer, arc, 0.004 * S + 0.5, 1.0)
    cv.extra += 0.3 * draw.blur_support(layer, 0.4 * S / 256)
    return [layer > 0.2]


def hiatal_hernia(cv: Canvas, f: dict, rng) -> list:
    a, S = cv.anat, cv.anat.S
    cx, cy = a.cx + 0.03 * S, a.heart_box[3] - 0.06 * S
    rx, ry = rng.uniform(0.04, 0.07) * S, rng.uniform(0.035, 0.055) * S
    prof, win = draw.ellipsoid((S, S), cx, cy, rx, ry)
    cv.extra[win] += 0.1 * prof
    yy = np.arange(win[0].start, win[0].stop)[:, None]
    gas = (prof > 0) & (yy < cy - 0.2 * ry)
    cv.air_add[win] += 0.5 * gas * np.clip(prof * 3, 0, 1)
    m = np.zeros((S, S), bool)
    m[win] = prof > 0
    return [m]


def _region(a, rows, cols) -> np.ndarray:
    m = np.zeros((a.S, a.S), bool)
    r0, r1 = (int(np.clip(v, 0, a.S)) for v in rows)
    c0, c1 = (int(np.clip(v, 0, a.S)) for v in cols)
    m[r0:r1, c0:c1] = True
    return m


def global_finding(cv: Canvas, f: dict, rng) -> list:
    """Whole-chest or anatomical findings drawn through geometry(); the box marks the changed anatomy."""
    a, S, name = cv.anat, cv.anat.S, f["name"]
    if name in ("hyperinflation", "hypoinflation"):
        if name == "hyperinflation":
            cv.air_scale *= 1.08
            cv.vessel_scale *= 0.8
        lungs = (a.lungs_full[0] + a.lungs_full[1]) > 0.5
        return [lungs]
    if name == "elevated_hemidiaphragm":
        out = []
        for j in sides_of(f):
            cols = np.flatnonzero(~np.isnan(a.bottom[j]))
            out.append(_region(a, (a.dome[j][1] - 0.04 * S, np.nanmax(a.bottom[j]) + 0.03 * S), (cols[0], cols[-1] + 1)))
        return out
    if name == "tortuous_aorta":
        x, y, r = a.knob
        return [_region(a, (y - 1.3 * r, y + 1.3 * r), (x - 1.3 * r, x + 1.3 * r))]
    if name == "mediastinal_widening":
        return [_region(a, (a.top - 0.02 * S, a.heart_box[1]), (a.cx - 0.1 * S, a.cx + 0.1 * S))]
    if name in ("scoliosis", "degenerative_spine"):
        sx = a.spine_x[int(a.top):int(np.nanmax(a.bottom))]
        return [_region(a, (a.top, np.nanmax(a.bottom)), (sx.min() - 0.05 * S, sx.max() + 0.05 * S))]
    return []


DRAW = {
    "pleural_effusion": L.pleural_effusion, "pneumothorax": L.pneumothorax, "edema": L.edema,
    "consolidation": L.airspace, "pneumonia": L.airspace, "opacity": L.airspace, "atelectasis": L.atelectasis,
    "nodule": L.nodule, "interstitial": L.interstitial, "vascular_prominence": L.vascular_prominence,
    "scarring": L.scarring, "pleural_thickening": L.pleural_thickening, "cardiomegaly": L.cardiomegaly,
    "central_line": central_line, "tube": tube, "pacemaker": pacemaker, "sternotomy": sternotomy,
    "surgical_clips": surgical_clips, "fracture": fracture, "calcified_nodes": calcified_nodes,
    "aortic_calcification": aortic_calcification, "hiatal_hernia": hiatal_hernia,
    "hyperinflation": global_finding, "hypoinflation": global_finding, "elevated_hemidiaphragm": global_finding,
    "tortuous_aorta": global_finding, "mediastinal_widening": global_finding, "scoliosis": global_finding,
    "degenerative_spine": global_finding,
}
