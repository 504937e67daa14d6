"""The Gradio Blocks page of the clinician app and its named API endpoints.

Endpoints (``gradio_client``: ``client.predict(..., api_name="/zero_shot")``):

* ``preview``  (file) -> (image as read, safe facts)
* ``zero_shot`` (file) -> ({class: calibrated probability} of the findings the model reads, table of class /
  probability % / operating point % / validation AUC / note / prompts used, a plain-text notice: each read
  finding against its operating point, then the findings it does not read and why)
* ``ground`` (file, phrase, scale="relative") -> (the film with R/L markers, and the map with its colour bar
  when one is drawn; legend). No map for a negated or normal phrase, a phrase the model does not say holds,
  or a side or size it does not prefer (``medclr.app.grounding``)
* ``retrieve_by_image`` (file, k=8) -> (gallery of similar studies (never the upload's own study), captions =
  "#rank · z SD · report N · finding sentences" (z: the score's standard score among the query's 100 best);
  a note on the findings the model does not read)
* ``retrieve_by_text`` (text, k=8) -> (gallery of images, note); the same ranking for every k, cut at k
* ``inspect_sentence`` (sentence) -> {eta_LM, zeta per report, nearest sentences}; the page shows a picked
  study's own sentences as a table (eta_LM, zeta_txt for NUCLR) and this JSON folded under a summary line

Privacy: Gradio writes into the app's private temporary folder (``medclr.app.tempdir``); each upload is deleted
once read, results are written under fresh names there, uploads are never served back, the folder goes
when the process ends. The upload control is a button that never shows the uploaded file's name (it may
hold a patient's name; Gradio's ``gr.File`` box always shows it). Gradio's run history is off.

Inputs are capped: every text at ``MAX_TEXT_CHARS`` (1,000) characters, k at 1..``MAX_RESULTS``, the colour
scale at its two values, each refused with one line by the service (the text boxes also stop typing at the
cap). Every handler turns a ``MedclrError`` into a ``gr.Error`` with its one clear message; anything else
becomes a short "internal error" message (the server log keeps the traceback, without file names).
All model events share one queue slot (``concurrency_id="model"``): on a CPU one forward at a time
is fastest, and the queue orders the rest.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import time
import traceback

from medclr.app import hosts, render, tempdir

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # before gradio is imported: no telemetry, no version check
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
tempdir.private_temp_dir()  # sets GRADIO_TEMP_DIR before gradio is imported

import gradio as gr  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402

from medclr.app.service import MAX_RESULTS, MAX_TEXT_CHARS, AppService, check_text, model_line  # noqa: E402
from medclr.errors import MedclrError  # noqa: E402

log = logging.getLogger("medclr.app")

SHUTDOWN_GRACE_S = 2  # how long a stopping server lets open responses finish before it cancels them


class _NoCancelledTracebacks(logging.Filter):
    """uvicorn logs each response it cancels at shutdown with a traceback; its one-line count stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError))


_QUIET_CANCEL = _NoCancelledTracebacks()

