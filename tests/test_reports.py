"""Tables 1–3, figures and the HTML page from synthetic eval/loss/caption/attention/detection files."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
import yaml

from r2m import params as P
from r2m.params import TRAIN_STAGES, VARIANT_NAMES
from r2m.reports import figures, html, plots, tables
from r2m.stage import registry as S
from r2m.stage.context import StageContext

DATASETS = ["tiny", "coco_shutterstock"]


def fake_metrics(seed: float, spice: bool = False) -> dict:
    m = {"Bleu_1": 0.4 + seed, "Bleu_2": 0.25, "Bleu_3": 0.12345, "Bleu_4": 0.0649,
         "METEOR": 0.13, "ROUGE_L": 0.3131, "CIDEr": 0.2904, "SPICE": 0.091 if spice else None}
    return m


def make_params(repo_root: Path, datasets=DATASETS, variants=VARIANT_NAMES, **report) -> P.Params:
    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    raw["datasets"] = list(datasets)
    raw["variants"] = list(variants)
    raw["report"] = {"figure_images": 2, "attention_image": None, **report}
    return P.validate(raw)


def ctx_for(stage: str, params: P.Params, root: Path, **axes) -> StageContext:
    if "dataset" in axes:
        params = P.for_dataset(params, axes["dataset"])
    return StageContext(stage=S.get(stage), params=params, root=root, **axes)


def write_evals(root: Path, datasets=DATASETS, skip: tuple = ()) -> None:
    for ds in datasets:
        for v in VARIANT_NAMES:
            for k, ck in enumerate(TRAIN_STAGES):
                if (ds, v, ck) in skip:
                    continue
                p = root / f"results/{ds}/{v}/s0/{ck}/eval.json"
                p.parent.mkdir(parents=True, exist_ok=True)
                metrics = fake_metrics(0.001 * k + 0.01 * VARIANT_NAMES.index(v))
                p.write_text(json.dumps(metrics))
                write_stats(p.parent / "per_image.parquet", random_stats(8, seed=k), metrics)


BLEU = ("bleu_testlen", "bleu_reflen", *(f"bleu_guess_{n}" for n in range(1, 5)),
        *(f"bleu_correct_{n}" for n in range(1, 5)))


def random_stats(n: int, seed: int = 0, ids=None):
    """Per-image statistics of ``n`` images (BLEU counts, ROUGE-L, CIDEr, concepts; no METEOR)."""
    import numpy as np

    from r2m.evaluation.bootstrap import PerImage

    rng = np.random.default_rng(seed)
    length = rng.integers(6, 12, n).astype(float)
    guess = np.stack([np.maximum(length - k, 0) for k in range(4)])
    correct = np.floor(guess * rng.uniform(0.1, 0.8, (4, n)))
    cols = {"bleu_testlen": length, "bleu_reflen": length + rng.integers(-2, 3, n)}
    cols.update({f"bleu_guess_{k + 1}": guess[k] for k in range(4)})
    cols.update({f"bleu_correct_{k + 1}": correct[k] for k in range(4)})
    cols.update({"ROUGE_L": rng.uniform(0.1, 0.6, n), "CIDEr": rng.uniform(0.0, 1.5, n),
                 "concept_given": rng.integers(0, 4, n).astype(float)})
    cols["concept_named"] = np.floor(cols["concept_given"] * rng.uniform(0, 1, n))
    return PerImage(tuple(ids or (f"img{i}" for i in range(n))), cols)


def write_stats(path: Path, stats, metrics: dict) -> None:
    from r2m.evaluation import per_image

    per_image.write(path, stats, {"metrics": metrics})


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# --------------------------------------------------------------------------- tables
def test_table1(tmp_path, repo_root):
    write_evals(tmp_path)
    ctx = ctx_for("table1", make_params(repo_root), tmp_path)
    tables.table1(ctx)
    rows = read_csv(tmp_path / "reports/table1.csv")
    metric_cols = ["B-1", "B-2", "B-3", "B-4", "M", "R", "C", "S", "CR", "CR≥1"]
    assert list(rows[0]) == ["dataset", "method", "source", *(x for c in metric_cols for x in (c, f"{c}_lo", f"{c}_hi")),
                             "seeds", "images", "interval", "split", "vs", "d_seeds",
                             *(x for c in metric_cols for x in (f"d_{c}", f"d_{c}_lo", f"d_{c}_hi", f"d_{c}_p",
                                                                f"d_{c}_holm", f"d_{c}_mark", f"d_{c}_mde")),
                             "note"]
    tiny = [r for r in rows if r["dataset"] == "tiny"]
    assert len(tiny) == 1 and tiny[0]["source"] == "this run"  # no published rows for tiny
    ours = tiny[0]
    assert (ours["B-1"], ours["B-3"], ours["B-4"], ours["R"], ours["C"], ours["S"]) == (
        "40.3", "12.3", "6.5", "31.3", "29.0", "")  # x100, one decimal, missing SPICE empty
    cs = [r for r in rows if r["dataset"] == "MSCOCO↔Shutterstock"]
    assert [(r["method"], r["source"]) for r in cs] == [
        ("UC-GAN", "published"), ("R2M", "published"), ("R2M", "this run")]
    assert cs[0]["B-3"] == "11.2" and cs[1]["C"] == "29.0" and cs[1]["S"] == "9.1"
    md = (tmp_path / "reports/table1.md").read_text()
    assert "# Table 1" in md and "| MSCOCO↔Shutterstock | UC-GAN | published | 41.0 |" in md
    assert re.search(r"\| tiny \| R2M \| this run \| 40\.3 \[[\d.]+, [\d.]+\] \|", md)
    assert (ours["seeds"], ours["images"], ours["interval"]) == ("1", "8", "t over images")
    assert "CR = concept recall" in md


def test_table1_concept_recall_cells(tmp_path, repo_root):
    write_evals(tmp_path)
    p = tmp_path / "results/tiny/r2m/s0/train_i/eval.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), "concept_recall": 0.4567, "concept_any": 0.75}))
    tables.table1(ctx_for("table1", make_params(repo_root), tmp_path))
    rows = read_csv(tmp_path / "reports/table1.csv")
    ours = next(r for r in rows if r["dataset"] == "tiny")
    assert (ours["CR"], ours["CR≥1"]) == ("45.7", "75.0")
    assert all(r["CR"] == "" for r in rows if r["source"] == "published")


def test_table1_published_sme_gan_blanks(tmp_path, repo_root):
    write_evals(tmp_path, ["flickr30k_coco"])
    tables.table1(ctx_for("table1", make_params(repo_root, ["flickr30k_coco"]), tmp_path))
    sme = read_csv(tmp_path / "reports/table1.csv")[0]
    assert sme["method"] == "SME-GAN" and sme["B-1"] == "" and sme["B-4"] == "7.9"


def test_table2_and_table3(tmp_path, repo_root):
    write_evals(tmp_path)
    params = make_params(repo_root)
    tables.table2(ctx_for("table2", params, tmp_path))
    tables.table3(ctx_for("table3", params, tmp_path))
    t2 = read_csv(tmp_path / "reports/table2.csv")
    labels = ["D w/o FM", "D w/o Memory in RM", "R w/o Memory in RM", "D&R w/o Memory in RM", "R2M"]
    assert [r["method"] for r in t2 if r["dataset"] == "tiny"] == labels
    cs = [r for r in t2 if r["dataset"] == "MSCOCO↔Shutterstock"]
    assert len(cs) == 10 and cs[0]["source"] == "published" and cs[0]["B-1"] == "33.0"
    assert cs[1]["source"] == "this run" and cs[1]["B-1"] == "41.3"  # no_fm (index 1), train_i (3): 0.4 + 0.01 + 0.003
    t3 = read_csv(tmp_path / "reports/table3.csv")
    assert [r["method"] for r in t3 if r["dataset"] == "tiny"] == ["L_XE", "+L_rec^S", "+L_M^I", "+L_rec^I"]
    assert [r["vs"] for r in t3 if r["dataset"] == "tiny"] == ["", "L_XE", "+L_rec^S", "+L_M^I"]  # the stage before
    assert all(r["d_C_mark"] in ("*", "n.s.") for r in t3 if r["vs"])
    pub = [r for r in t3 if r["source"] == "published"]
    assert [r["C"] for r in pub] == ["25.4", "27.0", "28.9", "29.0"]
    assert "# Table 3" in (tmp_path / "reports/table3.md").read_text()


def test_table_missing_eval_names_file(tmp_path, repo_root):
    write_evals(tmp_path, skip=(("tiny", "d_lstm", "train_i"),))
    with pytest.raises(FileNotFoundError, match=r"results/tiny/d_lstm/s0/train_i/eval\.json.*variant=d_lstm"):
        tables.table2(ctx_for("table2", make_params(repo_root), tmp_path))


def test_table_bad_eval_names_file(tmp_path, repo_root):
    write_evals(tmp_path)
    bad = tmp_path / "results/tiny/r2m/s0/train_i/eval.json"
    bad.write_text(json.dumps({"Bleu_1": "high"}))
    with pytest.raises(ValueError, match=r"eval\.json: metric 'Bleu_1' must be a number"):
        tables.table1(ctx_for("table1", make_params(repo_root), tmp_path))


def test_fmt():
    assert tables.fmt(None) == "" and tables.fmt(float("nan")) == "" and tables.fmt(6.449) == "6.4"


# --------------------------------------------------------------------------- figures + page
def write_figure_inputs(root: Path, ds: str = "tiny", attention: bool = True) -> list[str]:
    import numpy as np
    import pandas as pd
    from PIL import Image

    prepared = root / f"data/{ds}/prepared"
    (prepared / "images").mkdir(parents=True)
    ids = ["img1", "img2", "img3"]
    rng = np.random.default_rng(0)
    for i in ids[:2]:  # img3's file is missing on purpose
        Image.fromarray(rng.integers(0, 255, (40, 60, 3), dtype=np.uint8)).save(prepared / f"images/{i}.png")
    pd.DataFrame({"image_id": ids, "path": [f"images/{i}.png" for i in ids], "split": "test"}).to_parquet(
        prepared / "images.parquet")
    refs = {"images": [{"id": i} for i in ids],
            "annotations": [{"id": n, "image_id": i, "caption": f"a dog on the grass {n} <b>"}
                            for n, i in enumerate(ids * 2)]}
    (prepared.parent / "references").mkdir()
    (prepared.parent / "references/references.json").write_text(json.dumps(refs))
    conc = root / f"data/{ds}/concepts"
    conc.mkdir(parents=True)
    pd.DataFrame({"image_id": ["img1", "img1", "img1", "img2"], "label": ["Dog", "Grass", "Phone", "Cat"],
                  "concept": ["dog", "grass", "phone", "cat"], "score": [0.9, 0.5, 0.2, 0.75],
                  "x1": 0.0, "y1": 0.0, "x2": 1.0, "y2": 1.0}).to_parquet(conc / "detections.parquet")
    for v in ("r2m", "no_fm"):
        for k, ck in enumerate(TRAIN_STAGES):
            R = root / f"results/{ds}/{v}/s0/{ck}"
            R.mkdir(parents=True, exist_ok=True)
            lines = ["step\tsplit\tloss\tlr"] + [f"{s}\ttrain\t{3.0 / (s + 1) + k}\t0.001" for s in range(0, 50, 5)]
            lines += [f"{s}\tval\t{3.2 / (s + 1) + k}\t" for s in (20, 40)]
            (R / "loss.tsv").write_text("\n".join(lines) + "\n")
            if v == "r2m":
                (R / "captions.json").write_text(json.dumps(
                    [{"image_id": i, "caption": f"a dog at stage {k + 1} costs $5"} for i in ids]))
    if attention:
        steps = [{"t": t, "input": w_in, "output": w_out,
                  "fm": [[[0.7, 0.3], [0.4, 0.6]], [[0.9, 0.1], [0.5, 0.5]]],
                  "rm": [[[0.2 + 0.1 * t, 0.8 - 0.1 * t]], [[0.5, 0.5]]]}
                 for t, (w_in, w_out) in enumerate(zip(["<#start>", "a", "dog"], ["a", "dog", "<#end>"], strict=True))]
        att = {"dataset": ds, "variant": "r2m", "ckpt": "train_i", "heads": 2, "memory_slots": 1,
               "fm_tokens": ["v", "w_prev"], "rm_keys": ["M0", "f"],
               "images": [{"image_id": "img2", "concepts": ["cat"], "caption": "a dog", "steps": steps}]}
        (root / f"results/{ds}/r2m/s0/train_i/attention.json").write_text(json.dumps(att))
    return ids


def test_figures(tmp_path, repo_root):
    write_figure_inputs(tmp_path)
    params = make_params(repo_root, ["tiny"], ["r2m", "no_fm"], attention_image="img2")
    ctx = ctx_for("figures", params, tmp_path, dataset="tiny")
    figures.run(ctx)
    out = tmp_path / "reports/figures/tiny"
    idx = json.loads((out / "index.json").read_text())
    assert [f["file"] for f in idx["figures"]] == ["losses.png", "attention.png", "examples.png"]
    for f in idx["figures"]:
        assert (out / f["file"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ex = idx["examples"]
    assert [e["image_id"] for e in ex] == ["img2", "img1"]  # attention image first, then caption order
    assert ex[1]["concepts"] == [{"concept": "dog", "score": 0.9}, {"concept": "grass", "score": 0.5}]
    assert [c["label"] for c in ex[0]["captions"]] == ["L_XE", "+L_rec^S", "+L_M^I", "+L_rec^I"]
    assert ex[0]["captions"][3]["caption"] == "a dog at stage 4 costs $5"
    assert len(ex[0]["references"]) == 2 and (out / ex[0]["thumbnail"]).exists()
    assert (out / "params.yaml").exists()
    # no_fm's loss curves missing for a stage are fine; all present here -> no notes
    assert idx["notes"] == []


def test_figures_without_optional_inputs(tmp_path, repo_root):
    write_figure_inputs(tmp_path, attention=False)
    (tmp_path / "results/tiny/no_fm/s0/train_m/loss.tsv").unlink()
    params = make_params(repo_root, ["tiny"], ["r2m", "no_fm"], figure_images=3)
    figures.run(ctx_for("figures", params, tmp_path, dataset="tiny"))
    idx = json.loads((tmp_path / "reports/figures/tiny/index.json").read_text())
    assert [f["file"] for f in idx["figures"]] == ["losses.png", "examples.png"]
    notes = " ".join(idx["notes"])
    assert "attention.json missing" in notes and "loss curves missing" in notes and "no_fm/s0/train_m" in notes
    assert "image img3: file unavailable" in notes
    assert idx["examples"][2]["thumbnail"] is None


def test_attention_matrices():
    steps = [{"fm": [[[0.7, 0.3], [0.4, 0.6]], [[0.9, 0.1], [0.5, 0.5]]], "rm": [[[0.25, 0.75]], [[1.0, 0.0]]]}]
    assert plots.fm_matrix(steps) == [[pytest.approx(0.625)], [pytest.approx(0.375)]]
    assert plots.rm_matrices(steps) == [[[0.25], [0.75]], [[1.0], [0.0]]]


def test_html_page(tmp_path, repo_root):
    write_evals(tmp_path)
    write_figure_inputs(tmp_path)
    params = make_params(repo_root)
    for name in ("table1", "table2", "table3"):
        tables.make_table(ctx_for(name, params, tmp_path), name)
    figures.run(ctx_for("figures", params, tmp_path, dataset="tiny"))  # coco_shutterstock: no figures
    html.run(ctx_for("report", params, tmp_path))
    page = (tmp_path / "reports/index.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page and "<script" not in page
    for n in (1, 2, 3):
        assert f"Table {n}:" in page
    assert "UC-GAN" in page and "D&amp;R w/o Memory in RM" in page and "+L_rec^I" in page
    srcs = re.findall(r'(?:src|href)="([^"#]+)"', page)
    assert "figures/tiny/losses.png" in srcs and "figures/tiny/attention.png" in srcs
    for s in srcs:
        assert (tmp_path / "reports" / s).exists(), s
    assert "&lt;b&gt;" in page  # captions escaped
    # every number of this run with its interval, the paired differences, one sentence per table
    assert re.search(r'<td class="num">29\.0<br><small class="ci">\[[\d.]+, [\d.]+\]</small></td>', page)
    assert page.count("<b>Differences</b>") == 2  # Tables 2 and 3 (Table 1 compares nothing)
    assert page.count("seed(s) and 8 test images each; 95 % intervals: t over images.") == 3
    assert "reports/figures/coco_shutterstock/index.json is missing" in page


def test_claim_cards_show_a_new_column_and_leave_out_an_absent_one(tmp_path):
    """One card per claims.csv row, verdict first; a column the page has no label for (``mde``) shows in the
    card's details under its own name; a row without a difference, interval, p or note gives no empty line."""
    path = tmp_path / "claims.csv"
    path.write_text("claim,dataset,statement,verdict,difference,low,high,p_adjusted,mde,note\n"
                    't2.no_fm,demo,D w/o FM scores below R2M,unresolved,-3.5,-9.0,2.0,0.21,4.2,"few images & seeds"\n'
                    "t3.match,demo,+L_M^I scores above +L_rec^S,supported,,,,,,\n")
    page = html.render_page({}, [], tmp_path / "index.html", claims=path)
    cards = re.findall(r'<article class="claim (\w+)" id="([^"]+)">(.*?)</article>', page, re.S)
    assert [(cls, card_id) for cls, card_id, _ in cards] == [("unresolved", "claim-t2.no_fm-demo"),
                                                           ("supported", "claim-t3.match-demo")]
    first, second = cards[0][2], cards[1][2]
    assert re.match(r'\s*<p class="claim-head"><span class="verdict unresolved">unresolved</span>', first)
    assert "D w/o FM scores below R2M" in first and "difference \u00d7 100" in first and "-3.5 [-9.0, 2.0]" in first
    assert '<span class="k">adjusted p</span> <span class="v">0.21</span>' in first
    assert "<dt>mde</dt><dd>4.2</dd>" in first and "few images &amp; seeds" in first
    assert re.match(r'\s*<p class="claim-head"><span class="verdict supported">supported</span>', second)
    assert 'class="effect"' not in second and "claim-note" not in second
    assert re.findall(r"<dt>(.*?)</dt>", second) == ["Claim"]  # its id only


