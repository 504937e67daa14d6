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
import functools
import hashlib
import logging
import math
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
from medclr.inference.heatmap import MIN_MAP_RANGE, SMOOTH_SIGMA, has_localised_signal, map_range
from medclr.inference.overlay import overlay
from medclr.io import MAX_PIXELS, read_image, read_radiograph
from medclr.io.codes import code_string
from medclr.io.dicom import held_back

log = logging.getLogger("medclr.app")

# DICOM code strings (VR CS: Modality, ViewPosition, PhotometricInterpretation) hold upper-case
# letters, digits, space and underscore, at most 16 characters. A header value outside that grammar
# is not shown (``medclr.io.codes.code_string``, the rule inspect and score follow too): the facts line is
# Markdown, and a crafted value ("CR <img src=...>", "[x](http://...)") would otherwise become markup in the page.


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
    return code_string(value).replace("_", "\\_")  # "_" is the one Markdown character a code string may hold

ACCEPTED = "a DICOM (.dcm), PNG or JPEG chest radiograph"

# Input caps for every text and number an endpoint takes (docs/app.md, "Input limits"). A report
# sentence or a finding is far shorter than 1,000 characters; the text encoder reads at most its
# position limit of tokens anyway, so a longer input only costs time and memory (and log space).
MAX_TEXT_CHARS = 1_000
MAX_RESULTS = 24  # k of the retrieval endpoints: 1..MAX_RESULTS (the page's slider has the same range)
SCALES = ("absolute", "relative")