TITLE = "medclr: chest X-ray findings, grounding and retrieval"
INTRO = """# medclr chest X-ray assistant
Upload a radiograph (DICOM, PNG or JPEG) and press **Analyse**. Research software: zero-shot findings
from a vision-language model, **not a diagnosis**. Patient identifiers in DICOM headers are never read
out or shown."""
# Quoted lines are what the model does not read (findings box, retrieval notes): grey, but #4d4d4d on white is
# 8.5:1 (WCAG AA asks 4.5:1; #8a8a8a was 3.5:1).
# Result galleries: Gradio lays a caption over its square tile in one line, and scrolls a gallery inside a fixed
# height. A wrapped caption then lost its start (rank, report number) above the tile, and the second row's
# captions sat below the gallery's edge. Here a caption wraps under its picture, the gallery grows to show every
# row, and the enlarged preview keeps its caption between the picture and the strip of thumbnails.
CSS = """
#findings .output-class { font-size: 1.1rem; }
.unread-notes blockquote { color: #4d4d4d; border-left: 3px solid #b0b0b0; margin: 0.3em 0; padding-left: 0.6em; }
.dark .unread-notes blockquote { color: #c8c8c8; }
/* the gallery's label floats over its top-left corner: the thumbnails start below it */
.gallery-box .grid-wrap { max-height: none !important; overflow-y: visible !important;
  padding-top: var(--size-8) !important; }
.gallery-box .grid-container { grid-template-rows: none !important; grid-auto-rows: auto !important; }
.gallery-box .thumbnail-item { aspect-ratio: auto !important; height: auto !important; display: flex !important;
  flex-direction: column; }
.gallery-box .thumbnail-item > img { aspect-ratio: 1 / 1; width: 100% !important; height: auto !important; }
.gallery-box .caption-label { position: static !important; white-space: normal !important; overflow: visible !important;
  text-overflow: clip !important; max-width: none !important; border: none !important; border-radius: 0 !important; }
.gallery-box .preview .media-button { height: auto !important; flex: 1 1 0 !important; min-height: 0; }
.gallery-box .preview .caption { flex: none; margin-bottom: var(--size-14); white-space: normal !important;
  overflow: visible !important; text-overflow: clip !important; }
footer { display: none !important; }
/* the primary button's white text: Gradio's orange #f97316 gives 2.8:1, orange-700 5.2:1 */
button.primary { background: #c2410c !important; border-color: #c2410c !important; color: #ffffff !important; }
button.primary:hover { background: #9a3412 !important; border-color: #9a3412 !important; }
#prompts table { table-layout: fixed; width: 100%; }
#prompts th, #prompts td { word-break: normal; overflow-wrap: break-word; white-space: normal; }
"""
# Names Gradio's markup leaves out (axe-core, bench/app_a11y.py): a gallery thumbnail is named "Thumbnail 1 of 8"
# while it shows its caption (a screen reader would not read the caption, and the picture's alt repeats it); the
# image panels' picture is a button without a name. Re-applied whenever the page's markup changes.
HEAD = """<script>
(() => {
  const name = () => {
    document.querySelectorAll('.thumbnail-item[aria-label^="Thumbnail"]').forEach(b => {
      const caption = b.querySelector('.caption-label');
      if (caption && caption.textContent.trim()) {
        b.setAttribute('aria-label', caption.textContent.trim());
        const img = b.querySelector('img');
        if (img) img.setAttribute('alt', '');
      }
    });
    document.querySelectorAll('#preview .image-container > button:not([aria-label]), '
                              + '#heatmap .image-container > button:not([aria-label])').forEach(b => {
      const panel = b.closest('#preview, #heatmap');
      b.setAttribute('aria-label', panel.id === 'preview' ? 'The radiograph as the model reads it'
                                                          : 'The heatmap for the phrase');
    });
  };
  const start = () => new MutationObserver(name).observe(document.body, {childList: true, subtree: true});
  if (document.body) start(); else document.addEventListener('DOMContentLoaded', start);
})();
</script>"""
CAPTIONS = ("Captions: **#rank** · **z SD**, how far the image's score stands above the query's 100 best-scoring "
            "indexed images, in standard deviations (raw cosines of chest films all sit near 0.99) · **report N**, "
            "the study's number in the index (click a study to see its report's sentences) · the report's finding "
            "sentences.")


def _safe(name: str):
    """Wrap a service call: clear messages for bad input, no tracebacks to the browser."""

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except gr.Error:
                raise
            except MedclrError as exc:
                log.info("%s refused: %s", name, exc)
                raise gr.Error(str(exc), title="Cannot do that", print_exception=False) from None
            except MemoryError:
                log.error("%s: out of memory", name)
                raise gr.Error("the server ran out of memory on this image; try a smaller file") from None
            except Exception as exc:  # noqa: BLE001
                frames = "".join(traceback.format_tb(exc.__traceback__))
                log.error("%s failed with %s\n%s", name, type(exc).__name__, frames)
                raise gr.Error(f"internal error in {name} ({type(exc).__name__}); the server log has details") from None

        return wrapper

    return deco


def _as_sent(payload):
    return payload


NOT_UPLOADED = "that file was not uploaded to this app; upload the image first (the page's button, or POST /gradio_api/upload)"


