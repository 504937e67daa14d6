"""The model card (README.md) of a Hugging Face export, written from what the checkpoint records
(checkpoint_meta.json: training data, loss, the per-finding validation) and, when given, its last `medclr eval`
report (metrics.json, read through ``medclr.eval_report``, the one reader of that file).

Every number on the card says which file it came from. A model trained on CXR-Phantom (its manifest carries the
phantom's latent-class columns) is stated as not for clinical use at the top and under limitations; so is one
whose training data cannot be checked any more.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from medclr.errors import MedclrError
from medclr.eval_report import METRICS_NAME, ci, fmt, read_metrics, table
from medclr.inference import Inference

PHANTOM, REAL, UNKNOWN = "phantom", "real", "unknown"


def read_report(report: str | os.PathLike, inference: Inference) -> dict[str, Any]:
    """The `medclr eval` metrics.json at ``report`` (its folder or the file) of this checkpoint, with its path and
    SHA-256 under ``_source``. A pooled report of several checkpoints, or one of another checkpoint, is refused."""
    path = Path(report).expanduser()
    path = path / METRICS_NAME if path.is_dir() else path
    metrics = read_metrics(path, "--report")
    if metrics.get("protocol") == "seeds":
        raise MedclrError(f"--report {report}: pools {metrics.get('n_checkpoints')} checkpoints; pass the folder "
                          "of this checkpoint's own run (R/<k>_<name>/)")
    evaluated = metrics.get("checkpoint")
    ours = inference.checkpoint_dir
    if evaluated and ours and Path(evaluated).is_dir() and Path(evaluated).resolve() != ours.resolve():
        raise MedclrError(f"--report {report}: evaluates the checkpoint {evaluated}, not {ours}")
    metrics["_source"] = {"path": str(path.resolve()), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    return metrics


def data_kind(path: str | os.PathLike | None) -> str:
    """Whether a manifest (or a `medclr phantom` folder) is CXR-Phantom's: PHANTOM, REAL, or UNKNOWN (not found)."""
    import pyarrow.parquet as pq

    from medclr.data.groundtruth import GROUND_TRUTH_COLUMNS, GROUND_TRUTH_FILE

    if not path:
        return UNKNOWN
    p = Path(path)
    if p.is_dir():
        return PHANTOM if (p / GROUND_TRUTH_FILE).is_file() else REAL
    try:
        names = pq.read_schema(p).names
    except (OSError, ValueError):
        return UNKNOWN
    return PHANTOM if any(c in names for c in GROUND_TRUTH_COLUMNS) else REAL


def model_card(inference: Inference, metrics: dict[str, Any] | None, files: dict[str, str],
               loading: list[str] | None = None, name: str | None = None) -> str:
    """README.md: front matter, the use statement, model, training data, evaluation, validation, use, limits;
    ``loading``: the lines of its "Loading" section (default: how to load the Hugging Face export); ``name``: the
    model's name in the title (default: the checkpoint folder's)."""
    meta = inference.meta
    trained_on = data_kind(meta.manifest if meta else None)
    name = name or (inference.checkpoint_dir.name if inference.checkpoint_dir else "model")
    lines = ["---", "tags: [medclr, chest-x-ray, vision-language, contrastive-learning, zero-shot, phrase-grounding]",
             "pipeline_tag: zero-shot-image-classification", "---", "", f"# medclr dual encoder `{name}`", "",
             f"> **{_use_statement(trained_on)}**", ""]
    for section in (_model(inference, files), _training(inference, trained_on), _evaluation(metrics),
                    _validation(inference), _intended_use(), _limitations(inference, trained_on, metrics)):
        lines += section + [""]
    lines += ["## Loading", "", *(loading if loading is not None else [
        "`text/` loads with `transformers.AutoModel` and `AutoTokenizer`; the image tower, the text",
        "projection and the head are plain safetensors files; `config.json` says how they fit together.",
        "medclr's `docs/export.md` shows each step in a few lines of plain torch."]), ""]
    return "\n".join(lines)


def _use_statement(trained_on: str) -> str:
    if trained_on == PHANTOM:
        return ("Not for clinical use. This model was trained on CXR-Phantom, medclr's synthetic radiographs with "
                "generated reports: it has never seen a real patient's image, and its numbers show that the pipeline "
                "works, not how it reads real chest X-rays.")
    if trained_on == UNKNOWN:
        return ("Not for clinical use. The data this model was trained on cannot be checked (its manifest is not "
                "found); it is a research model, not a medical device.")
    return ("Not for clinical use. A research model for chest X-ray vision-language studies, not a medical device: "
            "it is not cleared for diagnosis or any decision about a patient.")