# Retrieval captions (docs/app.md, "Similar studies"): a hit's score is shown relative to the query's
# SCORE_POOL best-scoring indexed images, not as a raw cosine (every chest film is ~0.99 like every other).
SCORE_POOL = 100
# image -> image: extra candidates searched so that dropping the query's own study still leaves k hits
OWN_STUDY_MARGIN = 16
# a hit is the uploaded image itself when its embedding is this close (1 - cosine) ...
SAME_EMBEDDING = 1e-6
# ... or when its file has the upload's content key. Only hits this close are hashed (hashing is for cost;
# the key decides): a byte-identical image differs only by float noise (another device, batch size), and
# 1 - cosine ~ (relative error)^2 / 2 stays under 1e-3 up to a 4 % relative error of the embedding.
SAME_IMAGE_HASHED = 1e-3
CAPTION_SENTENCES = 2  # finding sentences a caption shows


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
                 display_side: int = 768, cache_size: int = 8, smoothing: float = SMOOTH_SIGMA) -> None:
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
        key = sha1_of_file(p)
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
                image, header = read_radiograph(p, max_pixels=self.max_pixels)  # one read: size guard, pixels, header
            for w in caught:
                if not held_back(str(w.message)):  # pydicom's echo of a crafted header value: never logged
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
    def zero_shot(self, path: str | None) -> tuple[dict[str, float], list[list[Any]], str]:
        """({class: probability} of the findings the model reads, rows [class, probability %, operating point %,
        validation AUC, note, positive prompt, negative prompt], the notice: Markdown text, no HTML).

        The notice says, per finding the model reads, whether its probability is at or above the finding's operating
        point and what that means; then, each as a quoted line (the page greys them), the findings it does not read
        with the one-sentence reason and no probability. A checkpoint that records no validation is shown with its
        raw scores under a visible "not validated" notice. Percentages are whole numbers everywhere, as the labels
        show them."""
        from medclr.findings import operating_probability

        up = self.upload(path)
        details = self.engine.zero_shot_details(up.encoded)
        record = self.engine.findings_record
        shown = [d for d in details if math.isfinite(d["probability"])]
        probs = {d["class"]: round(d["probability"], 4) for d in shown}
        rows = []
        for d in details:
            op = operating_probability(record, d["class"])
            rows.append([d["class"], _percent(d["probability"]), _percent(op),
                         None if d["validation_auc"] is None else round(d["validation_auc"], 2), d["note"] or "",
                         " | ".join(d["positive_prompts"]), " | ".join(d["negative_prompts"])])
        return probs, rows, findings_notice(details, record)

    def ground(self, path: str | None, phrase: str | None, scale: str = "relative") -> tuple[np.ndarray, str]:
        """(the film at display size with R/L markers, a one-line legend; where a map is drawn, the overlay with its
        colour bar under it). The map is drawn only where the phrase's reading allows it (``medclr.app.grounding``:
        no map for a denial, for a phrase the model does not say holds, or for a side or size it does not prefer;
        the legend then says why in one sentence) and the map is not flat."""
        from medclr.app.grounding import judge
        from medclr.app.phrases import read_phrase

        phrase = check_text(phrase, "phrase", "please type a phrase to ground, e.g. 'small left pleural effusion'")
        scale = "relative" if scale is None else scale
        if scale not in SCALES:
            raise MedclrError("the colour scale must be 'absolute' or 'relative'")
        up = self.upload(path)
        film = render.mark_sides(render.to_uint8(up.display), up.header.get("view"))
        reading = read_phrase(phrase)
        verdict = judge(self.engine, up.encoded, reading)
        if not verdict.draw:
            return film, verdict.sentence
        quoted = f"“{reading.phrase}”"
        heat, grid = self.engine.heatmap(up.encoded, phrase, sigma=self.smoothing, size=up.display.shape)
        if not has_localised_signal(grid):
            return film, (
                f"No heatmap for {quoted}: {verdict.sentence}, but its region scores span only {map_range(grid):.3f} "
                f"(a localised match spans at least {MIN_MAP_RANGE:.2f}): no localised signal, so no map.")
        img, info = overlay(up.display, heat, scale=scale)
        img = render.with_colour_bar(render.mark_sides(img, up.header.get("view")), info, scale)
        return img, f"Map of {quoted}: {verdict.sentence}. " + colours_sentence(info, scale)

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

    def _gallery(self, pool: list[dict[str, Any]], k: int) -> list[tuple[np.ndarray, str]]:
        """(thumbnail, caption) of the first k hits of ``pool`` (the query's best-scoring indexed images, best
        first); captions read "#rank · z SD · report N · finding sentences" (:func:`relative_scores`,
        :func:`findings_caption`; N is the manifest index the sentence inspector opens)."""
        z = relative_scores([h["score"] for h in pool])
        return [(self._thumb(str(h["image_path"])),
                 f"#{rank} · {z[rank - 1]:+.2f} SD · report {int(h['manifest_index'])} · "
                 f"{findings_caption(str(h.get('report', '')))}")
                for rank, h in enumerate(pool[:k], 1)]

    @staticmethod
    def _is_query_image(up: Upload, hit: dict[str, Any]) -> bool:
        """Whether an image hit is the uploaded image itself: the same embedding (1 - cosine <=
        SAME_EMBEDDING: the same pixels, whatever the file format), or, among the hits within
        SAME_IMAGE_HASHED, the same file content (the upload's key, :func:`file_key`)."""
        gap = 1.0 - float(hit["score"])
        if gap <= SAME_EMBEDDING:
            return True
        return gap <= SAME_IMAGE_HASHED and file_key(str(hit["image_path"])) == up.key

    def _image_pool(self, path: str | None) -> list[dict[str, Any]]:
        """The upload's SCORE_POOL most similar indexed images, best first, never its own study
        (:func:`drop_query_study`)."""
        index = self._need_index()
        up = self.upload(path)
        query = up.encoded.features.global_emb.float().cpu().numpy()
        want, total = max(MAX_RESULTS, SCORE_POOL), index.images.ntotal
        n = min(total, want + OWN_STUDY_MARGIN)
        while True:
            hits = drop_query_study(index.search_images(query, n)[0], lambda h: self._is_query_image(up, h))
            if len(hits) >= want or n >= total:
                break
            n = min(total, 2 * n)  # a study with more images than the margin: search wider
        return hits[:want]

    def _text_pool(self, text: str) -> list[dict[str, Any]]:
        """The text's best-scoring indexed images, best first, ranked once whatever k the page asks for: the head
        re-ranks the faiss candidates the largest k gets (``rerank_pool(MAX_RESULTS)``), and the best SCORE_POOL
        put the captions' scores on a relative scale. A pool sized by k re-ranked other candidates for each k, so
        the list for k = 8 was not the first 8 of k = 24 (issue 45)."""
        from medclr.index.store import rerank_pool

        index = self._need_index()
        return index.search_images_by_text(self.engine.embed_texts([text]), max(MAX_RESULTS, SCORE_POOL),
                                           pool=rerank_pool(MAX_RESULTS, index.images.ntotal))[0]

    def retrieve_by_image(self, path: str | None, k: int = 8) -> list[tuple[np.ndarray, str]]:
        """The k indexed studies most like the upload, never the upload's own study (:func:`drop_query_study`)."""
        self._need_index()
        k = _k(k)
        return self._gallery(self._image_pool(path), k)

    def retrieve_by_text(self, text: str | None, k: int = 8) -> list[tuple[np.ndarray, str]]:
        """The k indexed images the checkpoint's head ranks best for the text (:meth:`_text_pool`)."""
        self._need_index()
        text = check_text(text, "description", "please type a description to search for, e.g. 'right pneumothorax'")
        k = _k(k)
        return self._gallery(self._text_pool(text), k)

    def similar_studies(self, path: str | None, k: int = 8) -> tuple[list[tuple[np.ndarray, str]], str]:
        """(:meth:`retrieve_by_image`'s gallery, :func:`retrieval_note` on what these results cannot show)."""
        self._need_index()
        k = _k(k)
        pool = self._image_pool(path)
        return self._gallery(pool, k), retrieval_note(self.engine.findings_record, (), pool[:k])

    def images_for_text(self, text: str | None, k: int = 8) -> tuple[list[tuple[np.ndarray, str]], str]:
        """(:meth:`retrieve_by_text`'s gallery, :func:`retrieval_note`: the same grey line as the findings box for
        a finding the text names that the model does not read, and which results report one)."""
        from medclr.app.phrases import read_phrase

        self._need_index()
        text = check_text(text, "description", "please type a description to search for, e.g. 'right pneumothorax'")
        k = _k(k)
        pool = self._text_pool(text)
        return self._gallery(pool, k), retrieval_note(self.engine.findings_record, read_phrase(text).named, pool[:k])

    def report_sentences(self, manifest_index: int) -> list[str]:
        """The indexed sentences of one report (manifest index), in the order the report states them."""
        index = self._need_index()
        m = int(manifest_index)
        t = index.sentence_table
        found = [s for s, ms in zip(t["sentence"], t["manifest_index"]) if m in set(int(x) for x in ms)]
        reports = index.image_table.loc[index.image_table["manifest_index"] == m, "report"]
        text = " ".join(str(reports.iloc[0]).split()) if len(reports) else ""
        at = {s: text.find(s) for s in found}
        return sorted(found, key=lambda s: (at[s] < 0, at[s]))  # one not found verbatim goes last

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

    def study_table(self, manifest_index: int) -> tuple[list[str], list[list[Any]]]:
        """(columns, rows) of one report's own sentences in report order (:meth:`report_sentences`):
        sentence, eta_LM, and zeta_txt only when the checkpoint has NUCLR's table (the sentence's own zeta_txt
        for a sentence-keyed run, else the report's). Numbers to 3 significant digits; None = not recorded."""
        stats = self.engine.stats
        sentences = self.report_sentences(manifest_index)
        columns = ["sentence", "eta_LM"] + (["zeta_txt"] if stats.has_zeta else [])
        report_zeta = (stats.zeta(int(manifest_index)) or {}).get("txt") if stats.has_zeta else None
        rows = []
        for s in sentences:
            row = [s, significant(stats.eta(s) if stats.has_eta else None)]
            if stats.has_zeta:
                own = stats.sentence_zeta(s)
                row.append(significant(report_zeta if own is None else own))
            rows.append(row)
        return columns, rows