def _refuse_foreign_files(demo: gr.Blocks) -> None:
    """A file input must be an upload to this app. Gradio refuses any other path (a raw API call naming a file on
    the server) while it prepares the inputs, before a handler runs, and prints a traceback that holds the
    caller's string; here that refusal is one log line naming the endpoint, never the string, and the caller gets
    :data:`NOT_UPLOADED`."""
    from gradio.exceptions import InvalidPathError

    prepare = demo.preprocess_data

    async def preprocess_data(block_fn, *args, **kwargs):
        try:
            return await prepare(block_fn, *args, **kwargs)
        except InvalidPathError:
            log.warning("app: %s refused: a file input that was not uploaded to this app",
                        getattr(block_fn, "api_name", None) or "a request")
            raise gr.Error(NOT_UPLOADED, title="Cannot do that", print_exception=False) from None

    demo.preprocess_data = preprocess_data


def _png(image, stem: str) -> str:
    return render.save_png(image, tempdir.results_dir(), stem)


def build_blocks(service: AppService) -> gr.Blocks:
    has_index = service.index is not None
    tempdir.private_temp_dir()  # (again: GRADIO_TEMP_DIR must name it when the Blocks are built)
    service.discard_uploads = True

    @_safe("preview")
    def preview(file):
        image, facts = service.preview(file)
        return _png(image, "preview"), facts

    @_safe("zero_shot")
    def zero_shot(file):
        return service.zero_shot(file)

    @_safe("ground")
    def ground(file, phrase, scale="relative"):
        image, legend = service.ground(file, phrase, scale)
        return _png(image, "heatmap"), legend

    def gallery(items):
        return [(_png(image, "study"), caption) for image, caption in items]

    @_safe("retrieve_by_image")
    def retrieve_by_image(file, k=8):
        items, note = service.similar_studies(file, k)
        return gallery(items), note

    @_safe("retrieve_by_text")
    def retrieve_by_text(text, k=8):
        items, note = service.images_for_text(text, k)
        return gallery(items), note

    @_safe("inspect_sentence")
    def inspect_sentence(sentence):
        return service.inspect(sentence)

    @_safe("sentence")
    def pick_sentence(text):
        return check_text(text, "sentence", "") if text and str(text).strip() else ""

    @_safe("report")
    def pick_study(gallery, evt: gr.SelectData):
        """The picked study's own sentences: (heading, table, dropdown) updates; no change for a caption that
        names no report."""
        study = _study_sentences(service, gallery, evt.index, evt.value)
        if not study:
            return gr.update(), gr.update(), gr.update()
        sentences = [row[0] for row in study["rows"]]
        heading = (f"**Report {study['report']}**: its {len(sentences)} sentence(s) in report order; "
                   "eta_LM to 3 significant digits" + (", zeta_txt the learned NUCLR popularity"
                                                       if "zeta_txt" in study["columns"] else ""))
        return (heading, gr.update(value={"headers": study["columns"], "data": study["rows"]}),
                gr.update(choices=sentences, value=sentences[0] if sentences else None))

    with gr.Blocks(title=TITLE, analytics_enabled=False) as demo:
        gr.Markdown(INTRO)
        gr.Markdown(model_line(service.engine), elem_id="model_line")
        # which request answered last, and when: an answer equal to the one before changes nothing else on the page
        status = gr.HTML(elem_id="status")
        with gr.Row(equal_height=False):
            with gr.Column(scale=4):
                with gr.Row(elem_id="upload_row"):
                    # a button, not gr.File: the File box shows the uploaded file's name, which may be a patient's
                    upload = gr.UploadButton("Upload a radiograph (DICOM, PNG or JPEG)", type="filepath",
                                             elem_id="upload", scale=3)
                    clear = gr.Button("Clear", elem_id="clear", scale=1)
                shown = gr.Image(label="As the model reads it", type="numpy", interactive=False, elem_id="preview",
                                 height=340, buttons=[])
                facts = gr.Markdown(elem_id="facts")
                analyse = gr.Button("Analyse", variant="primary", elem_id="analyse")
            with gr.Column(scale=3):
                label = gr.Label(num_top_classes=5, label="CheX5 zero-shot probability", elem_id="findings",
                                 show_heading=False)
                findings_note = gr.Markdown(elem_id="findings_note", elem_classes=["unread-notes"])
                phrase = gr.Textbox(label="Phrase to ground", value="pleural effusion", elem_id="phrase",
                                    max_length=MAX_TEXT_CHARS)
                with gr.Row():
                    scale = gr.Radio(["relative", "absolute"], value="relative", label="Colour scale", scale=2)
                    ground_btn = gr.Button("Show heatmap", elem_id="ground_btn", scale=1)
            with gr.Column(scale=4):
                heat = gr.Image(label="Heatmap for the phrase", type="numpy", interactive=False, elem_id="heatmap",
                                height=420, format="png", buttons=["fullscreen"])
                legend = gr.Markdown(elem_id="legend")
        with gr.Accordion("Findings: probabilities, validation and the prompt pairs used", open=False):
            table = gr.Dataframe(headers=["finding", "probability %", "operating point %", "validation AUC", "note",
                                          "positive prompt", "negative prompt"],
                                 datatype=["str", "number", "number", "number", "str", "str", "str"],
                                 column_widths=["13%", "11%", "11%", "10%", "25%", "15%", "15%"],
                                 interactive=False, wrap=True, elem_id="prompts", show_label=False)
        with gr.Tab("Similar studies", interactive=has_index):
            with gr.Row():
                k = gr.Slider(1, MAX_RESULTS, value=8, step=1, label="Number of results", scale=3)
                similar_btn = gr.Button("Find studies like the uploaded image", elem_id="similar_btn", scale=2)
            similar = gr.Gallery(label="Similar studies (click one to inspect its sentences)", columns=6,
                                 elem_id="similar", format="png", interactive=False, elem_classes=["gallery-box"])
            similar_note = gr.Markdown(elem_id="similar_note", elem_classes=["unread-notes"])
            gr.Markdown(CAPTIONS)
        with gr.Tab("Images for a text", interactive=has_index):
            with gr.Row():
                query = gr.Textbox(label="Describe a finding", placeholder="e.g. right pneumothorax", scale=4,
                                   max_length=MAX_TEXT_CHARS)
                text_btn = gr.Button("Search", scale=1)
            by_text = gr.Gallery(label="Images for the text", columns=6, elem_id="by_text", format="png",
                                 interactive=False, elem_classes=["gallery-box"])
            text_note = gr.Markdown(elem_id="text_note", elem_classes=["unread-notes"])
            gr.Markdown(CAPTIONS)
        with gr.Tab("Sentence inspector"):
            gr.Markdown("Click a study in a gallery: its report's own sentences with their LM class probability "
                        "**eta_LM** and, for a NUCLR checkpoint, the learned popularity **zeta_txt**. Or type a "
                        "sentence and press Inspect.")
            study_title = gr.Markdown(elem_id="study_title")
            study_table = gr.Dataframe(
                headers=["sentence", "eta_LM"] + (["zeta_txt"] if service.engine.stats.has_zeta else []),
                datatype=["str", "number"] + (["number"] if service.engine.stats.has_zeta else []),
                interactive=False, wrap=True, elem_id="study_sentences", show_label=False)
            with gr.Row():
                pick = gr.Dropdown(label="Sentences of the study picked in the gallery", choices=[],
                                   allow_custom_value=True, scale=2)
                sentence = gr.Textbox(label="Sentence", elem_id="sentence", scale=3, max_length=MAX_TEXT_CHARS)
                inspect_btn = gr.Button("Inspect", scale=1)
            summary = gr.Markdown(elem_id="inspected_summary")
            with gr.Accordion("Sentence statistics (JSON)", open=False):
                inspected = gr.JSON(label="Sentence statistics", elem_id="inspected")

        # k and the colour scale reach the service as sent, which refuses a bad value with one line
        # (Gradio's own range / choice check raises inside its preprocessing and logs a traceback)
        for component in (k, scale):
            component.preprocess = _as_sent
        model_events = {"concurrency_id": "model", "concurrency_limit": 1}
        # a new upload first blanks everything shown for the previous one (another patient's, perhaps)
        # (the galleries and the inspector too: they answered for the previous image)
        previous = [shown, facts, label, table, findings_note, heat, legend, similar, similar_note, study_title,
                    study_table, pick, sentence, summary, inspected, status]
        upload.upload(lambda: tuple(_blank(c) for c in previous), None, previous,
                      api_name="_reset", api_visibility="private", queue=False)
        upload.upload(preview, upload, [shown, facts], api_name="preview", **model_events)
        def done(event, what: str, name: str) -> None:
            event.success(_answered(what), None, status, api_name=f"_done_{name}", api_visibility="private",
                          queue=False)

        done(analyse.click(zero_shot, upload, [label, table, findings_note], api_name="zero_shot", **model_events).then(
            ground, [upload, phrase, scale], [heat, legend], api_name="_analyse_ground", api_visibility="private",
            **model_events), "Findings and heatmap", "analyse")
        done(ground_btn.click(ground, [upload, phrase, scale], [heat, legend], api_name="ground", **model_events),
             "Heatmap", "ground")
        done(phrase.submit(ground, [upload, phrase, scale], [heat, legend], api_name="_phrase_submit",
                           api_visibility="private", **model_events), "Heatmap", "phrase")
        done(similar_btn.click(retrieve_by_image, [upload, k], [similar, similar_note], api_name="retrieve_by_image",
                               **model_events), "Similar studies", "similar")
        done(text_btn.click(retrieve_by_text, [query, k], [by_text, text_note], api_name="retrieve_by_text",
                            **model_events), "Images for the text", "text")
        done(query.submit(retrieve_by_text, [query, k], [by_text, text_note], api_name="_query_submit",
                          api_visibility="private", **model_events), "Images for the text", "query")
        similar.select(pick_study, similar, [study_title, study_table, pick], api_name="_pick_study",
                       api_visibility="private")
        by_text.select(pick_study, by_text, [study_title, study_table, pick], api_name="_pick_text_study",
                       api_visibility="private")
        pick.change(pick_sentence, pick, sentence, api_name="_pick_sentence", api_visibility="private",
                    queue=False)
        inspect_btn.click(inspect_sentence, sentence, inspected, api_name="inspect_sentence", **model_events).then(
            _inspected_summary, inspected, summary, api_name="_inspect_summary", api_visibility="private",
            queue=False)
        sentence.submit(inspect_sentence, sentence, inspected, api_name="_sentence_submit", api_visibility="private",
                        **model_events).then(_inspected_summary, inspected, summary, api_name="_submit_summary",
                                             api_visibility="private", queue=False)
        # Clear blanks every panel: the upload and every component any event above writes to (derived from
        # the events, so a panel added later is cleared too); registered last for that reason
        panels = _panels(demo, upload)
        clear.click(lambda: tuple(_blank(c) for c in panels), None, panels, api_name="_clear",
                    api_visibility="private", queue=False)
    _refuse_foreign_files(demo)
    return demo


