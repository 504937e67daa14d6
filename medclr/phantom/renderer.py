"""One phantom radiograph: anatomy + findings -> density -> acquisition -> 8-bit image and boxes.

Random streams are separate per purpose (anatomy, acquisition, geometry, each
finding), all derived from (seed, study number), so leaving a finding out
changes nothing else in the image: that is how the tests check that a box sits
on its lesion.
"""

from __future__ import annotations

import numpy as np
from PIL import Image
from scipy.ndimage import gaussian_filter

from medclr.phantom import draw
from medclr.phantom.anatomy import build_anatomy
from medclr.phantom.devices import DRAW
from medclr.phantom.lesions import Canvas, geometry

AIR = 0.58  # lung air attenuation (density units per unit air depth)
VESSELS = 0.12
STREAMS = {"anatomy": 1, "acquisition": 2, "geometry": 3, "plan": 4, "finding": 100}


def stream(seed: int, k: int, name: str, i: int = 0) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(k), STREAMS[name] + int(i)]))


def sample_acquisition(rng: np.random.Generator, technical: bool = False) -> dict:
    wide = 1.8 if technical else 1.0
    return {
        "exposure": float(rng.uniform(0.95, 1.2) if not technical else rng.choice([0.75, 1.45]) * rng.uniform(0.95, 1.05)),
        "noise": float(rng.uniform(0.006, 0.016) * (2.5 if technical else 1.0)),
        "blur": float(rng.uniform(0.35, 0.8)),
        "rotation": float(np.clip(rng.normal(0, 1.5 * wide), -4 * wide, 4 * wide)),
        "shift_x": float(np.clip(rng.normal(0, 0.012), -0.035, 0.035)),
        "shift_y": float(np.clip(rng.normal(0, 0.012), -0.035, 0.035)),
        "scale": float(rng.uniform(0.97, 1.03)),
        "gamma": float(rng.uniform(0.9, 1.12)),
        "sharpen": float(rng.uniform(0.3, 0.8)),
    }


def compose_density(cv: Canvas) -> np.ndarray:
    L = cv.anat.layers
    air = L["air"] * np.clip(cv.air_scale, 0, 1.2) + cv.air_add
    d = L["body"] + L["media"] + L["heart"] + L["bone"] - AIR * air
    d += VESSELS * L["vessels"] * cv.vessel_scale + cv.extra + cv.metal
    return np.clip(d, 0, None).astype(np.float32)


def _affine(acq: dict, S: int):
    th = np.deg2rad(acq["rotation"])
    rot = np.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]]) / acq["scale"]
    centre = np.array([S / 2.0, S / 2.0])
    shift = np.array([acq["shift_y"], acq["shift_x"]]) * S
    offset = centre - rot @ centre - shift
    return rot, offset  # input (row, col) = rot @ output + offset


def warp(d: np.ndarray, rot, offset) -> np.ndarray:
    """Resample ``d`` so that output (row, col) shows input rot @ (row, col) + offset (edges replicated)."""
    S = d.shape[0]
    pad = int(0.12 * S) + 2
    dp = np.pad(d, pad, mode="edge")
    coeffs = (rot[1, 1], rot[1, 0], offset[1] + pad, rot[0, 1], rot[0, 0], offset[0] + pad)
    img = Image.fromarray(dp.astype(np.float32), mode="F").transform((S, S), Image.AFFINE, coeffs, Image.BILINEAR)
    return np.asarray(img, dtype=np.float32)


def mask_box(mask: np.ndarray, rot, offset, S: int) -> tuple[int, int, int, int] | None:
    """Box (x, y, w, h) of a mask after the acquisition transform, clipped to the image; None when empty."""
    rr, cc = np.nonzero(mask)
    if not len(rr):
        return None
    pts = np.stack([rr, cc], 1).astype(np.float64)
    corners = np.concatenate([pts + d for d in ([0, 0], [1, 0], [0, 1], [1, 1])])
    out = (np.linalg.inv(rot) @ (corners - offset).T).T
    y0, x0 = np.floor(out.min(0)).astype(int)
    y1, x1 = np.ceil(out.max(0)).astype(int)
    x0, y0, x1, y1 = max(0, x0), max(0, y0), min(S, x1), min(S, y1)
    if x1 - x0 < 1 or y1 - y0 < 1:
        return None
    return int(x0), int(y0), int(x1 - x0), int(y1 - y0)


def display(d: np.ndarray, acq: dict, rng: np.random.Generator, S: int) -> np.ndarray:
    u = S / 256.0
    v = 1.0 - np.exp(-acq["exposure"] * d)
    v = np.clip(v / 0.93, 0, 1) ** acq["gamma"]
    v = gaussian_filter(v, acq["blur"] * u)
    v = v + acq["sharpen"] * (v - draw.blur(v, 3.0 * u))
    noise = rng.standard_normal((S, S)).astype(np.float32)
    if u > 1.5:
        noise = gaussian_filter(noise, 0.5 * u) * np.sqrt(u)
    v = v + acq["noise"] * (0.6 + 0.8 * v) * noise
    return np.clip(v, 0, 1).astype(np.float32)


def render(material, spec: dict, size: int, drop: int | None = None, with_masks: bool = False,
           float_image: bool = False) -> dict:
    """Render study ``spec`` (from medclr.phantom.plan) at ``size`` px.

    Returns {"image": uint8 SxS, "boxes": [[(x, y, w, h), ...] per finding], "ctr": float,
    "acquisition": dict}; ``drop`` leaves finding number ``drop`` out (for tests); ``with_masks``
    also returns the lesion masks in image coordinates of the untransformed anatomy; ``float_image``
    also returns the display image before 8-bit quantisation (``image_float``, for 12-bit DICOM).
    """
    seed, k, S = spec["seed"], spec["k"], int(size)
    findings = [f for i, f in enumerate(spec["findings"]) if i != drop]
    rng_a = stream(seed, k, "anatomy")
    idx = int(rng_a.integers(len(material.lungs)))
    geo = geometry(findings, spec["view"], stream(seed, k, "geometry"))
    anat = build_anatomy(material.lungs[idx], float(material.lung_aspect[idx]), S, rng_a, geo)
    cv = Canvas.empty(anat)
    masks: list[list[np.ndarray]] = []
    for i, f in enumerate(spec["findings"]):
        fn = DRAW.get(f["name"])
        if i == drop or fn is None:
            masks.append([])
            continue
        rng_f = stream(seed, k, "finding", i)
        if f["name"] in ("consolidation", "pneumonia", "opacity"):
            ms = fn(cv, f, rng_f, material.boxes.get(f["name"]))
        elif f["name"] == "nodule":
            ms = fn(cv, f, rng_f, material.boxes)
        else:
            ms = fn(cv, f, rng_f)
        masks.append(ms)
    d = compose_density(cv)
    technical = any(f["name"] == "technical" for f in findings)
    rng_q = stream(seed, k, "acquisition")
    acq = sample_acquisition(rng_q, technical)
    rot, offset = _affine(acq, S)
    d = warp(d, rot, offset)
    image_f = display(d, acq, rng_q, S)
    image = (image_f * 255 + 0.5).astype(np.uint8)
    boxes = [[b for b in (mask_box(m, rot, offset, S) for m in ms) if b is not None] for ms in masks]
    out = {"image": image, "boxes": boxes, "ctr": anat.ctr, "acquisition": acq, "lung_mask": idx}
    if float_image:
        out["image_float"] = image_f
    if with_masks:
        out["masks"] = masks
        out["affine"] = (rot, offset)
    return out