def _percent(p: float | None) -> int | None:
    """A probability as the whole number of percent the page shows (:func:`medclr.app.grounding.percent`)."""
    return None if p is None or not math.isfinite(p) else round(100 * p)


OPERATING_POINT = ("Operating point: the probability at which this model best separated the validation films with "
                   "the finding from those without (Youden's J). At or above it the model calls the finding present; "
                   "below it, absent.")


def findings_notice(details: list[dict[str, Any]], record=None) -> str:
    """The text under the labels (Markdown, no HTML: API clients read it as it is): each read finding's probability
    against its operating point, then each finding the model does not read as a quoted line with its reason (the
    page greys quoted lines); or the "not validated" notice once when the checkpoint records no validation."""
    from medclr.app.grounding import percent
    from medclr.findings import NOT_VALIDATED, operating_probability

    if any(d["note"] == NOT_VALIDATED for d in details):
        return f"⚠ **Not validated.** {NOT_VALIDATED[0].upper()}{NOT_VALIDATED[1:]}."
    lines = []
    for d in details:
        op = operating_probability(record, d["class"]) if math.isfinite(d["probability"]) else None
        if op is not None:
            above = d["probability"] >= op
            lines.append(f"- {d['class']} {percent(d['probability'])}: {'at or above' if above else 'below'} its "
                         f"operating point of {percent(op)}, {'called present' if above else 'not called'}")
    out = [OPERATING_POINT + "\n\n" + "\n".join(lines)] if lines else []
    out += [f"> {d['class']}: {d['note'] or ''}." for d in details if not math.isfinite(d["probability"])]
    return "\n\n".join(out)