def _answered(what: str):
    """The status line's text after a request: what answered and when (the server's clock, to the second)."""

    def stamp() -> str:
        return f'<p role="status">{what}: answered at {time.strftime("%H:%M:%S")}.</p>'

    return stamp


def _panels(demo: gr.Blocks, *first) -> list:
    """``first``, then every component that an event registered so far in ``demo`` writes to, once each."""
    out = list(first)
    for fn in demo.fns.values():
        out += [c for c in fn.outputs if all(c is not o for o in out)]
    return out


def _blank(component):
    """An update that empties a component (a dropdown loses its choices too)."""
    if isinstance(component, gr.Dropdown):
        return gr.update(choices=[], value=None)
    return gr.update(value=None)


def _inspected_summary(payload) -> str:
    """One readable line for an inspected sentence (its full statistics stay in the JSON below it)."""
    if not isinstance(payload, dict) or not payload.get("sentence"):
        return ""
    eta = payload.get("eta_LM")
    parts = [f"eta_LM {eta:.3g}" if isinstance(eta, (int, float)) else str(payload.get("eta_note") or "no eta_LM")]
    if "reports_with_sentence" in payload:
        parts.append(f"in {payload['reports_with_sentence']} indexed report(s)")
    zeta = payload.get("zeta_txt_sentence")
    if isinstance(zeta, (int, float)):
        parts.append(f"zeta_txt {zeta:.3g}")
    else:
        z = [r["zeta_txt"] for r in payload.get("zeta") or [] if isinstance(r.get("zeta_txt"), (int, float))]
        if z:
            parts.append(f"zeta_txt of those reports {min(z):.3g} to {max(z):.3g}" if len(z) > 1
                         else f"zeta_txt of that report {z[0]:.3g}")
    return f"{_md_text(payload['sentence'])}: " + " · ".join(parts)