def test_table1_always_lists_the_papers_targets():
    from r2m.reports.tables import TABLES, build_rows

    metrics = {"Bleu_1": 0.5, "Bleu_2": 0.3, "Bleu_3": 0.2, "Bleu_4": 0.1, "METEOR": 0.1,
               "ROUGE_L": 0.3, "CIDEr": 0.2, "SPICE": None}
    rows = build_rows(TABLES["table1"], ["demo"], ["r2m"], {("demo", "r2m"): metrics})
    assert rows[0][:3] == ["demo", "R2M", "this run"] and rows[0][3] == "50.0"
    published = [r for r in rows if r[2] == "published"]
    assert len(published) == 6 and {r[1] for r in published} == {"UC-GAN", "SME-GAN", "R2M"}


HOSTILE = '<script>alert("x")</script> & "q"'


def test_html_page_escapes_names_captions_notes_and_file_names(tmp_path):
    """A dataset name, label, note, caption, reference, figure title and file name with ``<script>``,
    ``"`` and ``&`` reach the report page as text: no tag, no attribute broken out of its quotes."""
    from html.parser import HTMLParser

    fig_dir = tmp_path / "reports/figures/x"
    fig_dir.mkdir(parents=True)
    weird = 'a"b&c.png'
    (fig_dir / weird).write_bytes(b"png")
    json.dump({"label": HOSTILE, "notes": [f"note {HOSTILE}"],
               "figures": [{"file": weird, "title": f"title {HOSTILE}", "caption": f"cap {HOSTILE}"},
                           {"file": weird, "kind": "examples"}],
               "examples": [{"image_id": HOSTILE, "thumbnail": weird, "concepts": [{"concept": HOSTILE, "score": 0.5}],
                             "captions": [{"label": HOSTILE, "caption": f"caption {HOSTILE}"}],
                             "references": [f"ref {HOSTILE}"]}]},
              open(fig_dir / "index.json", "w"))
    (tmp_path / "reports/baselines.csv").write_text(
        'dataset,method,source,B1,note\n"x&y",mrnn,this run,1.0,"' + HOSTILE.replace('"', '""') + '"\n')
    att = tmp_path / "reports/figures/baselines"
    att.mkdir()
    (att / weird).write_bytes(b"png")
    json.dump({"notes": [f"hit {HOSTILE}"], "figures": [{"file": weird, "dataset": HOSTILE, "image_id": HOSTILE,
                                                          "caption": f"att {HOSTILE}"}]}, open(att / "index.json", "w"))
    page = html.render_page({"table1": tmp_path / "reports/table1.csv"}, [(HOSTILE, fig_dir), (HOSTILE, tmp_path)],
                            tmp_path / "reports/index.html", {"baselines": tmp_path / "reports/baselines.csv"}, att)

    class Parse(HTMLParser):
        def __init__(self):
            super().__init__()
            self.tags, self.attrs, self.text = [], [], []

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)
            self.attrs += attrs

        def handle_data(self, data):
            self.text.append(data)

    p = Parse()
    p.feed(page)
    assert "<script" not in page and "script" not in p.tags
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; &#34;q&#34;" in page
    assert {name for name, _ in p.attrs} <= {"lang", "charset", "name", "content", "class", "id", "href", "src",
                                             "alt", "style"}  # no attribute injected by a quote
    srcs = {v for name, v in p.attrs if name in ("src", "href") and not v.startswith("#")}
    assert srcs == {"figures/x/" + weird, "figures/baselines/" + weird}  # the file name whole, as data
    assert {v for name, v in p.attrs if name == "id" and v.startswith("ds-")} == {"ds-" + HOSTILE}
    text = "".join(p.text)
    for shown in (f"note {HOSTILE}", f"title {HOSTILE}", f"cap {HOSTILE}", f"caption {HOSTILE}", f"ref {HOSTILE}",
                  f"hit {HOSTILE}", f"att {HOSTILE}", f"{HOSTILE} ({HOSTILE})", f"image {HOSTILE}", "x&y",
                  f"r2m figures --dataset {HOSTILE}", "table1.csv is missing"):
        assert shown in text, shown