def colours_sentence(info: dict[str, Any], scale: str) -> str:
    """The legend's account of the map's colours, contours and markers."""
    if scale == "relative":
        what = (f"Colours show where on this image the phrase matches best, blue low to red high over this map's own "
                f"cosine range [{info['lo']:.3f}, {info['hi']:.3f}]; contours at 25%, 50% and 75% of that range")
    else:
        what = (f"Colours show the cosine of each region with the phrase from -1 (blue) to +1 (red); this map spans "
                f"[{info['min']:.3f}, {info['max']:.3f}]; contours at 0.25, 0.50 and 0.75")
    return (what + " (white, gold, black: the bar under the image names them); no colour outside the model's centre "
            "crop. R and L mark the patient's right and left.")


def retrieval_note(record, named: tuple[str, ...], hits: list[dict[str, Any]]) -> str:
    """What a retrieval result cannot show (Markdown, quoted lines the page greys):

    * a finding the query names that the model does not read: the findings box's own sentence for it, and that
      the ranking does not follow it;
    * the findings the results' reports state (``medclr.data.labeller``) that the model does not read, with the
      ranks that report them: their likeness to the query says nothing about those;
    * a checkpoint without a validation record: the "not validated" line once.
    Empty when there is nothing to say."""
    from medclr.data.labels import CHEX5
    from medclr.findings import NOT_VALIDATED, unread_reason

    if record is None:
        return f"> {NOT_VALIDATED[0].upper()}{NOT_VALIDATED[1:]}, so what these results can show is unknown."
    unread = [c for c in CHEX5 if unread_reason(record, c) is not None]
    lines = [f"> {c}: {unread_reason(record, c)}. These results are not ranked by {c.lower()}."
             for c in named if c in unread]
    for c in unread:
        ranks = [str(rank) for rank, h in enumerate(hits, 1) if c in report_findings(str(h.get("report", "")))]
        if ranks:
            lines.append(f"> {'Result' if len(ranks) == 1 else 'Results'} #{', #'.join(ranks)} "
                         f"{'reports' if len(ranks) == 1 else 'report'} {c.lower()}, a finding this model does not "
                         "read: its likeness to the query says nothing about it.")
    if not named and unread:  # an image query, or a text naming none: what the likeness leaves out
        lines.insert(0, f"> This model does not read {_and(c.lower() for c in unread)}: these results are alike in "
                        "what it reads, not in those.")
    return "\n\n".join(lines)


def _and(words) -> str:
    words = list(words)
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


@functools.lru_cache(maxsize=4096)
def report_findings(report: str) -> frozenset[str]:
    """The CheX5 findings a report states, read by medclr's rule labeller (``medclr.data.labeller.label_report``)
    from its findings and impression sentences."""
    from medclr.data.labeller import label_report
    from medclr.data.text import extract_sections, report_text, split_sentences

    labels = label_report(split_sentences(report_text(extract_sections(report))))
    return frozenset(c for c, v in labels.items() if v == 1.0)


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


def drop_query_study(hits: list[dict[str, Any]], is_query_image) -> list[dict[str, Any]]:
    """The hits of an image -> image search without the query's own study, in their order.

    Why: an uploaded image that is itself in the index comes back as its own first hit (cosine 1), and the
    other images of its study (the lateral of a PA) follow it; neither is a *similar* study, and a clinician
    comparing a case with the archive would read them as independent agreement. A hit is the query's image
    when ``is_query_image(hit)`` (``AppService._is_query_image``: same embedding or same file content); every
    hit of the study of such an image (same ``study_id``) goes too."""
    own = [bool(is_query_image(h)) for h in hits]
    studies = {_study_id(h) for h, q in zip(hits, own) if q} - {None}
    return [h for h, q in zip(hits, own) if not q and (_study_id(h) is None or _study_id(h) not in studies)]