def _model(inference: Inference, files: dict[str, str]) -> list[str]:
    model = inference.model
    image, text, head = model.image_encoder.to_config(), model.text_encoder.to_config(), model.head.to_config()
    backbone = text["backbone"]
    pre = inference.preprocess
    head_words = (f"LSE+NL (non-local block over the regions, log-sum-exp pooling, gamma {fmt(head.get('gamma'), 2)})"
                  if head["type"] == "lse_nl" else "cosine of the global embeddings")
    rows = [["image tower", f"{image['arch']}, {image['stages']} stages, output stride {image['output_stride']}, "
                            f"{image['projector']} projector to {model.joint_dim}-d region cells; "
                            f"trunk initialisation: {image.get('init')}"],
            ["text tower", f"{backbone.get('model_type')} (layers {backbone.get('num_hidden_layers')}, hidden size "
                           f"{backbone.get('hidden_size')}; from `{text.get('source')}`), {text['pooling']} pooling, "
                           f"{text['projection']} projection to {model.joint_dim}-d"],
            ["similarity head", head_words],
            ["input", f"grey radiograph, shorter side resized to {pre.resize_to} px, centre crop {pre.image_size} px, "
                      f"normalisation `{image['input_norm']}`"],
            ["temperature tau", fmt(inference.tau, 4)],
            ["weights", f"SHA-256 of the checkpoint's model.safetensors `{inference.weights_sha256}`"]]
    return ["## Model", "", *table(["", ""], rows), "", "Files:", "",
            *table(["file", "holds"], [[f"`{k}`", v] for k, v in files.items()])]


def _training(inference: Inference, trained_on: str) -> list[str]:
    meta = inference.meta
    if meta is None or meta.step is None:
        return ["## Training data", "", "The checkpoint records no training run (checkpoint_meta.json has no steps)."]
    data = {PHANTOM: "CXR-Phantom (synthetic radiographs rendered for report text by `medclr phantom`)",
            REAL: "a `medclr prepare` manifest of image-report pairs",
            UNKNOWN: "not known: the manifest is not found"}[trained_on]
    eta = meta.eta_source or "none"
    if meta.eta_override:
        eta += f" (recomputed with a {meta.eta_override.get('a')}, k {meta.eta_override.get('k')})"
    rows = [["data", data], ["manifest", f"{_code(meta.manifest)}, split {_code(meta.split)}"],
            ["training pairs", fmt(meta.n_train)], ["data fingerprint", _code(meta.data_fingerprint)],
            ["loss", f"{_code(meta.loss)}, tau {fmt(meta.tau, 4)}, eta from {eta}"],
            ["steps", f"{meta.step} of {meta.total_steps}, {meta.global_batch} pairs per step, last loss "
                      f"{fmt(meta.last_loss)}"]]
    return ["## Training data", "", "From the checkpoint's `checkpoint_meta.json`:", "", *table(["", ""], rows)]


def _code(value: Any) -> str:
    return "–" if value is None else f"`{value}`"


def _evaluation(metrics: dict[str, Any] | None) -> list[str]:
    if metrics is None:
        return ["## Evaluation", "", "No `medclr eval` report was given (`medclr export --report`): the only numbers on "
                "this card are the validation AUCs that training recorded (next section)."]
    src = metrics["_source"]
    data_note = (" (CXR-Phantom: numbers on synthetic images, not on real radiographs)"
                 if data_kind(metrics.get("data")) == PHANTOM else "")
    lines = ["## Evaluation", "",
             f"Metrics from `{src['path']}` (SHA-256 `{src['sha256']}`): `medclr eval` of `{metrics.get('checkpoint')}` "
             f"on `{metrics.get('data')}`{data_note}, split `{metrics.get('split')}`, "
             f"{fmt(metrics.get('n_images_encoded'))} images, seed {metrics.get('seed')}. 95 % CIs are percentile "
             "bootstrap over images where the report has them; grounding and retrieval record none.", ""]
    lines += table(["metric", "value", "95 % CI", "chance / control"], _summary_rows(metrics))
    per_class = (metrics.get("zeroshot") or {}).get("per_class") or {}
    if per_class:
        lines += ["", "Zero-shot, per finding (the default prompts):", ""]
        lines += table(["finding", "AUC [95 % CI]", "ACC [95 % CI]", "images", "positives"],
                       [[c, fmt(e.get("AUC")) + ci(e.get("AUC_CI")), fmt(e.get("ACC")) + ci(e.get("ACC_CI")),
                         fmt(e.get("n")), fmt(e.get("n_pos"))] for c, e in per_class.items()])
    notes = metrics.get("notes") or []
    return lines + (["", *(f"- note from the report: {n}" for n in notes)] if notes else [])


