"""medclr.lm: exact PLL against a naive loop, bad input, fit/score/calibrate on tiny data.

Every model here is a tiny random BertForMaskedLM with its own WordPiece
vocabulary built in the test; nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from medclr.errors import MedclrError  # noqa: E402
from medclr.lm import load_masked_lm, pseudo_log_likelihood, score_sentences  # noqa: E402

CORPUS = [
    "No acute cardiopulmonary abnormality.",
    "Heart size is normal.",
    "The lungs are clear.",
    "There is a small right pleural effusion.",
    "No pneumothorax or pleural effusion.",
    "Mild cardiomegaly with pulmonary vascular congestion.",
    "Calcified granuloma in the left upper lobe.",
    "Degenerative changes of the thoracic spine.",
    "Pneumomediastinum is seen along the left heart border.",
    "Stable postoperative appearance of the mediastinum.",
] * 3

SENTENCES = [
    "No acute cardiopulmonary abnormality.",
    "Heart size is normal.",
    "There is a small right pleural effusion.",
    "Pneumomediastinum is seen.",
    "Xylophone quartz effusion.",  # unknown pieces -> [UNK] and sub-word splits
    "Clear.",
    "Heart size is normal.",  # a duplicate
]


def _tokenizer(max_len=64):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast

    tk = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tk.normalizer = normalizers.BertNormalizer(lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.decoder = decoders.WordPiece()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    # a small vocabulary so that rarer words split into several pieces
    tk.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=120, min_frequency=2, special_tokens=special))
    cls, sep = tk.token_to_id("[CLS]"), tk.token_to_id("[SEP]")
    tk.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return BertTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                             sep_token="[SEP]", mask_token="[MASK]", model_max_length=max_len)


def _model(tok, max_pos=64, seed=0):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=max_pos, pad_token_id=tok.pad_token_id)
    model = BertForMaskedLM(cfg).eval()
    with torch.no_grad():  # a random init is nearly uniform; sharpen it so the scores differ a lot
        for p in model.parameters():
            p.mul_(4.0)
    return model


@pytest.fixture(scope="module")
def tiny():
    tok = _tokenizer()
    return _model(tok), tok


def naive_pll(sentence, model, tok, word_l2r=False, window=None):
    """One full forward per masked position; window=W scores long sentences in a centred W-piece window."""
    enc = tok(sentence, add_special_tokens=False)
    body = enc["input_ids"]
    wid = enc.word_ids()
    total = 0.0
    for t in range(len(body)):
        lo = 0
        if window is not None and len(body) > window:
            lo = min(max(t - window // 2, 0), len(body) - window)
        hi = lo + (window if window is not None and len(body) > window else len(body))
        ids = list(body)
        ids[t] = tok.mask_token_id
        if word_l2r:
            for j in range(t + 1, len(body)):
                if wid[j] == wid[t]:
                    ids[j] = tok.mask_token_id
        ids = [tok.cls_token_id] + ids[lo:hi] + [tok.sep_token_id]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, t - lo + 1]
        total += torch.log_softmax(logits, -1)[body[t]].item()
    return total


@pytest.mark.parametrize("word_l2r", [False, True])
def test_pll_equals_naive_loop(tiny, word_l2r):
    model, tok = tiny
    ref = np.array([naive_pll(s, model, tok, word_l2r) for s in SENTENCES])
    got = pseudo_log_likelihood(SENTENCES, model, tok, batch_size=3, word_l2r=word_l2r, progress=False)
    assert got.shape == (len(SENTENCES),) and got.dtype == np.float64
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    assert np.all(got < 0) and got[1] == got[6]
    # tiny forward passes (a token budget smaller than one sentence's copies) give the same numbers
    np.testing.assert_allclose(
        pseudo_log_likelihood(SENTENCES, model, tok, batch_size=64, max_batch_tokens=16, word_l2r=word_l2r,
                              progress=False), ref, atol=1e-4, rtol=0)


def test_word_l2r_differs_only_on_split_words(tiny):
    model, tok = tiny
    split_word = [s for s in SENTENCES if any(t.startswith("##") for t in tok.tokenize(s))]
    assert split_word, "the tiny vocabulary should split some words"
    plain = pseudo_log_likelihood(SENTENCES, model, tok, progress=False)
    l2r = pseudo_log_likelihood(SENTENCES, model, tok, word_l2r=True, progress=False)
    for s, a, b in zip(SENTENCES, plain, l2r):
        assert (abs(a - b) > 1e-6) == (s in split_word)


def test_special_tokens_excluded_and_counts(tiny):
    model, tok = tiny
    res = score_sentences(SENTENCES, model, tok, progress=False)
    expected = [len(tok(s, add_special_tokens=False)["input_ids"]) for s in SENTENCES]
    assert res.n_tokens.tolist() == expected and res.n_scored.tolist() == expected
    assert not res.long.any() and res.max_length == 64
    np.testing.assert_allclose(res.pll_per_token, res.pll / np.array(expected))


def test_long_sentences_window_truncate_error():
    tok = _tokenizer(max_len=8)
    model = _model(tok, max_pos=8)
    long_s = "There is a small right pleural effusion with mild cardiomegaly."
    n = len(tok(long_s, add_special_tokens=False)["input_ids"])
    assert n > 6
    res = score_sentences([long_s, "Clear."], model, tok, progress=False)
    assert res.long.tolist() == [True, False] and res.n_scored[0] == n
    np.testing.assert_allclose(res.pll[0], naive_pll(long_s, model, tok, window=6), atol=1e-4)
    tr = score_sentences([long_s], model, tok, long="truncate", progress=False)
    assert tr.n_scored[0] == 6 and tr.n_tokens[0] == n
    with pytest.raises(MedclrError, match="limit of 8"):
        pseudo_log_likelihood([long_s], model, tok, long="error", progress=False)


def test_one_huge_sentence_costs_bounded_work(tiny, caplog):
    """A 200 kB "sentence" (a pasted document) costs at most MAX_PIECES forward rows: only its first pieces are
    scored (n_scored < n_tokens), it is counted in the log, and the others are scored as before."""
    import medclr.lm.pll as pll_mod

    model, tok = tiny
    huge = " ".join(["Heart size is normal with a small right pleural effusion."] * 3500)  # ~200 kB
    assert len(huge) > 200_000
    rows = []
    real = pll_mod._forward
    with caplog.at_level("WARNING", logger="medclr.lm.pll"):
        def counted(model_, encoder, head, ids, *rest):
            rows.append(len(ids))
            return real(model_, encoder, head, ids, *rest)

        pll_mod._forward = counted
        try:
            res = score_sentences([huge, "Clear."], model, tok, progress=False, max_pieces=256)
        finally:
            pll_mod._forward = real
    assert res.n_scored[0] == 256 < res.n_tokens[0] and res.n_scored[1] == res.n_tokens[1]
    assert sum(rows) == 256 + res.n_scored[1]  # one masked row per scored piece, no more
    assert "1 of 2 sentences have more than 256 word pieces" in caplog.text
    np.testing.assert_allclose(res.pll[1], score_sentences(["Clear."], model, tok, progress=False).pll[0])


def test_score_saves_as_it_goes_and_resumes_after_a_kill(tiny, tmp_path, monkeypatch):
    """score_manifest writes the table after each block once save_every_s has passed (0 here: every block); a run
    killed in its third block resumes from the two blocks saved and scores only the rest (the short forms
    included)."""
    import medclr.lm.pll as pll_mod
    from medclr.data.hard_negatives import short_forms
    from medclr.data.manifest import read_manifest
    from medclr.lm.eta import read_eta_table
    from medclr.lm.score import score_manifest

    model, tok = tiny
    words = ["effusion", "heart", "normal", "right", "small", "clear", "there", "is"]
    sentences = [f"{a} {b} {c}." for a in words for b in words for c in words[:2]][:40]
    forms = {f for x in sentences for f in short_forms(x)} - set(sentences)
    assert forms == {"Effusion."}  # the table also holds it, count 0: 41 sentences to score
    manifest = read_manifest(_manifest(tmp_path / "m.parquet", [[x] for x in sentences]))
    out = tmp_path / "eta.parquet"
    real, calls = pll_mod.score_sentences, []

    def dies_in_third_block(*a, **k):
        calls.append(len(a[0]))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(pll_mod, "score_sentences", dies_in_third_block)
    with pytest.raises(KeyboardInterrupt):
        score_manifest(manifest, model, tok, out, block=10, save_every_s=0, eta_fit="paper", progress=False)
    saved, _ = read_eta_table(out)
    assert len(saved) == 20 and saved["pll"].notna().all()
    monkeypatch.setattr(pll_mod, "score_sentences", real)
    summary = score_manifest(manifest, model, tok, out, block=10, save_every_s=0, eta_fit="paper", progress=False)
    assert (summary["cached"], summary["scored"]) == (20, 20 + len(forms))
    table, _ = read_eta_table(out)
    assert len(table) == 41 and table.set_index("sentence")["count"]["Effusion."] == 0


def test_save_every_is_honoured_inside_one_long_block(tiny, tmp_path):
    """`lm score --max-pieces 100000 --save-every 1` on 60 sentences of 790-910 pieces: one block (block=512), so
    before issue 46 the table was first written when the whole block was done. The clock is now checked after
    every forward pass: the real command, SIGKILLed while it still runs, has saved its table more than once, the
    last save about --save-every before the kill; the resumed run scores only the rest, and the table equals that
    of an uninterrupted run."""
    import signal
    import subprocess
    import sys
    import time

    from medclr.cli import main
    from medclr.data.manifest import read_manifest
    from medclr.lm.eta import read_eta_table
    from medclr.lm.score import score_manifest

    model, tok = tiny
    model.save_pretrained(tmp_path / "lm")
    tok.save_pretrained(tmp_path / "lm")
    words = " ".join(CORPUS).replace(".", "").lower().split()
    rng = np.random.default_rng(0)
    sentences = [" ".join(rng.choice(words, 300)) + "." for _ in range(60)]  # each over the 64-token window
    m = _manifest(tmp_path / "m.parquet", [[x] for x in sentences])
    out = tmp_path / "eta.parquet"
    args = ["lm", "score", "--manifest", str(m), "--model", str(tmp_path / "lm"), "--out", str(out), "--no-progress",
            "--device", "cpu", "--threads", "1", "--max-pieces", "100000", "--save-every", "1"]
    proc = subprocess.Popen([sys.executable, "-m", "medclr", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        seen = []  # (mtime, rows) of each save observed
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline and len(seen) < 3:
            if out.exists() and (not seen or out.stat().st_mtime_ns != seen[-1][0]):
                seen.append((out.stat().st_mtime_ns, len(read_eta_table(out)[0])))
            time.sleep(0.05)
        assert proc.poll() is None, f"finished before three saves were seen ({seen}): {proc.stderr.read()[-2000:]}"
        proc.send_signal(signal.SIGKILL)
        killed_at = time.time_ns()
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    saved, _ = read_eta_table(out)
    assert 0 < seen[0][1] < seen[-1][1] <= len(saved) < 60 and saved["pll"].notna().all()
    # the work a kill loses: what was scored since the last save (--save-every 1 plus a pass and a write; a busy
    # shared machine gets a wide margin: before, it was everything since the start)
    assert (killed_at - out.stat().st_mtime_ns) / 1e9 < 10
    assert main(args) == 0  # resumed
    resumed, _ = read_eta_table(out)
    straight = tmp_path / "straight.parquet"
    summary = score_manifest(read_manifest(m), model, tok, straight, max_pieces=100000, eta_fit="paper",
                             progress=False, device="cpu")
    assert summary["scored"] == 60
    straight, _ = read_eta_table(straight)
    a, b = (t.sort_values("sentence_hash").reset_index(drop=True) for t in (resumed, straight))
    pd.testing.assert_frame_equal(a.drop(columns=["pll", "pll_per_token", "eta"]),
                                  b.drop(columns=["pll", "pll_per_token", "eta"]))
    assert (a["n_scored"] == a["n_tokens"]).all() and (a["n_tokens"] > 700).all()  # every piece scored
    np.testing.assert_allclose(a[["pll", "pll_per_token", "eta"]], b[["pll", "pll_per_token", "eta"]], rtol=1e-9)


@pytest.mark.parametrize("bad", [[""], ["ok.", "   "], "a string", [3], ["ok.", "\u200b"]])
def test_bad_sentences(tiny, bad):
    model, tok = tiny
    with pytest.raises(MedclrError):
        pseudo_log_likelihood(bad, model, tok, progress=False)


def test_model_without_mlm_head(tiny, tmp_path):
    from transformers import BertModel

    _, tok = tiny
    enc = BertModel(_model(tok).config)
    with pytest.raises(MedclrError, match="no masked-LM head"):
        pseudo_log_likelihood(["Heart size is normal."], enc, tok, progress=False)
    # a sentence-embedding style checkpoint: BertModel weights, no cls.* tensors
    enc.save_pretrained(tmp_path / "encoder")
    tok.save_pretrained(tmp_path / "encoder")
    with pytest.raises(MedclrError, match=r"MISSING cls\.predictions"):
        load_masked_lm(tmp_path / "encoder", device="cpu")


def test_load_errors(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(MedclrError, match="not found"):
        load_masked_lm(tmp_path / "nope")
    with pytest.raises(MedclrError, match="medclr lm fit"):
        load_masked_lm("medclr-test-org/surely-not-cached-model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MedclrError, match="config.json"):
        load_masked_lm(tmp_path / "empty")
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(MedclrError, match="is a file"):
        load_masked_lm(tmp_path / "weights.bin")
    # one resolution for the PLL model and the text encoder (medclr.hub)
    import medclr.hub
    import medclr.lm.load
    import medclr.models.text

    assert medclr.lm.load.resolve_model_dir is medclr.models.text.resolve_model_dir is medclr.hub.resolve_model_dir
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=40, bos_token_id=0,
                               eos_token_id=0)).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(MedclrError, match="no masked-LM class"):
        load_masked_lm(tmp_path / "gpt2")
    model, tok = tiny
    model.save_pretrained(tmp_path / "mlm")
    tok.save_pretrained(tmp_path / "mlm")
    m2, t2 = load_masked_lm(tmp_path / "mlm", device="cpu")
    np.testing.assert_allclose(pseudo_log_likelihood(SENTENCES, m2, t2, progress=False),
                               pseudo_log_likelihood(SENTENCES, model, tok, progress=False), atol=1e-5)


# ---------------------------------------------------------------- eta, join, score, fit, calibrate

def _manifest(path, sentences, splits=None, **extra):
    from medclr.data.manifest import write_manifest

    df = pd.DataFrame({"sentences": sentences, "split": splits or ["train"] * len(sentences), **extra})
    write_manifest(df, path)
    return path


def test_eta_formula_norm_and_clip():
    from medclr.lm.eta import eta_from_pll

    pll, n = np.array([-10.0, -2.0, 0.0]), np.array([5, 1, 1])
    np.testing.assert_allclose(eta_from_pll(pll), 0.2 * np.exp(0.35 * pll))
    np.testing.assert_allclose(eta_from_pll(pll, n, norm="mean"), 0.2 * np.exp(0.35 * pll / n))
    np.testing.assert_allclose(eta_from_pll(pll, a=0.9, eta_max=0.5), np.minimum(0.9 * np.exp(0.35 * pll), 0.5))
    for bad in ({"a": 0.0}, {"k": -1.0}, {"eta_max": 1.0}, {"norm": "max"}):
        with pytest.raises(MedclrError):
            eta_from_pll(pll, n, **bad)


def test_join_eta_aligns_with_manifest_sentences():
    from medclr.data.text import sentence_hash
    from medclr.lm.eta import eta_long, join_eta

    manifest = pd.DataFrame({"index": [0, 1, 2], "split": ["train"] * 3,
                             "sentences": [["Heart normal.", "No  effusion."], [], ["No effusion."]]})
    table = pd.DataFrame({"sentence_hash": [sentence_hash("Heart normal."), sentence_hash("No effusion.")],
                          "eta": [0.1, 0.02]})
    got = join_eta(manifest, table)
    assert [g.tolist() for g in got] == [[0.1, 0.02], [], [0.02]]  # whitespace-normalised hash joins
    long = eta_long(manifest, table)
    assert long[["index", "position"]].values.tolist() == [[0, 0], [0, 1], [2, 0]]
    with pytest.raises(MedclrError, match="not in the eta table"):
        join_eta(manifest.assign(sentences=[["Heart normal."], ["Unseen."], []]), table)
    with pytest.raises(MedclrError, match=r"holds no eta value \(NaN\) for 3 manifest sentences.*damaged"):
        join_eta(manifest, table.assign(eta=np.nan))  # in the table, without a value
    assert np.isnan(join_eta(manifest.assign(sentences=[["Unseen."], [], []]), table, missing="nan")[0][0])


def test_score_cli_caches_and_joins(tiny, tmp_path, capsys, caplog):
    from medclr.cli import main
    from medclr.data.manifest import read_manifest
    from medclr.lm.eta import join_eta, read_eta_table

    model, tok = tiny
    model.save_pretrained(tmp_path / "lm")
    tok.save_pretrained(tmp_path / "lm")
    rows = [SENTENCES[:3], SENTENCES[3:5], [SENTENCES[1]]]
    m = _manifest(tmp_path / "m.parquet", rows)
    out = tmp_path / "eta.parquet"
    args = ["lm", "score", "--manifest", str(m), "--model", str(tmp_path / "lm"), "--out", str(out), "--no-progress",
            "--device", "cpu"]
    caplog.set_level("INFO")
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # the log ends on what to run with the table
    assert caplog.records[-1].getMessage() == (f"next: medclr train --config dcl_lm data.manifest={m} data.eta={out} "
                                               "out=RUN (docs/training.md)")
    # 5 distinct sentences and 2 short forms ("Pleural effusion.", "Effusion."), all scored
    assert (first["distinct"], first["short_forms"], first["scored"], first["sentences"]) == (5, 2, 5 + 2, 6)
    table, meta = read_eta_table(out)
    assert list(table.columns)[:8] == ["sentence_hash", "sentence", "count", "n_tokens", "n_scored", "pll",
                                       "pll_per_token", "eta"]
    counts = table.set_index("sentence")["count"]
    assert counts["Pleural effusion."] == counts["Effusion."] == 0 and (counts > 0).sum() == 5
    # default: the paper's a = 0.2, k = 0.35 (the meaning fit is made and kept on record)
    assert meta["eta_params"]["source"] == "paper" and meta["pll_variant"] == "original"
    assert (meta["a"], meta["k"]) == (first["a"], first["k"]) == (0.2, 0.35) and meta["eta_params"]["fit"]["knots_eta"]
    ref = pseudo_log_likelihood(table["sentence"].tolist(), model, tok, progress=False)
    np.testing.assert_allclose(table["pll"], ref, atol=1e-5)
    np.testing.assert_allclose(table["eta"], np.minimum(0.2 * np.exp(0.35 * table["pll"]), 0.5), rtol=1e-12)
    assert counts["Heart size is normal."] == 2
    # --eta-fit meaning (DCL-eta_rule): cached PLLs, eta from the meaning map (tests/test_eta_fit.py checks the fit)
    assert main(args + ["--eta-fit", "meaning"]) == 0
    meaning = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert meaning["scored"] == 0 and meaning["cached"] == 7 and meaning["a"] is None
    table, meta = read_eta_table(out)
    assert meta["eta_params"]["source"] == "meaning" and meta["a"] is None
    from medclr.lm.eta_fit import eta_of_table

    np.testing.assert_allclose(table["eta"], eta_of_table(table, meta["eta_params"], norm="sum", eta_max=0.5)[0])
    joined = join_eta(read_manifest(m), table)
    assert [len(j) for j in joined] == [3, 2, 1] and joined[0][1] == joined[2][0]
    # second run with one new sentence and new a, k: only that sentence is scored, eta recomputed for all
    _manifest(m, rows + [["Calcified granuloma in the left upper lobe."]])
    assert main(args + ["--a", "0.1", "--k", "0.5"]) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert second["scored"] == 1 and second["cached"] == 7  # the new sentence has no short form
    table2, meta2 = read_eta_table(out)
    assert len(table2) == 8 and meta2["a"] == 0.1 and meta2["eta_params"]["source"] == "given"
    np.testing.assert_allclose(table2["eta"], np.minimum(0.1 * np.exp(0.5 * table2["pll"]), 0.5))
    # --rescore: every sentence scored again, none taken from the table
    assert main(args + ["--rescore"]) == 0
    third = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert third["scored"] == 8 and third["cached"] == 0
    # the report: PLL against sentence frequency, over the manifest's sentences (count > 0: not the short forms)
    assert main(["lm", "report", "--eta", str(out), "--out", str(tmp_path / "rep")]) == 0
    rep = json.loads((tmp_path / "rep" / "lm_report.json").read_text())
    assert rep["distinct_sentences"] == 6 and (tmp_path / "rep" / "lm_pll_distribution.png").exists()
    capsys.readouterr()
    # empty sentence in a manifest: one clear line, exit code 1
    _manifest(m, [["Heart size is normal.", "  "]])
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "row 0 sentence 1 is empty" in err[0]


def test_score_cli_refuses_a_foreign_out_before_the_model_loads(tiny, tmp_path, capsys):
    """`medclr lm score` with a file at --out that is not an eta table: one line, exit 1, before the model loads
    (--model names nothing here), the file byte for byte intact, with --rescore too; --overwrite replaces it and
    the table it writes is resumed by the next run."""
    from medclr.cli import main
    from medclr.lm.eta import read_eta_table

    m = _manifest(tmp_path / "m.parquet", [SENTENCES[:3]])
    out = tmp_path / "eta.parquet"
    held = b"sentence,eta\nmy own table,0.1\n"
    out.write_bytes(held)
    base = ["lm", "score", "--manifest", str(m), "--out", str(out), "--no-progress", "--device", "cpu"]
    for extra in ([], ["--rescore"]):
        assert main(base + ["--model", str(tmp_path / "no_model")] + extra) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "the file there is not an eta table" in err[0] and "--overwrite" in err[0], err
        assert out.read_bytes() == held
    model, tok = tiny
    model.save_pretrained(tmp_path / "lm")
    tok.save_pretrained(tmp_path / "lm")
    args = base + ["--model", str(tmp_path / "lm")]
    assert main(args + ["--overwrite"]) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["scored"] > 0 and first["cached"] == 0 and len(read_eta_table(out)[0]) == first["scored"]
    assert main(args) == 0  # our own table now: resumed, nothing scored again
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (again["scored"], again["cached"]) == (0, first["scored"])


def test_fit_saves_a_loadable_seeded_model(tmp_path):
    from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

    from medclr.lm.fit import FitConfig, fit_lm

    cfg = FitConfig(vocab_size=200, layers=1, hidden=32, heads=2, max_length=32, epochs=2, batch_size=8, max_minutes=1,
                    device="cpu")
    rep = fit_lm(CORPUS, tmp_path / "a", cfg, val_sentences=CORPUS[:5], progress=False)
    assert rep.steps == 8 and rep.stopped_by == "epochs" and rep.val_loss is not None
    assert rep.device == "cpu" and 0 < rep.train_seconds <= rep.seconds
    info = json.loads((tmp_path / "a" / "medclr_lm.json").read_text())
    assert info["config"]["layers"] == 1 and info["report"]["n_train_sentences"] == len(CORPUS)
    mlm = AutoModelForMaskedLM.from_pretrained(tmp_path / "a", local_files_only=True)
    tok = AutoTokenizer.from_pretrained(tmp_path / "a", local_files_only=True)
    enc = AutoModel.from_pretrained(tmp_path / "a", local_files_only=True)
    assert type(mlm).__name__ == "BertForMaskedLM" and type(enc).__name__ == "BertModel"
    assert tok.model_max_length == 32 and tok.tokenize("Pleural effusion.")[0] == "pleural"
    m2, t2 = load_masked_lm(tmp_path / "a", device="cpu")
    assert np.all(pseudo_log_likelihood(["Heart size is normal."], m2, t2, progress=False) < 0)
    fit_lm(CORPUS, tmp_path / "b", cfg, progress=False)  # same seed -> same weights
    b = AutoModelForMaskedLM.from_pretrained(tmp_path / "b", local_files_only=True)
    for (n1, p1), (_, p2) in zip(mlm.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p1, p2), n1
    with pytest.raises(MedclrError, match="--overwrite"):
        fit_lm(CORPUS, tmp_path / "a", cfg, progress=False)
    with pytest.raises(MedclrError, match="corpus"):
        fit_lm(CORPUS[:3], tmp_path / "c", cfg, progress=False)
    if not torch.cuda.is_available():
        with pytest.raises(MedclrError, match="--device cuda: no CUDA device"):
            fit_lm(CORPUS, tmp_path / "d", dataclasses.replace(cfg, device="cuda"), progress=False)
    # the command: the same fit, and the corpus's data-quality summary beside the model
    from medclr.cli import main

    m = _manifest(tmp_path / "m.parquet", [[s] for s in CORPUS] + [[CORPUS[0]]])
    assert main(["lm", "fit", "--manifest", str(m), "--split", "all", "--out", str(tmp_path / "e"), "--vocab-size",
                 "200", "--layers", "1", "--hidden", "32", "--heads", "2", "--max-length", "32", "--epochs", "1",
                 "--batch-size", "8", "--device", "cpu", "--no-progress"]) == 0
    quality = json.loads((tmp_path / "e" / "data_quality.json").read_text())
    assert quality["rows"] == len(CORPUS) + 1 and quality["repeated_report_rows"] >= 2


def _fit_parts(seed=0, device="cpu"):
    from medclr.lm.fit import FitConfig, build_model, build_optimizer, tokenize_corpus, train_tokenizer

    cfg = FitConfig(vocab_size=200, layers=1, hidden=32, heads=2, max_length=32, batch_size=8, seed=seed, device=device)
    tok = train_tokenizer(CORPUS, cfg.vocab_size, cfg.min_frequency, cfg.max_length)
    corpus = tokenize_corpus(tok, CORPUS, cfg.max_length, torch.device(device))
    torch.manual_seed(seed)
    model = build_model(cfg, tok).to(device)
    return cfg, tok, corpus, model, build_optimizer(model, cfg)


def test_fit_same_seed_same_loss_sequence():
    from medclr.lm.fit import train_steps

    def run(seed):
        cfg, _, corpus, model, opt = _fit_parts(seed)
        return train_steps(model, opt, corpus, cfg, 12)

    runs = [run(seed) for seed in (0, 0, 1)]
    assert runs[0].steps == 12 and len(runs[0].losses) == 12 and all(np.isfinite(runs[0].losses))
    assert runs[0].losses == runs[1].losses  # exactly: same batches, masks, dropout and updates
    assert runs[0].losses != runs[2].losses


def test_tokenize_corpus_pads_and_protects_special_tokens():
    cfg, tok, corpus, _, _ = _fit_parts()
    enc = tok(CORPUS, truncation=True, max_length=cfg.max_length)
    assert corpus.lengths.tolist() == [len(x) for x in enc["input_ids"]] and corpus.vocab_size == len(tok)
    for row, ids in enumerate(enc["input_ids"]):
        n = len(ids)
        assert corpus.ids[row, :n].tolist() == ids and (corpus.ids[row, n:] == tok.pad_token_id).all()
        assert corpus.attention[row].tolist() == [1] * n + [0] * (corpus.ids.shape[1] - n)
        # [CLS], [SEP] and padding are never masked; every word piece can be
        assert corpus.no_mask[row].tolist() == [True] + [False] * (n - 2) + [True] * (corpus.ids.shape[1] - n + 1)


def test_mask_tokens_draws_what_the_transformers_collator_draws():
    from transformers import DataCollatorForLanguageModeling

    from medclr.lm.fit import mask_tokens

    cfg, tok, corpus, _, _ = _fit_parts()
    enc = tok(CORPUS, truncation=True, max_length=cfg.max_length, return_special_tokens_mask=True)
    examples = [{"input_ids": i, "special_tokens_mask": m} for i, m in zip(enc["input_ids"], enc["special_tokens_mask"])]
    collator = DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=0.15, seed=7)
    g = torch.Generator().manual_seed(7)
    for start in (0, 8, 16):  # consecutive batches: the generator's stream stays in step
        rows = slice(start, start + 8)
        want = collator(examples[rows])
        width = int(corpus.lengths[rows].max())
        inputs, labels = mask_tokens(corpus.ids[rows, :width], corpus.no_mask[rows, :width], 0.15, tok.mask_token_id,
                                     len(tok), g)
        assert torch.equal(inputs, want["input_ids"]) and torch.equal(labels, want["labels"])
        assert (labels != -100).any()


def test_mask_tokens_80_10_10_and_never_special_or_padding():
    from medclr.lm.fit import IGNORE, mask_tokens

    rng = np.random.default_rng(0)
    rows, width, vocab, mask_id = 4000, 64, 1000, 4
    lengths = rng.integers(3, width + 1, rows)
    pos = np.arange(width)
    ids = torch.from_numpy(rng.integers(5, vocab, (rows, width)))
    ids[:, 0] = 2  # [CLS]
    ids[torch.from_numpy(pos == lengths[:, None] - 1)] = 3  # [SEP]
    pad = torch.from_numpy(pos >= lengths[:, None])
    ids[pad] = 0
    no_mask = torch.from_numpy((pos == 0) | (pos >= lengths[:, None] - 1))
    inputs, labels = mask_tokens(ids, no_mask, 0.15, mask_id, vocab, torch.Generator().manual_seed(0))
    chosen = labels != IGNORE
    n_free, n_chosen = int((~no_mask).sum()), int(chosen.sum())
    assert not chosen[no_mask].any() and torch.equal(inputs[no_mask], ids[no_mask])  # special tokens, padding
    assert torch.equal(labels[chosen], ids[chosen]) and torch.equal(inputs[~chosen], ids[~chosen])
    # binomial tolerances: 6 standard deviations at these counts (~30,000 chosen of ~200,000)
    assert abs(n_chosen / n_free - 0.15) < 6 * np.sqrt(0.15 * 0.85 / n_free)
    as_mask = float((inputs[chosen] == mask_id).float().mean())
    changed = inputs[chosen] != ids[chosen]
    as_random = float((changed & (inputs[chosen] != mask_id)).float().mean())
    kept = float((~changed).float().mean())
    tol = 6 * np.sqrt(0.1 * 0.9 / n_chosen)
    assert abs(as_mask - 0.8) < 6 * np.sqrt(0.16 / n_chosen)
    # a random token equals the original with chance ~1/vocab: 'kept' gains that sliver of the 10 %
    assert abs(as_random - 0.1 * (1 - 1 / vocab)) < tol and abs(kept - (0.1 + 0.1 / vocab)) < tol
    random_tokens = inputs[chosen][changed & (inputs[chosen] != mask_id)]
    assert 0 <= int(random_tokens.min()) and int(random_tokens.max()) < vocab


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fit_on_cuda(tmp_path):
    from medclr.lm.fit import FitConfig, fit_lm

    cfg = FitConfig(vocab_size=200, layers=1, hidden=32, heads=2, max_length=32, epochs=2, batch_size=8, device="cuda")
    rep = fit_lm(CORPUS, tmp_path / "a", cfg, val_sentences=CORPUS[:5], progress=False)
    assert rep.device.startswith("cuda") and rep.steps == 8 and np.isfinite(rep.val_loss)
    m2, t2 = load_masked_lm(tmp_path / "a", device="cpu")
    assert np.all(pseudo_log_likelihood(["Heart size is normal."], m2, t2, progress=False) < 0)


def test_calibrate_against_q_and_rho_sent(tmp_path):
    """A table whose eta is exactly rho_sent (by construction) scores 1 / 1 / 0 against it; the paper's a, k do
    not; every variant is also reported against q, and the json, csv and plot carry both."""
    from medclr.data.text import sentence_hash
    from medclr.lm.calibrate import GROUND_TRUTH, ORACLES, STAT_KEYS, calibrate
    from medclr.phantom.sentence_keys import sentence_key

    wordings = ["No pneumothorax.", "Small left pleural effusion.", "The lungs are clear.", "Mild cardiomegaly.",
                "Right lower lobe pneumonia.", "Large right pneumothorax.", "Pulmonary edema.", "No pleural effusion."]
    rng = np.random.default_rng(0)
    weights = np.geomspace(8, 1, 8)
    rows = [list(rng.choice(wordings, size=int(rng.integers(1, 4)), replace=False, p=weights / weights.sum()))
            for _ in range(120)]
    rows = [[str(x) for x in r] for r in rows]
    splits = ["train" if i % 4 else "test" for i in range(120)]
    # each study's latent class: what its report asserts ("normal" when it asserts nothing)
    classes = ["|".join(sorted({sentence_key(x)[1:] for x in r if sentence_key(x).startswith("+")})) or "normal"
               for r in rows]
    manifest = pd.DataFrame({"index": np.arange(120), "split": splits, "sentences": rows,
                             "latent_class": classes, "latent_class_prob": np.linspace(0.01, 0.3, 120)})
    train = [r for r, sp in zip(rows, splits) if sp == "train"]
    mass = {}
    for r in train:  # rho_sent by brute force: uniform reports, uniform sentences
        for x in r:
            mass[sentence_key(x)] = mass.get(sentence_key(x), 0.0) + 1.0 / (len(train) * len(r))
    a, k = 0.5, 0.2
    sents = sorted({x for r in rows for x in r})
    rho = np.array([mass[sentence_key(x)] for x in sents])
    pll = (np.log(rho) - np.log(a)) / k
    table = pd.DataFrame({"sentence_hash": [sentence_hash(x) for x in sents], "sentence": sents, "count": 1,
                          "n_tokens": 4, "n_scored": 4, "pll": pll, "pll_per_token": pll / 4, "eta": rho})
    res = calibrate(manifest, table, tmp_path / "cal", eta_meta={"norm": "sum", "eta_max": 0.5})
    assert set(res["variants"]) == {"table", "paper", "rule", "sentence_fit", "constant 0.05", "constant 0.1"}
    t = res["variants"]["table"]["rho_sent"]
    assert t["mean_ratio"] == pytest.approx(1.0) and t["spearman"] == pytest.approx(1.0)
    assert t["median_abs_log_ratio"] == pytest.approx(0.0, abs=1e-12) and t["misspecification"] == pytest.approx(0.0)
    assert res["variants"]["paper"]["rho_sent"]["median_abs_log_ratio"] > 0.5
    for v in res["variants"].values():
        assert all(set(v[o]) == set(STAT_KEYS) for o in ORACLES)
        assert np.isfinite(v["q"]["mean_ratio"]) and np.isfinite(v["q"]["misspecification"])
    assert res["variants"]["constant 0.1"]["q"]["mean_ratio"] == pytest.approx(0.1 / res["mean_q"])
    assert res["mean_rho"] == pytest.approx(sum(mass[sentence_key(x)] / (len(train) * len(r)) for r in train
                                                for x in r))
    assert 0 < res["mean_q"] < 1 and -1 <= res["spearman_q_rho"] <= 1 and res["eta_max"] == 0.5
    assert res["n_keys"] == len({sentence_key(x) for r in train for x in r}) and "study" in res
    assert (tmp_path / "cal" / "calibration.png").stat().st_size > 10_000
    per_key = pd.read_csv(tmp_path / "cal" / "per_key.csv")
    assert len(per_key) == res["n_keys"] and {"q", "rho"} <= set(per_key)
    assert set(res["reliability"]) == {"table", "paper", "rule"}
    assert set(res["reliability"]["table"]) == {"eta", "q", "rho_sent", "weight"}
    with pytest.raises(MedclrError, match="latent_class"):
        calibrate(manifest.drop(columns=["latent_class"]), table, tmp_path / "cal2")
    # ground truth from a separate table (the phantom's), joined on dicom_id
    from medclr.data.groundtruth import attach_ground_truth
    from medclr.lm.calibrate import GROUND_TRUTH_JOIN

    ids = [f"d{i}" for i in range(120)]
    manifest["dicom_id"] = ids
    prior = manifest["latent_class_prob"].tolist()
    pd.DataFrame({"dicom_id": ids[::-1], "latent_class": ["c"] * 120, "latent_class_prob": prior[::-1]}).to_parquet(
        tmp_path / "gt.parquet")
    joined = attach_ground_truth(manifest.drop(columns=list(GROUND_TRUTH)), tmp_path / "gt.parquet", **GROUND_TRUTH_JOIN)
    assert joined["latent_class_prob"].tolist() == prior
    with pytest.raises(MedclrError, match="not found"):
        attach_ground_truth(manifest, tmp_path / "missing.parquet", **GROUND_TRUTH_JOIN)


@pytest.mark.parametrize("study_sampling", ["uniform", "findings"])
def test_sentence_pairs_q_is_the_false_negative_rate(study_sampling):
    """q of each training pair = sum over the training studies of P(study) * [the sentence is true of it], by a
    float64 loop; the test row counts neither as a pair nor as a study."""
    from medclr.data.pairs import study_weights
    from medclr.data.text import sentence_hash
    from medclr.lm.calibrate import sentence_pairs
    from medclr.lm.eta import TABLE_COLUMNS
    from medclr.phantom.sentence_keys import key_holds, sentence_key

    rows = [(["No pneumothorax.", "The lungs are clear."], "normal", "train"),
            (["Small left pleural effusion.", "No pneumothorax."], "pleural_effusion:left", "train"),
            (["The heart is enlarged.", "No pneumothorax."], "cardiomegaly", "train"),
            (["The heart is enlarged.", "Small left pleural effusion."], "cardiomegaly|pleural_effusion:left", "train"),
            (["No pneumothorax."], "normal", "train"),
            (["The lungs are clear.", "The heart is enlarged."], "cardiomegaly", "train"),  # "normal" by its report
            (["Small left pleural effusion."], "pleural_effusion:bilateral", "train"),
            (["The lungs are clear."], "pleural_effusion:left", "test")]
    manifest = pd.DataFrame({"index": np.arange(len(rows)) + 10, "sentences": [r[0] for r in rows],
                             "latent_class": [r[1] for r in rows], "split": [r[2] for r in rows]})
    assert [sentence_key(s) for s in ("No pneumothorax.", "Small left pleural effusion.", "The heart is enlarged.",
                                      "The lungs are clear.")] == ["-pneumothorax", "+pleural_effusion:left",
                                                                   "+cardiomegaly", "normal"]
    sents = sorted({s for r in rows for s in r[0]})
    table = pd.DataFrame({"sentence_hash": [sentence_hash(s) for s in sents], "sentence": sents, "count": 1,
                          "n_tokens": 5, "n_scored": 5, "pll": -np.arange(1.0, len(sents) + 1), "pll_per_token": 0.0,
                          "eta": 0.05})[TABLE_COLUMNS]
    sampling = {"study_sampling": study_sampling, "study_balance": 1.0}
    p = sentence_pairs(manifest, table, "sum", "train", sampling)
    train = [r for r in rows if r[2] == "train"]
    w = study_weights([r[0] for r in train], study_sampling, 1.0)
    w = np.ones(len(train)) if w is None else np.asarray(w, dtype=np.float64)
    w = w / w.sum()
    own = [frozenset(sentence_key(s) for s in r[0]) for r in train]
    want = [sum(float(wj) * key_holds(sentence_key(s), r[1], keys) for wj, r, keys in zip(w, train, own))
            for r in train for s in r[0]]
    assert p["sentence"].tolist() == [s for r in train for s in r[0]]
    np.testing.assert_allclose(p["q"].to_numpy(), want, rtol=1e-12, atol=0)
    if study_sampling == "uniform":  # by hand: left effusion in studies 1, 3 and 6 (bilateral); "normal" in 0, 4, 5
        q = dict(zip(p["sentence"], p["q"]))
        assert q["Small left pleural effusion."] == pytest.approx(3 / 7)
        assert q["The lungs are clear."] == pytest.approx(3 / 7) and q["No pneumothorax."] == pytest.approx(1.0)
    with pytest.raises(MedclrError, match="latent_class"):
        sentence_pairs(manifest.drop(columns=["latent_class"]), table, "sum", "train")
    with pytest.raises(MedclrError, match="latent_class"):
        sentence_pairs(manifest.assign(latent_class=[None] + [r[1] for r in rows[1:]]), table, "sum", "train")
