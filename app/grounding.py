"""Whether the heatmap panel draws a map for a typed phrase on one image, and the sentence that says why.

Three checks, in order; each can withhold the map with one plain sentence (:func:`judge`):

1. **A denial** ("no pleural effusion", "lungs are clear"; ``medclr.app.phrases``) gets no map: a map shows where
   a finding is, and an absence has nowhere to point. The sentence gives the denied finding's probability
   instead, where its absence is read, or says that the model does not read that finding, so it cannot vouch
   for its absence either.
2. **The model must say the phrase holds on this image.** A phrase that states a CheX5 finding ("enlarged heart")
   follows that finding: ``Inference.phrase_evidence`` compares its calibrated probability with the operating
   point of the checkpoint's validation, and gives no map for a finding the model does not read; on a checkpoint
   without that record, the finding's raw two-prompt probability (what the findings box shows) must reach 50%.
   Any other phrase must outscore its negation, and the sentence says that this is not validated.
3. **A phrase that names a side or a size** is scored against the same phrase with the other side or size
   (``medclr.app.phrases.Alternative``). The model prefers one of the two by ``medclr.inference.preference``
   (at least 2 to 1 odds by its own two-sentence softmax; `medclr eval`'s ``sides`` task measures how often
   that rule picks the side a phrase names). The map is drawn only when it prefers the phrase typed: a map of
   "left pleural effusion" that the model places on the right would show the right.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from medclr.app.phrases import Alternative, Reading
from medclr.inference.preference import PREFERENCE_ODDS, preference


def percent(p: float | None) -> str:
    """A probability as the page writes it everywhere: a whole percentage, as ``gr.Label`` shows it ("94%")."""
    return "–" if p is None or not math.isfinite(p) else f"{round(100 * p)}%"


@dataclass(frozen=True)
class Verdict:
    draw: bool
    sentence: str  # drawn: the legend's clause on why (no leading capital, no full stop); withheld: the whole line


def judge(engine, encoded, reading: Reading) -> Verdict:
    """Whether to draw the map of ``reading.phrase`` on ``encoded`` (an ``EncodedImage``), and why (module docstring)."""
    quoted = f"“{reading.phrase}”"
    if reading.denial:
        return Verdict(False, f"No heatmap for {quoted}: it states an absence, and a map shows where a finding is, "
                              "so it would point at nothing." + _absence_read(engine, encoded, reading.denied))
    evidence = _evidence(engine, encoded, reading)
    absent = absence_clause(evidence)
    if absent is not None:
        return Verdict(False, f"No heatmap for {quoted}: {absent}.")
    clauses = [presence_clause(evidence)]
    for alt in reading.alternatives:
        mine, theirs = _scores(engine, encoded, [reading.phrase, alt.phrase])
        prefers = preference(mine, theirs, engine.tau)
        scores = f"“{reading.phrase}” {mine:.3f} against “{alt.phrase}” {theirs:.3f}"
        if prefers > 0:
            verb = "places it on the" if alt.kind == "side" else "reads it as"
            clauses.append(f"it {verb} {alt.typed} rather than {'the ' * (alt.kind == 'side')}{alt.other} ({scores}; "
                           f"{alt.kind}s are not validated)")
        elif prefers < 0:
            return Verdict(False, f"No heatmap for {quoted}: {clauses[0]}, but {_as(alt, alt.other)}, not "
                                  f"{_as(alt, alt.typed)} ({scores}). Type “{alt.phrase}” to see that map.")
        else:
            return Verdict(False, f"No heatmap for {quoted}: {clauses[0]}, but it cannot tell {_the(alt, alt.typed)} "
                                  f"from {_the(alt, alt.other)} on this image ({scores}: closer than the "
                                  f"{PREFERENCE_ODDS:.0f}:1 odds it takes to prefer one), so a map would not show "
                                  f"the {alt.kind} typed. Leave out “{alt.typed}” to see where it places the rest.")
    return Verdict(True, "; ".join(clauses))


def _as(alt: Alternative, word: str) -> str:
    return f"on the {word}" if alt.kind == "side" else f"as {word}"


def _the(alt: Alternative, word: str) -> str:
    return f"the {word}" if alt.kind == "side" else word


def _scores(engine, encoded, texts: list[str]) -> list[float]:
    """The checkpoint's image-sentence score of each text (``DualEncoder.similarity``, what its loss was trained on)."""
    import torch

    with torch.inference_mode():
        emb = torch.from_numpy(engine.embed_texts(texts)).to(engine.device)
        return [float(v) for v in engine.model.similarity(encoded.features, emb)[0].float().cpu()]