def _summary_rows(m: dict[str, Any]) -> list[list[str]]:
    z, g = m.get("zeroshot") or {}, m.get("grounding") or {}
    macro, shuffled = z.get("macro") or {}, z.get("control_shuffled_labels") or {}
    s = m["summary"]
    return [["zero-shot AUC (macro, CheX5)", fmt(s.get("AUC")), ci(macro.get("AUC_CI")).strip() or "–",
             f"{fmt(shuffled.get('AUC'))} (labels shuffled)"],
            ["zero-shot ACC (macro)", fmt(s.get("ACC")), ci(macro.get("ACC_CI")).strip() or "–",
             f"{fmt(shuffled.get('ACC'))} (labels shuffled)"],
            ["grounding CNR (macro)", fmt(s.get("CNR")), "–",
             f"{fmt((g.get('CNR_control') or {}).get('macro'))} (another phrase's map)"],
            ["grounding mIoU (macro)", fmt(s.get("mIoU")), "–",
             f"{fmt((g.get('mIoU_control') or {}).get('macro'))} (another phrase's map)"],
            *_retrieval_rows(m)]


def _retrieval_rows(m: dict[str, Any]) -> list[list[str]]:
    """The retrieval rows: phrase-box retrieval (task `retrieval`, Table 1's Recall and MedR) when the report ran it
    or ran neither kind, study-level image <-> report retrieval (task `reports`) when it ran that."""
    r, studies, s = m.get("retrieval") or {}, m.get("reports") or {}, m["summary"]
    rows = []
    if r or not studies:
        chance = r.get("chance") or {}
        rows += [["retrieval recall (mean R@10/50/100)", fmt(s.get("Recall")), "–", f"{fmt(chance.get('Recall'))} (chance)"],
                 ["retrieval median rank", fmt(s.get("MedR"), 1), "–", f"{fmt(chance.get('MedR'), 1)} (chance)"]]
    if studies:
        chance = studies.get("chance") or {}
        ks = sorted(int(k[2:]) for k in chance if k.startswith("R@"))
        at = "/".join(f"R@{k}" for k in ks)
        recall_chance = sum(chance[f"R@{k}"] for k in ks) / len(ks) if ks else None
        where = f"{fmt(studies.get('n_studies'))} studies, image ↔ report"
        rows += [[f"study-level retrieval recall (mean {at}, {where})", fmt(studies.get("Recall")), "–",
                  f"{fmt(recall_chance)} (chance)"],
                 [f"study-level retrieval median rank ({where})", fmt(studies.get("MedR"), 1), "–",
                  f"{fmt(chance.get('MedR'), 1)} (chance)"]]
    return rows


def _validation(inference: Inference) -> list[str]:
    from medclr.findings import NOT_VALIDATED

    record = inference.meta.findings if inference.meta is not None else None
    head = ["## Validation at the end of training", ""]
    if not record:
        return head + [NOT_VALIDATED[0].upper() + NOT_VALIDATED[1:] + "."]
    rows = [[c, fmt(e.get("auc")) + ci(e.get("auc_ci")), fmt(e.get("n")), fmt(e.get("n_pos")),
             "yes" if e.get("reads") else f"no: {e.get('reason')}"] for c, e in record.get("classes", {}).items()]
    labels = (" The validation split had no CheX5 labels: they were read from each report by medclr's rule "
              "labeller (`medclr label`), so these AUCs measure agreement with the reports' words, not with a "
              "radiologist's reading of the image." if record.get("labels") == "rules" else "")
    return head + [f"From `checkpoint_meta.json` (split `{record.get('split')}`, the default prompts): the findings the "
                   f"model reads (AUC at least {record.get('min_auc')} and the CI above chance). medclr's app and scorer "
                   f"show a calibrated probability only for these.{labels}", "",
                   *table(["finding", "AUC [95 % CI]", "images", "positives", "read"], rows)]


def _intended_use() -> list[str]:
    return ["## Intended use", "",
            "Research on chest X-ray vision-language models: zero-shot scores for the five CheX5 findings with the "
            "prompts in `config.json`, phrase grounding maps, image-report retrieval, and a starting point for "
            "fine-tuning. Not for diagnosis, triage or any decision about a patient."]


def _limitations(inference: Inference, trained_on: str, metrics: dict[str, Any] | None) -> list[str]:
    items = []
    if trained_on == PHANTOM:
        items.append("**Trained on CXR-Phantom: not for clinical use.** Synthetic images and generated reports; "
                     "nothing here measures performance on real radiographs.")
    elif trained_on == UNKNOWN:
        items.append("**Training data unknown: not for clinical use.** The manifest it was trained on is not found.")
    items += ["Frontal chest radiographs in English-language report style only; other views, body parts, "
              "languages, hospitals, devices and populations are untested.",
              "Zero-shot scores depend on the prompt wording; the validation calibration holds for the default prompts "
              "at the validation prevalence only, and a finding the model does not read (above) has no meaningful "
              "probability.",
              "The preprocessing in `config.json` (resize, crop, normalisation) must be matched exactly; other input "
              "gives other embeddings.",
              "Grounding maps are coarse (one value per region cell) and show where the score comes from, not a "
              "segmentation."]
    if metrics is None:
        items.append("No held-out evaluation report is attached to this card.")
    return ["## Limitations", "", *(f"- {i}" for i in items)]