# --------------------------------------------------------------------------- intervals and paired marks
def _const_stats(n: int, cider: float, ids=None):
    """``n`` images with identical statistics (CIDEr ``cider`` each, the same BLEU counts)."""
    import numpy as np

    from r2m.evaluation.bootstrap import PerImage

    one = {"bleu_testlen": 10.0, "bleu_reflen": 11.0, "bleu_guess_1": 10.0, "bleu_guess_2": 9.0,
           "bleu_guess_3": 8.0, "bleu_guess_4": 7.0, "bleu_correct_1": 6.0, "bleu_correct_2": 3.0,
           "bleu_correct_3": 2.0, "bleu_correct_4": 1.0, "ROUGE_L": 0.4, "CIDEr": cider}
    return PerImage(tuple(ids or (f"img{i}" for i in range(n))), {k: np.full(n, v) for k, v in one.items()})


def test_identical_images_give_a_zero_width_interval():
    """Every image scores the same: every bootstrap resample is the same corpus, so low = value = high."""
    from r2m.evaluation.bootstrap import corpus_metrics
    from r2m.reports import intervals as I

    stats = _const_stats(12, 0.5)
    ev = {k: float(v) for k, v in corpus_metrics(stats).items()}
    rows = tables.build_rows(tables.TABLES["table1"], ["demo"], ["r2m"], {("demo", "r2m"): I.RowEval([ev], [stats])})
    ours = dict(zip(tables.HEADER, rows[0], strict=True))
    for c in ("B-1", "B-4", "R", "C"):
        assert ours[c] == ours[f"{c}_lo"] == ours[f"{c}_hi"] != "", c
    assert ours["C"] == "50.0" and ours["R"] == "40.0"  # per-image means × 100
    assert (ours["seeds"], ours["images"], ours["interval"]) == ("1", "12", "t over images")
    assert ours["M_lo"] == "" and ours["S"] == ""  # no METEOR statistics, no SPICE: no interval