def _evidence(engine, encoded, reading: Reading) -> dict[str, Any]:
    if reading.finding is not None and engine.findings_record is None:
        detail = next(d for d in engine.zero_shot_details(encoded) if d["class"] == reading.finding)
        return {"how": "raw", "finding": reading.finding, "probability": detail["raw_probability"],
                "present": detail["raw_probability"] >= 0.5}
    return engine.phrase_evidence(encoded, reading.phrase)


def absence_clause(evidence: dict[str, Any]) -> str | None:
    """Why the model does not say the phrase holds (``Inference.phrase_evidence``, or the raw route above); None
    when it does."""
    how, finding = evidence["how"], (evidence.get("finding") or "").lower()
    if how == "finding" and evidence["present"] is None:
        return f"{evidence['reason']}"
    if how == "finding" and not evidence["present"]:
        return (f"the model does not find {finding} on this image (probability {percent(evidence['probability'])}, "
                f"below its operating point of {percent(evidence['operating_probability'])})")
    if how == "raw" and not evidence["present"]:
        return (f"the model scores {finding}'s negative prompt above its positive one (raw probability "
                f"{percent(evidence['probability'])}; this checkpoint is not validated)")
    if how == "negation" and not evidence["present"]:
        return (f"the model scores “{evidence['negation']}” above the phrase ({evidence['score_negation']:.3f} "
                f"against {evidence['score']:.3f}); {_UNRECOGNISED}")
    return None


_UNRECOGNISED = "the phrase states none of the five CheX5 findings, so this check is not validated"


def presence_clause(evidence: dict[str, Any]) -> str:
    """Why the map is drawn: the legend's first clause."""
    how, finding = evidence["how"], (evidence.get("finding") or "").lower()
    if how == "finding":
        return (f"the model finds {finding} on this image (probability {percent(evidence['probability'])}, at or above "
                f"its operating point of {percent(evidence['operating_probability'])})")
    if how == "raw":
        return (f"the model scores {finding}'s positive prompt above its negative one (raw probability "
                f"{percent(evidence['probability'])}; this checkpoint is not validated)")
    if how == "negation":
        return (f"the model scores the phrase above “{evidence['negation']}” ({evidence['score']:.3f} against "
                f"{evidence['score_negation']:.3f}); {_UNRECOGNISED}")
    return ("presence unchecked: the phrase is hedged or mixed, so medclr's rules can neither negate it nor read it "
            "as one finding")


def _absence_read(engine, encoded, denied: tuple[str, ...]) -> str:
    """Where the absence of each denied finding is read: its probability against its operating point, or why the
    model cannot say."""
    if not denied:
        return " Whether a finding is absent is read from its probability in the findings box."
    from medclr.findings import operating_probability, unread_reason

    record = engine.findings_record
    details = {d["class"]: d for d in engine.zero_shot_details(encoded)}
    out = []
    for name in denied:
        why = unread_reason(record, name)
        if record is None:
            out.append(f"{name}: {percent(details[name]['raw_probability'])} before calibration (this checkpoint is not "
                       "validated).")
        elif why is not None:
            out.append(f"{why[:1].upper()}{why[1:]}, so it cannot vouch for its absence either.")
        else:
            p, op = details[name]["probability"], operating_probability(record, name)
            out.append(f"The model gives {name.lower()} {percent(p)} on this image "
                       f"({'at or above' if p >= op else 'below'} its operating point of {percent(op)}).")
    return " " + " ".join(out)
