"""What the app does, without the web layer: each method takes plain values and returns plain values,
and bad input raises ``MedclrError`` with one message fit to show a clinician.

Uploads are read with ``medclr.io`` (DICOM through the standard display pipeline, MONOCHROME1
inverted; PNG/JPEG), under a pixel limit. Only ``read_header``'s safe fields (view, size, photometric)
are shown or logged: never names, ids or dates from the DICOM header, and never the uploaded file's
name (it may hold a patient's name): messages say "the uploaded file" instead.

An upload in the app's private temporary folder (``medclr.app.tempdir``; the web app sets ``discard_uploads``) is
deleted as soon as it has been read, whether it could be read or not: what is kept is the decoded,
encoded image in memory (the ``cache_size`` most recent uploads), found again by the upload's path
when the page asks for the heatmap or similar studies of the same upload.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import threading
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from medclr.app import render, tempdir
from medclr.errors import MedclrError
from medclr.inference.engine import MIN_MAP_RANGE, has_localised_signal, map_range
from medclr.io import MAX_PIXELS, read_header, read_image

log = logging.getLogger("medclr.app")

# DICOM code strings (VR CS: Modality, ViewPosition, PhotometricInterpretation) hold upper-case
# letters, digits, space and underscore, at most 16 characters. A header value outside that grammar
# is not shown: the facts line is Markdown, and a crafted value ("CR <img src=...>", "[x](http://...)")
# would otherwise become markup in the page.
_CODE_STRING = re.compile(r"[A-Z0-9 _]{1,16}")


# a file-system path inside a third-party log message (pydicom names the file it repairs)
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[/\\][^\s'\"/\\]+)+")


def _scrub(text: str) -> str:
    return _PATH.sub("the uploaded file", text)


class _ScrubFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = _scrub(record.getMessage()), None
        return True


@contextlib.contextmanager
def _scrubbed_paths():
    """pydicom's own log lines, with any file path replaced, while an upload is read."""
    logger, flt = logging.getLogger("pydicom"), _ScrubFilter()
    logger.addFilter(flt)
    try:
        yield
    finally:
        logger.removeFilter(flt)


def _code_string(value: object) -> str:
    text = str(value or "").strip()
    return text.replace("_", "\\_") if _CODE_STRING.fullmatch(text) else ""

ACCEPTED = "a DICOM (.dcm), PNG or JPEG chest radiograph"

# Input caps for every text and number an endpoint takes (docs/app.md, "Input limits"). A report
# sentence or a finding is far shorter than 1,000 characters; the text encoder reads at most its
# position limit of tokens anyway, so a longer input only costs time and memory (and log space).
MAX_TEXT_CHARS = 1_000
MAX_RESULTS = 24  # k of the retrieval endpoints: 1..MAX_RESULTS (the page's slider has the same range)
SCALES = ("absolute", "relative")


def check_text(text: object, noun: str, empty: str) -> str:
    """A non-empty text of at most MAX_TEXT_CHARS characters, else one clear line (``empty`` when blank)."""
    if text is None or not str(text).strip():
        raise MedclrError(empty)
    text = str(text)
    if len(text) > MAX_TEXT_CHARS:
        raise MedclrError(f"the {noun} is {len(text):,} characters long, over the limit of {MAX_TEXT_CHARS:,}; "
                          "please shorten it")
    return text


@dataclass
class Upload:
    key: str
    header: dict[str, Any]
    encoded: Any  # medclr.inference.EncodedImage
    display: np.ndarray  # float32 display copy


class LRU(OrderedDict):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def put(self, key, value) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)

    def fetch(self, key):
        if key in self:
            self.move_to_end(key)
            return self[key]
        return None