def test_t_interval_over_two_seeds_by_hand():
    """Two seeds with CIDEr 0.20 and 0.30 on every image: no image component (each run is the same on every
    image), so the interval is t over the seeds: mean 0.25, s = 0.0707, t(0.975, df=1) = 12.706 (t table),
    half-width 12.706 · 0.0707 / √2 = 0.6353 → 25.0 [-38.5, 88.5] × 100."""
    from r2m.reports import intervals as I

    evs = [{"CIDEr": 0.20, "Bleu_1": 0.5}, {"CIDEr": 0.30, "Bleu_1": 0.5}]
    stats = [_const_stats(5, 0.20), _const_stats(5, 0.30)]
    rows = tables.build_rows(tables.TABLES["table1"], ["demo"], ["r2m"], {("demo", "r2m"): I.RowEval(evs, stats)})
    ours = dict(zip(tables.HEADER, rows[0], strict=True))
    assert (ours["C"], ours["C_lo"], ours["C_hi"]) == ("25.0", "-38.5", "88.5")
    # equal seeds on identical images: nothing varies (BLEU-1 = 6/10 · exp(1 − 11/10) = 0.5429 on every draw)
    assert (ours["B-1"], ours["B-1_lo"], ours["B-1_hi"]) == ("50.0", "54.3", "54.3")
    assert (ours["seeds"], ours["images"]) == ("2", "5")
    assert ours["interval"] == "t over seeds and images"