def _study_id(hit: dict[str, Any]) -> str | None:
    """A hit's study_id, None when the manifest had none (the index stores it as text: "", "nan", "None")."""
    value = str(hit.get("study_id", "")).strip()
    return None if value in ("", "nan", "None", "<NA>") else value


def relative_scores(scores) -> np.ndarray:
    """Each score as a standard score over the pool it came from: (score - mean) / SD, the pool being the
    query's best-scoring indexed images (SCORE_POOL, the whole index when smaller; the query's own study
    left out). Raw cosines do not discriminate (every chest film is ~0.99 like every other; 1.000, 0.999);
    this says how far a hit stands out from its neighbours, on the same scale for every query. A pool of
    fewer than 2, or with no spread beyond float32 noise, gives 0."""
    s = np.asarray(scores, dtype=np.float64)
    sd = float(s.std()) if len(s) > 1 else 0.0
    if not sd > 1e-6:
        return np.zeros(len(s))
    return (s - s.mean()) / sd


@functools.lru_cache(maxsize=4096)
def findings_caption(report: str, limit: int = CAPTION_SENTENCES, max_chars: int = 300) -> str:
    """What a retrieval caption shows of a hit's report: its first ``limit`` sentences that state a finding
    (``medclr.data.hard_negatives.states_finding``, the rule behind ``data.sentence_sampling: findings``),
    else its first sentence; both from the report's findings and impression (``medclr.data.text``, as the
    manifest's sentences are made), never its header ("FINAL REPORT", "EXAMINATION: ...")."""
    from medclr.data.hard_negatives import states_finding
    from medclr.data.text import extract_sections, report_text, split_sentences

    sentences = split_sentences(report_text(extract_sections(report)))
    stated = [s for s in sentences if states_finding(s)]
    text = " ".join(stated[:limit] if stated else sentences[:1])
    return text if len(text) <= max_chars else text[: max_chars - 1].rstrip() + "…"


def file_key(path: str) -> str | None:
    """The content key of an indexed image file, as an upload's (``Upload.key``: SHA-1 of the file's bytes);
    None for a file that cannot be read. Cached by path, size and modification time."""
    try:
        st = Path(path).stat()
        return _file_sha1(str(path), st.st_size, st.st_mtime_ns)
    except OSError:
        return None


@functools.lru_cache(maxsize=4096)
def _file_sha1(path: str, size: int, mtime_ns: int) -> str:
    return sha1_of_file(path)


def sha1_of_file(path: str | Path) -> str:
    """SHA-1 of a file's bytes: an upload's cache key, and how an indexed film is recognised as the upload."""
    h = hashlib.sha1()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def significant(value: float | None, digits: int = 3) -> float | None:
    """``value`` rounded to ``digits`` significant digits (for display); None stays None."""
    if value is None or not math.isfinite(float(value)):
        return None
    return float(f"{float(value):.{digits}g}")


def model_line(engine) -> str:
    """The first screen's line naming the model served: a shipped model by its name, a trained checkpoint by its
    folder's name (never the whole path, which may name a person), its training steps, and which CheX5 findings its
    validation record says it reads."""
    from medclr import pretrained

    folder = engine.checkpoint_dir
    meta = engine.meta
    if folder is None:
        what = "an unsaved model"
    elif (folder / pretrained.MODEL_JSON).is_file():
        what = f"the shipped model **{folder.name}**"
    else:
        what = f"the checkpoint **{folder.name}**"
    steps = f", {meta.step:,} training steps" if meta is not None and meta.step else ""
    record = (meta.findings or {}).get("classes") if meta is not None else None
    if not record:
        reads = "; its findings are not validated"
    else:
        read = [name for name, entry in record.items() if entry.get("reads")]
        reads = f"; reads {len(read)} of {len(record)} findings on its validation split" + (
            f" ({', '.join(read)})" if read else "")
    return f"Serving {what}{steps}{reads}."
