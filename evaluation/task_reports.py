"""Task `reports`: study-level cross-modal retrieval, image → report and report → image, on any manifest's
--split images (no labels or boxes needed: what GLoRIA, CXR-CLIP and others report on their own corpora).

Each test image is a query against every test report and each report against every image; the pair of one
row is the match. A report's embedding is the mean of its sentences' unit embeddings, L2-normalised (a report
is longer than the text tower's window, and training paired images with sentences); the score is the
checkpoint's own image-sentence score (``head.score`` on ``head.image_side``: the LSE+NL head's over regions,
the cosine head's of global embeddings), as training and the index rank. R@1/5/10 and MedR per direction,
ties against the query, and the analytic chance level. Not a Table 1 column: the paper reports phrase-box
retrieval (task `retrieval`); this is the corpus-level view.
"""

from __future__ import annotations

import numpy as np

from medclr.evaluation.markdown import fmt, table
from medclr.evaluation.tasks import Task

KS = (1, 5, 10)
DIRECTIONS = ("i2t", "t2i")


def report_embeddings(model, reports: list[list[str]]):
    """(R, D) unit report embeddings: the mean of each report's unit sentence embeddings, L2-normalised."""
    import torch

    flat = [s for sents in reports for s in sents]
    owner = torch.tensor([r for r, sents in enumerate(reports) for _ in sents])
    sent = model.texts(flat).float()
    summed = torch.zeros(len(reports), sent.shape[1], device=sent.device).index_add_(0, owner.to(sent.device), sent)
    return torch.nn.functional.normalize(summed, dim=-1)


def study_scores(model, enc, positions: np.ndarray, text, chunk: int = 64) -> np.ndarray:
    """scores[image, report] by the checkpoint's head, images in chunks (their region features from ``enc``)."""
    import torch

    from medclr.models.image import ImageFeatures

    head = model.model.head
    rows = []
    with torch.inference_mode():
        for c in range(0, len(positions), chunk):
            pos = positions[c:c + chunk]
            regions = torch.stack([enc.regions[int(enc.rows[p])] for p in pos]).to(model.device)
            glob = torch.from_numpy(enc.glob[pos]).to(model.device)
            side = head.image_side(ImageFeatures(regions, glob)).float()
            rows.append(head.score(side, text.to(model.device)).double().cpu().numpy())
    return np.concatenate(rows)


class ReportRetrieval(Task):
    name, order = "reports", 35
    uses = frozenset({"test_regions"})

    def unavailable(self, inp):
        if inp.test_rows.size < 2:
            return f"fewer than 2 {inp.split} images"
        sents = inp.data.manifest.loc[inp.test_rows, "sentences"]
        return None if sents.map(lambda s: s is not None and len(s) > 0).sum() >= 2 else f"fewer than 2 {inp.split} reports"

    def run(self, inp):
        from medclr.evaluation.retrieval import bidirectional_retrieval

        pos = inp.enc.take(inp.test_rows)
        rows = inp.enc.rows[pos]
        reports = [list(s) for s in inp.data.manifest.loc[rows, "sentences"]]
        keep = np.array([len(r) > 0 for r in reports])
        pos, rows = pos[keep], rows[keep]
        s = study_scores(inp.model, inp.enc, pos, report_embeddings(inp.model, [r for r, k in zip(reports, keep) if k]))
        res = bidirectional_retrieval(s, ks=KS)
        n = len(rows)
        res["n_studies"] = int(n)
        res["n_duplicate_reports"] = int(n - inp.data.manifest.loc[rows, "sentences"].map(tuple).nunique())
        res["chance"] = {**{f"R@{k}": min(k, n) / n for k in KS}, "MedR": (n + 1) / 2.0}
        return res, None

    def section(self, metrics, r, figs):
        ch = r["chance"]
        cells = [f"{d}/{k}" for d in DIRECTIONS for k in (*(f"R@{k}" for k in KS), "MedR")]
        rows = [["this run", *(fmt(r[c], 1 if c.endswith("MedR") else 3) for c in cells)],
                ["chance", *(fmt(ch[c.split("/")[1]], 1 if c.endswith("MedR") else 3) for c in cells)]]
        return ["## Study-level retrieval (image ↔ report)", "",
                f"{r['n_studies']} {metrics['split']} studies: each image against every report and each report "
                "against every image, by the checkpoint's own score; a report is the mean of its sentences' "
                f"embeddings. Ties count against the query. {r['n_duplicate_reports']} reports repeat another's "
                "sentences word for word (their images cannot be told apart by text).", "",
                *table(["", "I→R R@1", "R@5", "R@10", "MedR", "R→I R@1", "R@5", "R@10", "MedR"], rows), ""]


TASK = ReportRetrieval()