def _table2_files(root: Path, better: float) -> None:
    """tiny: R2M with random per-image CIDEr, every other variant ``better`` higher on every image."""
    from r2m.evaluation.bootstrap import PerImage, corpus_metrics

    base = random_stats(20, seed=7)
    for v in VARIANT_NAMES:
        cols = dict(base.columns)
        if v != "r2m":
            cols["CIDEr"] = cols["CIDEr"] + better
        stats = PerImage(base.ids, cols)
        ev = {k: float(x) for k, x in corpus_metrics(stats).items()}
        folder = root / f"results/tiny/{v}/s0/train_i"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "eval.json").write_text(json.dumps({**ev, "n_images": 20, "split": "test"}))
        write_stats(folder / "per_image.parquet", stats, ev)


def test_row_better_on_every_image_is_marked_and_an_equal_one_is_not(tmp_path, repo_root):
    _table2_files(tmp_path, better=0.05)
    tables.table2(ctx_for("table2", make_params(repo_root, ["tiny"]), tmp_path))
    rows = read_csv(tmp_path / "reports/table2.csv")
    by = {r["method"]: r for r in rows}
    for label in ("D w/o FM", "D&R w/o Memory in RM"):
        r = by[label]
        assert r["vs"] == "R2M" and r["d_C"] == "5.0" and float(r["d_C_lo"]) > 0 and r["d_C_mark"] == "*"
        # the other metrics are the same statistics: difference exactly 0, not resolved
        assert (r["d_B-4"], r["d_B-4_lo"], r["d_B-4_hi"], r["d_B-4_mark"]) == ("0.0", "0.0", "0.0", "n.s.")
    assert by["R2M"]["vs"] == "" and by["R2M"]["d_C_mark"] == ""  # the reference is not compared with itself
    md = (tmp_path / "reports/table2.md").read_text()
    assert "## Differences" in md and "+5.0 [" in md
    assert "D w/o FM (tiny) on C" in md and "20 test images" in md
    # one family per dataset and metric: the table's 4 comparisons
    assert "Holm's step-down correction" in md and "(this table's 4 comparisons)" in md
    assert "Primary metric: C (CIDEr)" in md and "Rows with one seed each: test images only" in md
    r = by["D w/o FM"]
    # one seed each, +0.05 on every image: the paired variance over images is 0, so p = 0 (Holm: 0 · 4)
    assert r["d_seeds"] == "1" and (r["d_C_p"], r["d_C_holm"]) == ("0", "0")
    assert r["d_C_mde"] == "0.0"


