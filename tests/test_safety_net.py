"""Safety net for refactoring: checks that fail when a stage keeps the wrong checkpoint,
ignores ``--fresh``, ranks retrieval candidates wrongly or picks the wrong most-frequent caption.

Internal entry points are imported here at the top, so a moved function is a one-line fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from r2m import params as P
from r2m.stage import registry as S
from r2m.stage.context import StageContext
from r2m.supervised.retrieval import r2m_similarity, retrieval_scores
from r2m.training import stages as T
from r2m.utils.io import write_parquet
from test_training import ctx_for, make_params, make_synthetic, refs_file


@pytest.fixture()
def syn(tmp_path: Path) -> Path:
    torch.set_num_threads(1)
    make_synthetic(tmp_path)
    return tmp_path


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["state_dict"]


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --------------------------------------------------------------------------- checkpoint selection (R2M)
def test_r2m_selection_keeps_the_best_scoring_weights_not_the_last(syn: Path) -> None:
    """Scores known and not monotone (best in the middle): model.pt holds exactly that step's weights."""
    scores = {10: 0.2, 20: 0.9, 30: 0.4, 40: 0.6}
    seen: dict[int, dict[str, torch.Tensor]] = {}

    def select(model, step: int) -> float:
        seen[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return scores[step]

    m = T.train(ctx_for(syn, "train_xe", make_params(train_xe={"steps": 40})), select=select)
    assert sorted(seen) == [10, 20, 30, 40]
    assert m["selected_step"] == 20 and m["selected_score"] == 0.9
    ck = torch.load(syn / "models/syn/r2m/s0/train_xe/model.pt", weights_only=True)
    assert ck["step"] == 20
    assert _same(ck["state_dict"], seen[20])
    assert not _same(seen[20], seen[40])  # the weights did move after the best step
    assert not _same(ck["state_dict"], seen[40])


@pytest.fixture(scope="module")
def cider_selected(tmp_path_factory) -> tuple[Path, dict[int, tuple[float, dict[str, torch.Tensor]]]]:
    """train_m through the DAG's run() with its CIDEr selector, every score and the weights it saw recorded."""
    from r2m.training import selection, stages

    torch.set_num_threads(1)
    syn = tmp_path_factory.mktemp("cider")
    make_synthetic(syn)
    val = ["img16", "img17", "img18", "img19"]
    refs = {"images": [{"id": i} for i in val],
            "annotations": [{"id": k, "image_id": i, "caption": "A dog runs near the cat."} for k, i in enumerate(val)]}
    refs_file(syn / "data/syn").write_text(json.dumps(refs))
    real = selection.cider_selector
    record: dict[int, tuple[float, dict[str, torch.Tensor]]] = {}

    def recording(*a, **kw):
        fn = real(*a, **kw)
        assert fn is not None

        def wrapped(model, step):
            score = fn(model, step)
            record[step] = (score, {k: v.detach().clone() for k, v in model.state_dict().items()})
            return score

        return wrapped

    p = make_params(train_m={"steps": 6, "eval_every": 2})
    T.train(ctx_for(syn, "train_xe", p))
    T.train(ctx_for(syn, "train_s", p))
    selection.cider_selector = recording
    try:
        stages.run(ctx_for(syn, "train_m", p))
    finally:
        selection.cider_selector = real
    return syn, record


def _argmax(record) -> int:
    return max(sorted(record), key=lambda s: record[s][0])  # the first of the best on ties


def test_r2m_image_stage_cider_selection_keeps_the_argmax_step(cider_selected) -> None:
    syn, record = cider_selected
    m = json.loads((syn / "results/syn/r2m/s0/train_m/train_metrics.json").read_text())
    assert sorted(record) == [2, 4, 6]
    best = _argmax(record)
    assert m["selected_step"] == best and m["selected_score"] == record[best][0]
    assert torch.load(syn / "models/syn/r2m/s0/train_m/model.pt", weights_only=True)["step"] == best


def test_r2m_image_stage_cider_selection_keeps_the_argmax_weights(cider_selected) -> None:
    syn, record = cider_selected
    best = _argmax(record)
    sd = torch.load(syn / "models/syn/r2m/s0/train_m/model.pt", weights_only=True)["state_dict"]
    assert _same(sd, {k: v for k, v in record[best][1].items() if k in sd})


# --------------------------------------------------------------------------- --fresh
def test_fresh_ignores_and_deletes_last_pt(syn: Path) -> None:
    p = make_params(train_xe={"steps": 20, "checkpoint_every": 10})
    full = T.train(ctx_for(syn, "train_xe", p))
    reference = _weights(syn / "models/syn/r2m/s0/train_xe/model.pt")
    import shutil

    shutil.rmtree(syn / "models/syn/r2m/s0/train_xe")
    work = syn / ".r2m/resume/train_xe/syn-r2m-0"
    orig = T.OBJECTIVES["train_xe"]
    calls = {"n": 0, "stop_at": 13}

    def crashing(ctx, model, batch, tp):
        calls["n"] += 1
        if calls["n"] == calls["stop_at"]:
            raise KeyboardInterrupt
        return orig.compute(ctx, model, batch, tp)

    def fresh_ctx():
        ctx = ctx_for(syn, "train_xe", p)
        ctx.args = SimpleNamespace(fresh=True, bf16=False)
        return ctx

    T.OBJECTIVES["train_xe"] = T.Objective("text", orig.columns, crashing)
    try:
        with pytest.raises(KeyboardInterrupt):  # leaves last.pt at step 10
            T.train(ctx_for(syn, "train_xe", p))
        assert torch.load(work / "last.pt", weights_only=True)["step"] == 10
        calls.update(n=0, stop_at=4)  # --fresh, stopped before its first checkpoint: the old last.pt is gone
        with pytest.raises(KeyboardInterrupt):
            T.train(fresh_ctx())
        assert not (work / "last.pt").exists()
        # a step-10 last.pt again, then --fresh to the end: starts at step 1, ends where a clean run ends
        calls.update(n=0, stop_at=13)
        with pytest.raises(KeyboardInterrupt):
            T.train(ctx_for(syn, "train_xe", p))
        assert torch.load(work / "last.pt", weights_only=True)["step"] == 10
    finally:
        T.OBJECTIVES["train_xe"] = orig
    again = T.train(fresh_ctx())
    rows = [r.split("\t") for r in (syn / "results/syn/r2m/s0/train_xe/loss.tsv").read_text().splitlines()[1:]]
    assert [int(r[0]) for r in rows if r[1] == "train"] == list(range(1, 21))
    assert again["train_loss"] == full["train_loss"]
    assert _same(_weights(syn / "models/syn/r2m/s0/train_xe/model.pt"), reference)


# --------------------------------------------------------------------------- R2M joint-space retrieval
class _JointStub(torch.nn.Module):
    """v̂^I = the image feature itself; ṽ = a fixed vector per sentence, looked up by its first concept id."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table

    def project_image(self, feats):
        return feats

    def forward(self, concepts, concept_lens, inputs, lengths, reconstruct=True):
        return {"v_tilde": self.table[concepts[:, 0]]}


def test_r2m_joint_space_retrieval_on_a_hand_built_example() -> None:
    # 3 images (unit axes), 4 sentences: s0, s1 of image 0, s2 of image 1, s3 of image 2
    images = torch.eye(3)
    vt = torch.tensor([[0.9, 0.0, 0.0],   # s0 → image 0 best
                       [0.1, 0.8, 0.0],   # s1 (image 0) looks like image 1
                       [0.0, 0.5, 0.6],   # s2 (image 1) looks a bit more like image 2
                       [0.0, 0.0, 0.7]])  # s3 → image 2 best
    stub = _JointStub(vt)
    concepts = torch.arange(4).unsqueeze(1)
    sim = r2m_similarity(stub, images, concepts, torch.ones(4, dtype=torch.long),
                         torch.zeros(4, 2, dtype=torch.long), torch.full((4,), 2), batch=3)
    np.testing.assert_allclose(sim, vt.T.double().numpy(), rtol=0, atol=1e-7)  # v̂^I · ṽ, unnormalised
    res = retrieval_scores(sim, np.array([0, 0, 1, 2]), normalise=False)
    # sentence retrieval (image → sentences): image 0 ranks s0 (0.9) first → 1; image 1: s1 0.8 > s2 0.5 → 2;
    # image 2: s3 0.7 > s2 0.6 → 1
    s = res["sentence_retrieval"]
    assert s["R@1"] == pytest.approx(100 * 2 / 3) and s["R@5"] == 100.0 and s["Med r"] == 1.0
    # image retrieval (sentence → images): s0 → 1; s1: image 1 (0.8) > image 0 (0.1) → 2;
    # s2: image 2 (0.6) > image 1 (0.5) → 2; s3 → 1
    i = res["image_retrieval"]
    assert i["R@1"] == 50.0 and i["R@5"] == 100.0 and i["Med r"] == 1.5
    assert res["n_images"] == 3 and res["n_sentences"] == 4 and res["normalised"] is False


def test_retrieval_ties_count_against_the_query() -> None:
    sim = np.array([[1.0, 1.0], [0.0, 0.5]])  # image 0 ties its sentence with image 1's
    res = retrieval_scores(sim, np.array([0, 1]), normalise=False)
    assert res["sentence_retrieval"]["Med r"] == 1.5  # image 0: rank 2 (tie), image 1: rank 1
    assert res["ranks"]["sentence_retrieval"] == [2, 1]  # kept per query: the table's bootstrap over queries
    assert res["image_retrieval"]["R@1"] == 50.0  # s0: image 0 (1.0) vs image 1 (0) → 1; s1: 1.0 > 0.5 → 2


# --------------------------------------------------------------------------- most-frequent caption
def test_mostfreq_picks_the_most_frequent_training_caption(tmp_path: Path) -> None:
    """Training captions: "a dog runs" ×3 (two spellings that tokenise alike), "a cat sits" ×2, and a
    val caption "a red car" ×4 that must not count; every test image gets "a dog runs"."""
    sv, prep = tmp_path / "data/syn/sup_vocab", tmp_path / "data/syn/prepared"
    caps = [("i0", "train", "A dog runs."), ("i1", "train", "a dog runs"), ("i2", "train", "A DOG RUNS"),
            ("i0", "train", "a cat sits"), ("i1", "train", "a cat sits"), ("i3", "train", "a bird flies"),
            *[(f"v{k}", "val", "a red car") for k in range(4)]]
    write_parquet(sv / "captions.parquet", pd.DataFrame(caps, columns=["image_id", "split", "caption"]))
    (sv / "stats.json").write_text(json.dumps({"paired": True}))
    test_ids = ["t0", "t1"]
    write_parquet(prep / "images.parquet", pd.DataFrame({
        "image_id": ["i0", "i1", "i2", "i3", "v0", *test_ids], "path": ["x.jpg"] * 7,
        "split": ["train"] * 4 + ["val"] + ["test"] * 2}))
    refs = {"images": [{"id": i, "split": "test"} for i in test_ids],
            "annotations": [{"id": 0, "image_id": "t0", "caption": "a dog runs"},
                            {"id": 1, "image_id": "t1", "caption": "a cat sits on a mat"}]}
    refs_file(prep.parent).write_text(json.dumps(refs))
    raw = {"datasets": ["syn"], "catalog": {"syn": {"kind": "tiny"}},
           "caption": {"split": "test"}, "evaluate": {"scorers": ["bleu", "cider"]}}
    params = P.for_dataset(P.validate(raw), "syn")
    import importlib

    stage = S.get("mostfreq")
    mod, fn = stage.impl.split(":")
    importlib.import_module(mod).__dict__[fn](StageContext(stage=stage, params=params, dataset="syn", root=tmp_path))
    got = json.loads((tmp_path / "results/syn/mostfreq/captions.json").read_text())
    assert got == [{"image_id": "t0", "caption": "a dog runs"}, {"image_id": "t1", "caption": "a dog runs"}]
    ev = json.loads((tmp_path / "results/syn/mostfreq/eval.json").read_text())
    assert ev["caption"] == "a dog runs" and ev["count"] == 3
    # its per-image statistics (the baselines table's paired reference) give back eval.json's numbers
    from r2m.evaluation import per_image
    from r2m.evaluation.bootstrap import corpus_metrics

    rows, _ = per_image.read(tmp_path / "results/syn/mostfreq/per_image.parquet")
    assert rows.ids == ("t0", "t1")
    again = corpus_metrics(rows)
    assert float(again["CIDEr"]) == pytest.approx(ev["CIDEr"], abs=1e-9)
    assert float(again["Bleu_1"]) == pytest.approx(ev["Bleu_1"], abs=1e-9)


# --------------------------------------------------------------------------- every stage under both profiles
@pytest.mark.parametrize("profile", ["paper", "official"])
def test_four_stages_log_their_objective_under_each_profile(syn: Path, profile: str) -> None:
    """The whole chain runs under ``paper`` and ``official``; every logged training row is the stage's
    objective of its logged components: L_S = xe + β·rec, L_M = rank, L_I = rank + γ·rec (β ≠ γ)."""
    beta, gamma = 0.3, 0.7
    # crops 0: the fixture's features hold the usual view only (the official crops: tests/test_random_crops.py)
    p = make_params(catalog={"syn": {"kind": "tiny", "beta": beta, "gamma": gamma, "fidelity": profile}},
                    train_xe={"steps": 4}, train_s={"steps": 4}, train_m={"steps": 3}, train_i={"steps": 3},
                    extract_features={"crops": 0})
    assert p.fidelity.rec_loss == {"paper": "sum_normalized", "official": "mse_raw"}[profile]
    want = {"train_xe": lambda r: r["xe"], "train_s": lambda r: r["xe"] + beta * r["rec"],
            "train_m": lambda r: r["rank"], "train_i": lambda r: r["rank"] + gamma * r["rec"]}
    for st in ("train_xe", "train_s", "train_m", "train_i"):
        T.train(ctx_for(syn, st, p))
        lines = (syn / f"results/syn/r2m/s0/{st}/loss.tsv").read_text().splitlines()
        head = lines[0].split("\t")
        rows = [dict(zip(head, ln.split("\t"), strict=True)) for ln in lines[1:]]
        train = [{k: float(v) for k, v in r.items() if k not in ("split",) and v != ""} for r in rows
                 if r["split"] == "train"]
        assert len(train) == p.model_dump()[st]["steps"]
        for r in train:
            assert r["loss"] == pytest.approx(want[st](r), rel=2e-5, abs=2e-6), (st, r)
        if st in ("train_s", "train_i"):
            assert min(r["rec"] for r in train) > 1e-4  # the weighted term is there to be weighed