def _md_text(text: str) -> str:
    """Typed text shown as plain text inside Markdown (markup characters escaped)."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|<>~])", r"\\\1", " ".join(str(text).split()))


_CAPTION_REPORT = re.compile(r"·\s*report\s+(\d+)\b")


def _study_sentences(service: AppService, gallery, index, value) -> dict:
    """The picked gallery item's report and its own sentences, {"report": manifest index, "columns", "rows"}
    (``AppService.study_table``); {} when the caption names no report. Captions read
    "#rank · z SD · report N · finding sentences" (``AppService._gallery``)."""
    caption = ""
    if isinstance(value, dict):
        caption = str(value.get("caption") or "")
    if not caption and gallery and isinstance(index, int) and 0 <= index < len(gallery):
        item = gallery[index]
        if isinstance(item, dict):
            caption = str(item.get("caption") or "")
        elif isinstance(item, (list, tuple)) and len(item) > 1:
            caption = str(item[1])
    found = _CAPTION_REPORT.search(caption)
    if found is None:
        return {}
    columns, rows = service.study_table(int(found.group(1)))
    return {"report": int(found.group(1)), "columns": columns, "rows": rows}


def launch(demo: gr.Blocks, host: str = "127.0.0.1", port: int | None = 7860, auth=None,
           max_file_size: str | int = "64mb", queue_size: int = 32, block: bool = True, keep_minutes: float = 30.0,
           allowed_hosts: list[str] | None = None):
    """Queue for a CPU server, then serve (share=False always). Returns (app, local_url).

    Files in the private temp folder older than ``keep_minutes`` are removed once a minute; the
    run history (which keeps inputs and outputs in the browser, or in a Hugging Face bucket a user
    connects) is off. Requests for another Host than localhost / the bound address / ``allowed_hosts``,
    cross-origin requests and oversized bodies are refused (``medclr.app.hosts.HostOriginPolicy``).
    With ``block``, serves until Ctrl-C, then closes the app (:func:`serve_until_interrupted`)."""
    tempdir.start_sweeper(keep_minutes * 60.0, after=functools.partial(_after_sweep, demo))
    # Gradio checks its own start with httpx, which logs each of those requests at INFO ("HTTP Request: GET ...")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    demo.queue(max_size=queue_size, default_concurrency_limit=1)
    app, url, _ = demo.launch(server_name=host, server_port=port, share=False, auth=auth,
                              max_file_size=max_file_size, prevent_thread_lock=True, quiet=True,
                              show_error=False, css=CSS, head=HEAD, footer_links=[], ssr_mode=False, mcp_server=False,
                              inbrowser=False, run_history=False,
                              app_kwargs={"middleware": [
                                  Middleware(hosts.HostOriginPolicy, bound=host, allowed_hosts=allowed_hosts),
                                  Middleware(tempdir.RefuseUploadDownloads)]})
    # uvicorn's graceful shutdown waits, without limit, for every open response to end; the event stream
    # of a request still queued never ends once the queue has stopped. Bounded, the server has stopped
    # before Blocks.close gives up waiting for it (5 s), so before the private folder goes.
    demo.server.config.timeout_graceful_shutdown = SHUTDOWN_GRACE_S
    logging.getLogger("uvicorn.error").addFilter(_QUIET_CANCEL)
    if block:
        serve_until_interrupted(demo)
    return app, url


def _after_sweep(demo: gr.Blocks) -> None:
    """What a server that runs for weeks tidies once a minute (``bench/bench_app_soak.py`` measured both):

    * Gradio records the path of every file it hands out in its blocks' ``temp_files`` sets and forgets none
      while the app runs (its own ``delete_cache`` is off: the sweeper deletes the files). The names of files
      gone from the disk are dropped, or the sets grow by every result picture served.
    * glibc keeps memory that the request threads freed in its arenas; ``malloc_trim`` gives it back to the
      system (most of the soak's late RSS growth). Elsewhere (musl, macOS, Windows) nothing is done."""
    for files in getattr(demo, "temp_file_sets", []):
        try:
            gone = [f for f in list(files) if not os.path.exists(f)]
        except RuntimeError:  # a request thread added a file while the set was copied: next minute
            continue
        files.difference_update(gone)
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def serve_until_interrupted(demo: gr.Blocks) -> None:
    """Block until Ctrl-C (or until the app is closed elsewhere), then close the app. ``Blocks.close`` stops
    the queue and ends the open event streams before it stops the server; Gradio's own wait
    (``Blocks.block_thread``) stops only the server on Ctrl-C, which then waits 5 s for such streams."""
    try:
        while demo.is_running:
            time.sleep(0.1)
    except KeyboardInterrupt:
        log.info("app: Ctrl+C, stopping")
    finally:
        demo.close(verbose=False)
