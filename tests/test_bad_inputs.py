"""The bad-input corpus (tests/bad_inputs.py) through the three ways medclr reads files (issue 17): the app
(gradio_client against the real server), `medclr inspect` and `medclr score`. For every file:

* no traceback anywhere (replies, server log, stderr), and an unreadable or non-radiograph file gets one
  clear line (one of its needles) from each path;
* garbage is never scored: no findings from the app, a non-zero exit from inspect, a row in the scorer's
  errors table and none in its results; the files that are radiographs are scored, with a caution where
  the header says so;
* no PHI string (the fake patient's name, id, birth date) in any reply, log line, output table, parts
  file or temporary file. Command lines echo the paths the user gave them, and the scorer keys its rows
  by path, so those paths (which may hold a name) are taken out before the check; the app never shows
  or logs a file name at all.

Each test prints its counts (`pytest -s tests/test_bad_inputs.py`): inputs tried, refused with one clear
line, scored (of which with a caution), PHI hits.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path

import pytest

from tests.bad_inputs import PHI_STRINGS, Case, write_corpus
from tests.conftest_app import app_assets, engine, free_port, index_dir, served_app  # noqa: F401 - fixtures

os.environ["HF_HUB_OFFLINE"] = "1"  # gradio_client's own telemetry (docs/app.md, "API")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, list[Case]]:
    folder = tmp_path_factory.mktemp("bad_inputs") / "archive"
    return folder, write_corpus(folder)


@pytest.fixture(scope="module")
def server(engine, index_dir):  # noqa: F811
    with served_app(engine, index_dir) as (url, _):
        yield url


def _log_levels(caplog) -> None:
    """What a served app logs (INFO), and everything medclr logs."""
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="medclr")


def _one_clear_line(msg: str, case: Case) -> bool:
    return (bool(msg.strip()) and "\n" not in msg.strip() and "Traceback" not in msg and "internal error" not in msg
            and any(n in msg for n in case.needles))


def _phi(text: str, *paths: str) -> list[str]:
    """PHI strings in ``text`` once the paths the user gave (and their names) are taken out."""
    for p in sorted({str(x) for x in paths if x}, key=len, reverse=True):
        text = text.replace(p, "")
    return [s for s in PHI_STRINGS if s in text]


def _report(path: str, counts: dict, record_property) -> None:
    record_property(f"bad_inputs_{path}", json.dumps(counts))
    print(f"\nbad-input corpus via {path}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


def _expect(cases: list[Case]) -> dict:
    return {"tried": len(cases), "refused_one_line": sum(c.kind == "refused" for c in cases),
            "scored": sum(c.kind != "refused" for c in cases), "with_caution": sum(c.kind == "caution" for c in cases),
            "phi_hits": 0}


def test_app(server, corpus, caplog, capfd, record_property):
    from gradio_client import Client, handle_file
    from gradio_client.exceptions import AppError

    from medclr.app import tempdir

    folder, cases = corpus
    _log_levels(caplog)
    client = Client(server, verbose=False, analytics_enabled=False, download_files=False)
    counts = dict.fromkeys(("tried", "refused_one_line", "scored", "with_caution", "phi_hits"), 0)
    replies, problems = [], []
    for case in cases:
        counts["tried"] += 1
        f = handle_file(folder / case.name)
        try:
            if case.kind != "refused":
                _, facts = client.predict(f, api_name="/preview")
                replies.append(facts)
                flagged = "⚠" in facts and any(n in facts for n in case.needles)
                if (case.kind == "caution") != flagged or any(m in facts for m in ("<", ">", "](", "http")):
                    problems.append(f"{case.name}: facts line {facts!r}")
                counts["with_caution"] += flagged
            label, table, note = client.predict(f, api_name="/zero_shot")
            replies.append(json.dumps([label, table, note]))
            counts["scored"] += len(label["confidences"]) == 5
            if case.kind == "refused":
                problems.append(f"{case.name}: scored by the app: {label}")
        except AppError as exc:
            msg = str(exc)
            replies.append(msg)
            if case.kind == "refused" and _one_clear_line(msg, case):
                counts["refused_one_line"] += 1
            else:
                problems.append(f"{case.name}: {msg!r}")
    # nothing of the fake patient in replies, the server log, stderr, or the app's temporary folder
    out, err = capfd.readouterr()
    logged = caplog.text + out + err
    counts["phi_hits"] = len(_phi("\n".join(replies))) + len(_phi(logged))
    root = tempdir.private_temp_dir()
    for p in root.rglob("*"):
        hits = _phi(str(p.relative_to(root)))
        if p.is_file():
            data = p.read_bytes()
            hits += [s for s in PHI_STRINGS if s.encode() in data]
        counts["phi_hits"] += len(hits)
        problems += [f"temp file {p.name}: {h}" for h in hits]
    assert "Traceback" not in logged, logged[-3000:]
    _report("app", counts, record_property)
    assert problems == []
    assert counts == _expect(cases)


def test_inspect(corpus, capfd, caplog, record_property):
    from medclr.cli import main

    folder, cases = corpus
    _log_levels(caplog)
    counts = dict.fromkeys(("tried", "refused_one_line", "scored", "with_caution", "phi_hits"), 0)
    problems = []
    for case in cases:
        counts["tried"] += 1
        path = str(folder / case.name)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rc = main(["inspect", path])  # an exception escaping here is a traceback: the test fails
        out, err = capfd.readouterr()
        said = out + err + "".join(str(w.message) for w in caught)
        counts["phi_hits"] += len(_phi(said + caplog.text, path))
        if case.kind == "refused":
            lines = err.strip().splitlines()
            if rc == 1 and not out and len(lines) == 1 and lines[0].startswith("medclr inspect: error: ") \
                    and _one_clear_line(lines[0], case):
                counts["refused_one_line"] += 1
            else:
                problems.append(f"{case.name}: rc {rc}, {err!r}, {out[:200]!r}")
        else:
            header = json.loads(out) if rc == 0 else {}
            counts["scored"] += rc == 0  # read and shown (inspect scores nothing: "scored" = accepted)
            flagged = any(n in header.get("caution", "") for n in case.needles) if header else False
            counts["with_caution"] += flagged
            if rc != 0 or (case.kind == "caution") != flagged or err.strip():
                problems.append(f"{case.name}: rc {rc}, {err!r}, caution {header.get('caution')!r}")
        caplog.clear()
    _report("inspect", counts, record_property)
    assert problems == []
    assert counts == _expect(cases)


def test_score(corpus, app_assets, tmp_path, capfd, caplog, record_property):  # noqa: F811
    import pandas as pd

    from medclr.cli import main
    from medclr.jobs.scoring import errors_path, parts_dir

    folder, cases = corpus
    walked = [c for c in cases if c.scored_by_walk]
    out = tmp_path / "scores" / "results.parquet"
    _log_levels(caplog)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rc = main(["score", "--checkpoint", str(app_assets["checkpoint"]), "--input", str(folder), "--out", str(out),
                   "--workers", "0", "--batch-size", "8", "--no-progress"])
    stdout, stderr = capfd.readouterr()
    assert rc == 0, stderr
    results, errors = pd.read_parquet(out), pd.read_parquet(errors_path(out))
    by_name = {c.name: c for c in cases}
    problems = []
    counts = {"tried": len(walked), "refused_one_line": 0, "scored": len(results),
              "with_caution": 0, "phi_hits": 0}
    for name, error in zip(errors["path"], errors["error"]):
        case = by_name[name]
        if case.kind == "refused" and _one_clear_line(error, case):
            counts["refused_one_line"] += 1
        else:
            problems.append(f"{name}: {error!r}")
    for name, caution in zip(results["path"], results["caution"]):
        case = by_name[name]
        if case.kind == "refused":
            problems.append(f"{name}: scored")
        flagged = any(n in caution for n in case.needles) and "\n" not in caution
        counts["with_caution"] += flagged
        if (case.kind == "caution") != flagged:
            problems.append(f"{name}: caution {caution!r}")
    assert sorted(results["path"]) == sorted(c.name for c in walked if c.kind != "refused")
    assert sorted(errors["path"]) == sorted(c.name for c in walked if c.kind == "refused")
    # PHI: every cell of both tables and of the parts, run.json, stdout/stderr, log and warnings, once the
    # paths themselves (the tables' keys, and what the user typed) are taken out
    names = [str(folder / c.name) for c in cases] + [c.name for c in cases] + [str(folder)]
    tables = [results, errors] + [pd.read_parquet(p) for p in sorted(parts_dir(out).glob("part-*.parquet"))]
    text = "\n".join(t.astype(str).to_csv(index=False) for t in tables)
    text += (parts_dir(out) / "run.json").read_text() + stdout + stderr + caplog.text
    text += "\n".join(str(w.message) for w in caught)
    counts["phi_hits"] = len(_phi(text, *names))
    assert "Traceback" not in stderr + caplog.text
    _report("score", counts, record_property)
    assert problems == []
    assert counts == _expect(walked)