class AppService:
    def __init__(self, engine, index=None, max_pixels: int = MAX_PIXELS, max_upload_bytes: int = 64 << 20,
                 display_side: int = 768, cache_size: int = 8, smoothing: float = 1.5) -> None:
        self.engine, self.index = engine, index
        self.max_pixels, self.max_upload_bytes = max_pixels, max_upload_bytes
        self.display_side, self.smoothing = display_side, smoothing
        self._uploads: LRU = LRU(cache_size)
        self._thumbs: LRU = LRU(256)
        # upload path -> ("key", content key) or ("error", message), for uploads already read and deleted
        self._read: LRU = LRU(1024)
        self._lock = threading.Lock()
        self._reading = threading.Lock()
        # the web app sets this: uploads in its private temp folder (app.tempdir) are deleted once read
        self.discard_uploads = False

    # -- uploads --------------------------------------------------------------------------------------
    @staticmethod
    def _clean(msg: str, path: str) -> str:
        return msg.replace(str(path), "the uploaded file")

    def upload(self, path: str | None) -> Upload:
        """Read, check, preprocess and encode an uploaded file once (cached by content); with
        ``discard_uploads``, an upload in the app's private temp folder is deleted once read."""
        if path is None or not str(path).strip():
            raise MedclrError(f"no image uploaded: please upload {ACCEPTED}")
        p = Path(str(path))
        consume = self.discard_uploads and tempdir.is_upload(p)
        with self._reading:  # one read per upload: a second request for it waits, then finds it in memory
            try:
                if consume and not p.is_file():
                    return self._already_read(str(p))
                try:
                    up = self._read_upload(p)
                except MedclrError as exc:
                    if consume:
                        with self._lock:
                            self._read.put(str(p), ("error", str(exc)))
                    raise
                if consume:
                    with self._lock:
                        self._read.put(str(p), ("key", up.key))
                return up
            finally:
                if consume:
                    tempdir.discard_upload(p)

    def _already_read(self, path: str) -> Upload:
        with self._lock:
            seen = self._read.fetch(path)
            hit = self._uploads.fetch(seen[1]) if seen and seen[0] == "key" else None
        if seen and seen[0] == "error":
            raise MedclrError(seen[1])
        if hit is None:
            raise MedclrError(f"the uploaded file is no longer available; please upload it again ({ACCEPTED})")
        return hit

    def _read_upload(self, p: Path) -> Upload:
        if not p.is_file():
            raise MedclrError(f"the uploaded file is no longer available; please upload it again ({ACCEPTED})")
        size = p.stat().st_size
        if size == 0:
            raise MedclrError(f"the uploaded file is empty; please upload {ACCEPTED}")
        if size > self.max_upload_bytes:
            raise MedclrError(f"the uploaded file is {size / 2**20:.0f} MB, over the {self.max_upload_bytes / 2**20:.0f} MB "
                              "limit")
        h = hashlib.sha1()
        with open(p, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
        key = h.hexdigest()
        with self._lock:
            hit = self._uploads.fetch(key)
        if hit is not None:
            return hit
        start = time.perf_counter()
        try:
            with warnings.catch_warnings(record=True) as caught, _scrubbed_paths():
                # readers warn with the file's path (multi-frame, pydicom's repairs): the uploaded file's
                # name can hold a patient's name, so warnings are logged here with the name removed
                warnings.simplefilter("always")
                image = read_image(p, max_pixels=self.max_pixels)  # size guard first, then the header
                header = read_header(p)
            for w in caught:
                log.warning("upload: %s", _scrub(self._clean(str(w.message), str(p))))
        except MedclrError as exc:
            log.info("upload refused: %s", self._clean(str(exc), str(p)))
            raise MedclrError(f"{self._clean(str(exc), str(p))}. Please upload {ACCEPTED}.") from None
        except Exception as exc:  # noqa: BLE001 - never a stack trace for a bad file
            log.warning("upload unreadable (%s)", type(exc).__name__)
            raise MedclrError(f"the uploaded file could not be read as an image ({type(exc).__name__}); "
                              f"please upload {ACCEPTED}") from None
        encoded = self.engine.encode(image)
        up = Upload(key, header, encoded, render.display_copy(image, self.display_side))
        log.info("upload: %s %dx%d %s, read+encoded in %.2f s", header.get("format"), header.get("columns"),
                 header.get("rows"), header.get("photometric") or "", time.perf_counter() - start)
        with self._lock:
            self._uploads.put(key, up)
        return up

    def preview(self, path: str | None) -> tuple[np.ndarray, str]:
        up = self.upload(path)
        hd = up.header
        facts = [f"{hd.get('columns')} x {hd.get('rows')} px", str(hd.get("format", "")).upper()]
        for key, label in (("modality", "modality"), ("view", "view"), ("photometric", "photometric")):
            if _code_string(hd.get(key)):
                facts.append(f"{label} {_code_string(hd[key])}")
        if hd.get("pixel_spacing_mm"):
            facts.append("spacing {:.3f} x {:.3f} mm".format(*hd["pixel_spacing_mm"]))
        if hd.get("caution"):
            facts.append(f"⚠ {hd['caution']}")
        return render.to_uint8(up.display), " · ".join(facts)

    # -- findings -------------------------------------------------------------------------------------
    def zero_shot(self, path: str | None) -> tuple[dict[str, float], list[list[Any]]]:
        """({class: probability}, rows [class, probability, positive prompt, negative prompt])."""
        up = self.upload(path)
        details = self.engine.zero_shot_details(up.encoded)
        probs = {d["class"]: round(d["probability"], 4) for d in details}
        rows = [[d["class"], round(d["probability"], 4), " | ".join(d["positive_prompts"]),
                 " | ".join(d["negative_prompts"])] for d in details]
        return probs, rows

    def ground(self, path: str | None, phrase: str | None, scale: str = "absolute") -> tuple[np.ndarray, str]:
        """(overlay H x W x 3 uint8 at display size, a one-line legend)."""
        phrase = check_text(phrase, "phrase", "please type a phrase to ground, e.g. 'small left pleural effusion'")
        scale = "absolute" if scale is None else scale
        if scale not in SCALES:
            raise MedclrError("the colour scale must be 'absolute' or 'relative'")
        up = self.upload(path)
        grid = self.engine.ground_grid(up.encoded, phrase, sigma=self.smoothing)
        if not has_localised_signal(grid):
            return render.to_uint8(up.display), (
                f"The model shows no localised signal for this phrase: its region scores span only "
                f"{map_range(grid):.3f} (a localised match spans at least {MIN_MAP_RANGE:.2f}), so no heatmap is drawn.")
        geo = up.encoded.geometry.resized(*up.display.shape)
        heat = geo.to_original(grid, "bilinear")
        img, info = render.overlay(up.display, heat, scale=scale)
        legend = (f"cosine similarity in [{info['min']:.3f}, {info['max']:.3f}]; colours span "
                  f"[{info['lo']:.3f}, {info['hi']:.3f}] (blue low, red high); contours at "
                  + ", ".join(f"{v:.3f}" for v in info["levels"]) + "; outside the model's centre crop: no colour")
        return img, legend

    # -- retrieval ------------------------------------------------------------------------------------
    def _need_index(self):
        if self.index is None:
            raise MedclrError("no retrieval index is loaded: start the app with --index DIR "
                              "(build one with `medclr index build`)")
        return self.index

    def _thumb(self, image_path: str) -> np.ndarray:
        hit = self._thumbs.fetch(image_path)
        if hit is None:
            try:
                hit = render.thumbnail(read_image(image_path, max_pixels=self.max_pixels))
            except Exception:  # noqa: BLE001 - a moved or damaged archive file: show a placeholder
                hit = render.placeholder()
            with self._lock:
                self._thumbs.put(image_path, hit)
        return hit

    def _gallery(self, hits: list[dict[str, Any]]) -> list[tuple[np.ndarray, str]]:
        out = []
        for h in hits:
            report = " ".join(str(h.get("report", "")).split())
            caption = f"{h['score']:.3f} · #{int(h['manifest_index'])} · {report[:300]}"
            out.append((self._thumb(str(h["image_path"])), caption))
        return out

    def retrieve_by_image(self, path: str | None, k: int = 8) -> list[tuple[np.ndarray, str]]:
        index = self._need_index()
        k = _k(k)
        up = self.upload(path)
        query = up.encoded.features.global_emb.float().cpu().numpy()
        return self._gallery(index.search_images(query, k)[0])

    def retrieve_by_text(self, text: str | None, k: int = 8) -> list[tuple[np.ndarray, str]]:
        index = self._need_index()
        text = check_text(text, "description", "please type a description to search for, e.g. 'right pneumothorax'")
        k = _k(k)
        # ranked (and scored) by the checkpoint's head: LSE+NL re-ranks faiss's global-cosine candidates
        return self._gallery(index.search_images_by_text(self.engine.embed_texts([text]), k)[0])

    def report_sentences(self, manifest_index: int) -> list[str]:
        index = self._need_index()
        t = index.sentence_table
        return [s for s, m in zip(t["sentence"], t["manifest_index"]) if int(manifest_index) in set(m)]

    # -- inspector ------------------------------------------------------------------------------------
    def inspect(self, sentence: str | None) -> dict[str, Any]:
        """eta_LM of a report sentence, its NUCLR popularity zeta_txt (sentence-keyed runs) and the zeta of the
        reports that hold it."""
        s = " ".join(check_text(sentence, "sentence", "please type or pick a report sentence to inspect").split())
        stats = self.engine.stats
        out: dict[str, Any] = {"sentence": s}
        out["eta_LM"] = stats.eta(s) if stats.has_eta else None
        if not stats.has_eta:
            out["eta_note"] = "this checkpoint records no eta table (trained without eta_LM)"
        elif out["eta_LM"] is None:
            out["eta_note"] = "sentence not in the checkpoint's eta table"
        reports = []
        if self.index is not None:
            from medclr.data.text import sentence_hash

            t = self.index.sentence_table
            row = t[t["hash"] == sentence_hash(s)]
            mids = sorted(set(int(m) for m in row["manifest_index"].iloc[0])) if len(row) else []
            for m in mids[:20]:
                z = stats.zeta(m) if stats.has_zeta else None
                reports.append({"manifest_index": m, "zeta_txt": None if z is None else z.get("txt"),
                                "zeta_img": None if z is None else z.get("img")})
            out["reports_with_sentence"] = len(mids)
            near = self.index.search_sentences(self.engine.embed_texts([s]), 6)[0]
            out["nearest_sentences"] = [{"sentence": h["sentence"], "cosine": round(h["score"], 4),
                                         "eta_LM": stats.eta(h["sentence"]) if stats.has_eta else None}
                                        for h in near if h["sentence"] != s][:5]
        out["zeta"] = reports
        if stats.has_zeta:
            out["zeta_txt_sentence"] = stats.sentence_zeta(s)  # None unless the run keyed zeta_txt by sentence
        else:
            out["zeta_note"] = "this checkpoint has no NUCLR popularity table (loss_state.safetensors without zeta)"
        return out


def _k(k) -> int:
    """The number of results: a whole number 1..MAX_RESULTS, else one clear line."""
    msg = f"the number of results must be a whole number from 1 to {MAX_RESULTS}"
    if isinstance(k, bool):
        raise MedclrError(msg)
    try:
        value = float(k)
    except (TypeError, ValueError, OverflowError):
        raise MedclrError(msg) from None
    if not (value.is_integer() and 1 <= value <= MAX_RESULTS):
        raise MedclrError(msg)
    return int(value)