def test_a_difference_over_two_seeds_counts_each_source_of_noise_once():
    """Two seeds per row: the difference of the rows' means over seeds; its variance is each row's sample
    variance over its seeds / 2 plus the image component — the covariance between two different runs over the
    same 1,000 image draws (bootstrap covariances × n / (n − 1)): B's pair + A's pair − 2 · the mean across —
    and its interval is t at the Welch–Satterthwaite df of the three terms (scipy's t), all recomputed here
    with plain numpy from the same image draws."""
    import math

    import numpy as np
    from scipy import stats

    from r2m.evaluation.bootstrap import resample_indices
    from r2m.reports import intervals as I

    a = [random_stats(15, seed=s) for s in (1, 2)]
    b = [random_stats(15, seed=s) for s in (3, 4)]
    got = I.paired(I.RowEval([{}, {}], b), I.RowEval([{}, {}], a), ["CIDEr"])["CIDEr"]
    draws = resample_indices(15, 1000, I.BOOT_SEED)
    values = np.stack([s.columns["CIDEr"] for s in (*b, *a)])  # [runs, images]: B's two, then A's two
    cov = np.cov(values[:, draws].mean(axis=2), ddof=1) * 15 / 14
    image = cov[0, 1] + cov[2, 3] - (cov[0, 2] + cov[0, 3] + cov[1, 2] + cov[1, 3]) / 2
    means = values.mean(axis=1)
    terms = [np.var(means[:2], ddof=1) / 2, np.var(means[2:], ddof=1) / 2, max(image, 0.0)]
    df = sum(terms) ** 2 / (terms[0] ** 2 + terms[1] ** 2 + terms[2] ** 2 / 14)
    delta = means[:2].mean() - means[2:].mean()
    half = stats.t.ppf(0.975, df) * math.sqrt(sum(terms))
    assert got.runs == (2, 2) and got.value == pytest.approx(delta, abs=1e-12)
    assert (got.low, got.high) == (pytest.approx(delta - half, abs=1e-9), pytest.approx(delta + half, abs=1e-9))
    assert got.p == pytest.approx(2 * stats.t.sf(abs(delta) / math.sqrt(sum(terms)), df), rel=1e-6)


def test_a_one_seed_row_is_paired_with_the_references_same_seed_only(tmp_path, repo_root):
    """R2M ran seeds 0-2, the ablations seed 0 only (the demo's set-up). Each ablation equals R2M's seed 0 on
    every image, while R2M's seeds 1 and 2 score 0.3 lower CIDEr: the paired difference is exactly 0, not
    resolved, and ``vs`` names the seed compared. Pooling R2M's three seeds would call every ablation
    better by 0.2 (``*``): a seed-to-seed spread the bootstrap over images cannot see."""
    from r2m.evaluation.bootstrap import PerImage, corpus_metrics

    base = random_stats(20, seed=7)
    runs = [(v, 0, 0.0) for v in VARIANT_NAMES] + [("r2m", 1, -0.3), ("r2m", 2, -0.3)]
    for v, seed, shift in runs:
        stats = PerImage(base.ids, {**base.columns, "CIDEr": base.columns["CIDEr"] + shift})
        ev = {k: float(x) for k, x in corpus_metrics(stats).items()}
        folder = tmp_path / f"results/tiny/{v}/s{seed}/train_i"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "eval.json").write_text(json.dumps({**ev, "n_images": 20, "split": "test"}))
        write_stats(folder / "per_image.parquet", stats, ev)
    raw = make_params(repo_root, ["tiny"]).model_dump(mode="json")
    raw["catalog"]["tiny"]["seeds"] = {"r2m": [0, 1, 2]}
    tables.table2(ctx_for("table2", P.validate(raw), tmp_path))
    by = {r["method"]: r for r in read_csv(tmp_path / "reports/table2.csv")}
    assert by["R2M"]["seeds"] == "3" and by["D w/o FM"]["seeds"] == "1"
    for label in ("D w/o FM", "D w/o Memory in RM", "R w/o Memory in RM", "D&R w/o Memory in RM"):
        r = by[label]
        assert r["vs"] == "R2M (seed 0)"
        assert (r["d_C"], r["d_C_lo"], r["d_C_hi"], r["d_C_mark"]) == ("0.0", "0.0", "0.0", "n.s.")


def test_three_seed_rows_and_the_seed_spread_decides(tmp_path, repo_root):
    """Every row at seeds 0-2, each seed with an effect of its own (R2M 0, +0.4, −0.4 points; the others
    ±0.2). D w/o FM is 5 points above R2M on every image: marked after Holm over the table's 4 CIDEr
    comparisons. D w/o Memory in RM is above R2M on every image at seed 0 (+30) but below at seeds 1 and 2
    (−10, −15): within each seed the images agree, yet over the seeds the mean +1.7 is n.s. and its interval
    holds 0 (a test over the images alone would mark it)."""
    from r2m.evaluation.bootstrap import PerImage, corpus_metrics

    base = random_stats(20, seed=7)
    shift = {"no_fm": (0.05, 0.05, 0.05), "d_lstm": (0.3, -0.1, -0.15)}
    own = {"r2m": (0.0, 0.004, -0.004)}
    for v in VARIANT_NAMES:
        for seed in range(3):
            cider = base.columns["CIDEr"] + own.get(v, (0.002, -0.002, 0.0))[seed] + (shift[v][seed] if v in shift else 0.0)
            stats = PerImage(base.ids, {**base.columns, "CIDEr": cider})
            ev = {k: float(x) for k, x in corpus_metrics(stats).items()}
            folder = tmp_path / f"results/tiny/{v}/s{seed}/train_i"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "eval.json").write_text(json.dumps({**ev, "n_images": 20, "split": "test"}))
            write_stats(folder / "per_image.parquet", stats, ev)
    raw = make_params(repo_root, ["tiny"]).model_dump(mode="json")
    raw["catalog"]["tiny"]["seeds"] = {v: [0, 1, 2] for v in VARIANT_NAMES}
    tables.table2(ctx_for("table2", P.validate(raw), tmp_path))
    by = {r["method"]: r for r in read_csv(tmp_path / "reports/table2.csv") if r["source"] == "this run"}
    fm, d = by["D w/o FM"], by["D w/o Memory in RM"]
    assert fm["vs"] == "R2M" and fm["d_seeds"] == "3" and fm["d_C"] == "5.0" and fm["d_C_mark"] == "*"
    assert (d["d_seeds"], d["d_C"], d["d_C_mark"]) == ("3", "1.7", "n.s.")
    assert float(d["d_C_lo"]) < 0 < float(d["d_C_hi"]) and float(d["d_C_p"]) > 0.5
    assert float(d["d_C_mde"]) > 1.7  # n.s., with the difference it would detect beside it
    md = (tmp_path / "reports/table2.md").read_text()
    assert "Welch-Satterthwaite" in md and "each system's spread over its seeds and the image component" in md


def test_published_rows_leave_interval_and_mark_cells_empty(tmp_path, repo_root):
    write_evals(tmp_path)
    tables.table2(ctx_for("table2", make_params(repo_root), tmp_path))
    pub = [r for r in read_csv(tmp_path / "reports/table2.csv") if r["source"] == "published"]
    assert pub and all(r["C"] and not r["C_lo"] and not r["seeds"] and not r["vs"] and not r["d_C_mark"] for r in pub)


def test_stale_or_missing_per_image_file_is_one_line_naming_it(tmp_path, repo_root):
    write_evals(tmp_path, ["tiny"])
    p = tmp_path / "results/tiny/r2m/s0/train_i/eval.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), "CIDEr": 0.5}))
    with pytest.raises(ValueError, match=r"train_i/per_image\.parquet: per-image statistics of another evaluation "
                                         r"\(CIDEr [\d.]+ here, 0\.5 in eval\.json\)") as err:
        tables.table1(ctx_for("table1", make_params(repo_root, ["tiny"]), tmp_path))
    assert "\n" not in str(err.value)
    (p.parent / "per_image.parquet").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing per-image file .*r2m/s0/train_i/per_image\.parquet"):
        tables.table1(ctx_for("table1", make_params(repo_root, ["tiny"]), tmp_path))


def test_baselines_rows_compare_each_model_with_the_most_frequent_caption():
    """A model better than the reference point on every image is marked *; a model equal to it is
    n.s.; the skipped dataset's line and the published rows have no interval and no mark."""
    from r2m.evaluation.bootstrap import PerImage, corpus_metrics
    from r2m.reports import baselines
    from r2m.reports import intervals as I

    ref = random_stats(16, seed=3)

    def row(stats):
        ev = {k: float(v) for k, v in corpus_metrics(stats).items()}
        return I.RowEval([{**ev, "n_images": 16, "split": "test"}], [stats])

    better = PerImage(ref.ids, {**ref.columns, "CIDEr": ref.columns["CIDEr"] + 0.2, "ROUGE_L": ref.columns["ROUGE_L"] + 0.1})
    skip = {"skipped": "no paired training captions"}
    evals = {("tiny", "mrnn"): row(better), ("tiny", "sat"): row(ref), ("demo", "mrnn"): skip, ("demo", "sat"): skip}
    rows = baselines.baseline_rows(["tiny", "demo"], ["mrnn", "sat"], evals, {}, {"tiny": row(ref), "demo": skip})
    recs = [dict(zip(baselines.BASE_HEADER, r, strict=True)) for r in rows]
    mrnn, sat, mf = recs[0], recs[1], recs[2]
    assert mrnn["vs"] == "most frequent training caption"
    assert (mrnn["d_C"], mrnn["d_C_mark"], mrnn["d_R"], mrnn["d_R_mark"]) == ("20.0", "*", "10.0", "*")
    assert float(mrnn["d_C_lo"]) > 0 and mrnn["d_B-4_mark"] == "n.s." and mrnn["d_B-4"] == "0.0"
    assert all(sat[f"d_{c}_mark"] == "n.s." for c in ("B-1", "B-4", "R", "C"))
    assert mf["source"] == "reference point" and mf["vs"] == "" and mf["C_lo"] and mf["seeds"] == "1"
    assert (mrnn["seeds"], mrnn["images"], mrnn["interval"]) == ("1", "16", "t over images")
    demo = next(r for r in recs if r["dataset"] == "demo")
    assert demo["source"] == "skipped" and demo["note"] == skip["skipped"] and not demo["C_lo"] and not demo["vs"]
    pub = [r for r in recs if r["source"] == "published"]
    assert pub and all(not r["B-4_lo"] and not r["seeds"] and not r["d_C_mark"] for r in pub)


def test_retrieval_rows_give_a_bootstrap_interval_over_queries():
    """Every query ranks its match first: R@1 = 100 with a zero-width interval; ranks 1..10 each once:
    R@5 = 50 with an interval inside [0, 100] around it; no ranks (an older file): no interval, said so."""
    from r2m.reports import baselines

    def res(sent, img):
        return {"sentence_retrieval": {"R@1": 100.0 * sum(r <= 1 for r in sent) / len(sent), "R@5": 100.0, "R@10": 100.0,
                                       "Med r": 1.0},
                "image_retrieval": {"R@1": 10.0, "R@5": 50.0, "R@10": 100.0, "Med r": 5.5},
                "ranks": {"sentence_retrieval": sent, "image_retrieval": img},
                "chance": {t: {"R@1": 1.0, "R@5": 5.0, "R@10": 10.0, "Med r": 50.0}
                           for t in ("sentence_retrieval", "image_retrieval")},
                "n_images": len(sent), "n_sentences": len(img)}

    good = res([1] * 10, list(range(1, 11)))
    old = {k: v for k, v in good.items() if k != "ranks"}
    rows = baselines.retrieval_rows({("tiny", "mrnn"): good}, {"tiny": old}, ["tiny"], ["mrnn"], ["tiny"])
    recs = [dict(zip(baselines.RET_HEADER, r, strict=True)) for r in rows]
    mrnn, r2m = recs[0], recs[1]
    assert (mrnn["Sent R@1"], mrnn["Sent R@1_lo"], mrnn["Sent R@1_hi"]) == ("100.0", "100.0", "100.0")
    assert mrnn["Img R@5"] == "50.0" and 10.0 <= float(mrnn["Img R@5_lo"]) < 50.0 < float(mrnn["Img R@5_hi"]) <= 90.0
    assert (mrnn["seeds"], mrnn["images"], mrnn["interval"]) == ("1", "10", "bootstrap over queries")
    assert r2m["Sent R@1_lo"] == "" and r2m["interval"] == "" and "no per-query ranks" in r2m["note"]
    chance = recs[2]
    assert chance["source"] == "chance" and chance["Sent R@1"] == "1.0" and chance["Sent R@1_lo"] == ""


def test_loss_curves_over_seeds_are_a_mean_and_a_band():
    """Two seeds' train losses 1.0 / 3.0 at step 0 and 2.0 / 2.0 at step 1: mean 2.0 and 2.0, band
    [1, 3] then zero width; a step only one seed logged counts one seed. The figure draws the band."""
    import pandas as pd

    a = pd.DataFrame({"step": [0, 1, 2], "split": ["train"] * 3, "loss": [1.0, 2.0, 5.0]})
    b = pd.DataFrame({"step": [0, 1], "split": ["train"] * 2, "loss": [3.0, 2.0]})
    band = plots.seed_band([a, b], "train")
    assert band["mean"].tolist() == [2.0, 2.0, 5.0] and band["low"].tolist() == [1.0, 2.0, 5.0]
    assert band["high"].tolist() == [3.0, 2.0, 5.0] and band["seeds"].tolist() == [2, 2, 1]
    fig = plots.loss_figure({("r2m", "train_xe"): [a, b], ("no_fm", "train_xe"): a})
    ax = fig.axes[0]
    assert len(ax.collections) == 1  # one shaded band: the variant with two seeds
    assert any("mean of 2 seeds" in t.get_text() for t in ax.get_legend().get_texts())


def test_tables_are_reproducible_byte_for_byte(tmp_path, repo_root):
    """The bootstrap draws come from a fixed seed: the same inputs give the same CSV and Markdown bytes."""
    _table2_files(tmp_path, better=0.01)
    params = make_params(repo_root, ["tiny"])
    got = []
    for _ in range(2):
        tables.table2(ctx_for("table2", params, tmp_path))
        got.append(((tmp_path / "reports/table2.csv").read_bytes(), (tmp_path / "reports/table2.md").read_bytes()))
    assert got[0] == got[1] and b"t over images" in got[0][0]


def test_three_identical_retrieval_seeds_are_not_presented_as_certainty():
    """Three seeds with the same ranks (R@5 = 37.5 each): not [37.5, 37.5] but the bootstrap over the
    8 queries, whose first-match ranks 1, 2, 9, 9, 9, 9, 9, 4 give R@5 3/8 and resamples from 0 to 1."""
    from r2m.reports import intervals as I

    ranks = [1, 2, 9, 9, 9, 9, 9, 4]
    one = {t: {"R@1": 12.5, "R@5": 37.5, "R@10": 100.0, "Med r": 9.0} for t in I.RET_TASKS}
    res = [{**one, "n_images": 8, "ranks": {t: ranks for t in I.RET_TASKS}}] * 3
    s = I.retrieval_summary(res)
    v, lo, hi = s.values["sentence_retrieval/R@5"]
    assert v == 37.5 and lo < 37.5 < hi
    assert s.interval == "t over seeds; bootstrap over queries where the seeds agree"
    bare = I.retrieval_summary([{**one, "n_images": 8}] * 3)
    assert bare.values["sentence_retrieval/R@5"] == (37.5, 37.5, 37.5)
    assert bare.interval == "t over seeds (zero width: the seeds agree)"
