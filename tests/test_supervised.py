"""Supervised baselines: m-RNN, the paired-caption data, the supervised vocabulary."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from r2m.models.catalog import build_sup_model, load_model, sup_model
from r2m.models.mrnn import MRNN, MRNNConfig, scaled_tanh
from r2m.supervised.data import teacher_forcing
from r2m.supervised.skip import skip_reason
from r2m.supervised.vocab import build
from r2m.text.vocab import END, PAD, START


def small_mrnn(vocab: int = 12, image_dim: int = 6, **kw) -> MRNN:
    torch.manual_seed(0)
    cfg = dict(embed1=8, embed2=16, recurrent=16, multimodal=24, dropout=0.0)
    cfg.update(kw)
    return MRNN(MRNNConfig(vocab_size=vocab, image_dim=image_dim, **cfg))


def test_registry_and_params_names_agree():
    from r2m.params import SUP_MODEL_NAMES, Params

    assert SUP_MODEL_NAMES == ("mrnn", "sat", "sat_hard", "scnn")
    for name in SUP_MODEL_NAMES:  # every model has a params section of its name, and its class that name
        assert name in Params.model_fields
        assert sup_model(name).name == name


def test_mrnn_shapes_and_checkpoint_roundtrip(tmp_path):
    m = small_mrnn()
    v = torch.randn(3, 6)
    inputs = torch.randint(4, 12, (3, 5))
    out = m(v, inputs, torch.tensor([5, 4, 2]))
    assert out["logits"].shape == (3, 5, 12) and out["hidden"].shape == (3, 5, 24)
    state = m.decode_init(v)
    h, state2, _, _ = m.decode_step(state, torch.full((3,), START))
    assert h.shape == (3, 24) and m.logits(h).shape == (3, 12)
    assert all(s.shape[0] == 3 for s in state2)
    torch.save(m.checkpoint(stage="train_sup"), tmp_path / "model.pt")
    m2, ckpt = load_model(tmp_path)
    assert ckpt["model"] == "mrnn" and isinstance(m2, MRNN)
    m2.eval(), m.eval()
    assert torch.allclose(m2(v, inputs)["logits"], m(v, inputs)["logits"])


def test_embed2_must_match_recurrent():
    with pytest.raises(ValueError, match="embed2"):
        MRNNConfig(vocab_size=10, image_dim=4, embed2=32, recurrent=16)


def test_padding_does_not_change_the_loss():
    m = small_mrnn().eval()
    v = torch.randn(2, 6)
    inputs, targets, lengths = teacher_forcing([[5, 6, 7], [8, 9]], max_len=10)
    base = m.loss(v, inputs, targets, lengths)[0]
    pad = torch.zeros(2, 4, dtype=torch.long)
    junk = torch.randint(4, 12, (2, 4))  # whatever sits after the end must not matter either
    for extra in (pad, junk):
        loss = m.loss(v, torch.cat((inputs, extra), 1), torch.cat((targets, extra), 1), lengths)[0]
        assert torch.allclose(loss, base, atol=1e-6)
    # and the step-wise decoder agrees with teacher forcing
    state = m.decode_init(v)
    logits = []
    for t in range(inputs.shape[1]):
        h, state, _, _ = m.decode_step(state, inputs[:, t])
        logits.append(m.logits(h))
    assert torch.allclose(torch.stack(logits, 1), m(v, inputs)["logits"], atol=1e-5)


def test_multimodal_layer_against_a_hand_computation():
    m = small_mrnn(vocab=6, image_dim=2, embed1=2, embed2=2, recurrent=2, multimodal=2)
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        m.embed1.weight[4] = torch.tensor([1.0, -1.0])
        m.embed2.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
        m.embed2.bias.copy_(torch.tensor([0.5, 0.5]))  # w = ReLU([1.5, -0.5]) = [1.5, 0]
        m.U_r.weight.copy_(torch.eye(2))
        m.V_w.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
        m.V_w.bias.copy_(torch.tensor([0.1, -0.1]))
        m.V_r.weight.copy_(torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
        m.V_I.weight.copy_(torch.tensor([[2.0, 0.0], [0.0, -1.0]]))
    v = torch.tensor([[0.25, 1.0]])
    # t = 0: w = [1.5, 0]; r(0) = ReLU(0 + w) = [1.5, 0]
    # m = g([1.5 + 0.1, -0.1] + [0, 1.5] + [0.5, -1.0]) = g([2.1, 0.4])
    want = [1.7159 * math.tanh(2 * 2.1 / 3), 1.7159 * math.tanh(2 * 0.4 / 3)]
    h, (img, r), _, _ = m.decode_step(m.decode_init(v), torch.tensor([4]))
    assert torch.allclose(r, torch.tensor([[1.5, 0.0]]))
    assert torch.allclose(h, torch.tensor([want]), atol=1e-6)
    # t = 1 (same word): r(1) = ReLU(U_r r(0) + w) = [3, 0]; m = g([1.6, -0.1] + [0, 3] + [0.5, -1])
    h2, _, _, _ = m.decode_step((img, r), torch.tensor([4]))
    want2 = [1.7159 * math.tanh(2 * 2.1 / 3), 1.7159 * math.tanh(2 * 1.9 / 3)]
    assert torch.allclose(h2, torch.tensor([want2]), atol=1e-6)
    assert torch.allclose(scaled_tanh(torch.tensor(1.0)), torch.tensor(1.7159 * math.tanh(2 / 3)))


def test_tiny_paired_set_is_memorised():
    """Four images, one caption each: training drives the per-word perplexity to ~1."""
    m = small_mrnn(vocab=12, image_dim=4, multimodal=32)
    feats = torch.eye(4)
    caps = [[4, 5, 6], [7, 8], [9, 10, 11, 5], [6, 4]]
    inputs, targets, lengths = teacher_forcing(caps, max_len=10)
    opt = torch.optim.Adam(m.parameters(), lr=0.02)
    for _ in range(300):
        loss, _ = m.loss(m.encode({"pooled": feats}), inputs, targets, lengths)
        opt.zero_grad()
        loss.backward()
        opt.step()
    m.eval()
    with torch.no_grad():
        lp = m.sentence_logprob(feats, inputs, targets, lengths)
    ppl = math.exp(-float(lp.sum()) / int(lengths.sum()))
    assert ppl < 1.05, ppl
    from r2m.captioning.beam import beam_search

    res = beam_search(m, feats, beam=2, max_len=8)
    for row, cap in zip(res["tokens"][:, 0].tolist(), caps, strict=True):
        assert row[: len(cap) + 1] == [*cap, END]


def test_score_block_matches_the_generic_pairwise_version():
    m = small_mrnn().eval()
    v = torch.randn(3, 6)
    inputs, targets, lengths = teacher_forcing([[5, 6, 7], [8, 9], [4], [10, 11, 5, 6]], max_len=10)
    fast = m.score_block(v, inputs, targets, lengths)
    slow = torch.stack([m.sentence_logprob(v[i: i + 1].expand(4, -1), inputs, targets, lengths) for i in range(3)])
    assert fast.shape == (3, 4)
    assert torch.allclose(fast, slow, atol=1e-5)


@pytest.mark.parametrize("cache_bytes", [None, 0])  # None: the module's limit (these arrays fit); 0: read the file
def test_features_get_returns_the_stored_rows_in_the_asked_order(tmp_path, monkeypatch, cache_bytes):
    """Rows by feature row number, repeats and any order kept, float16 storage handed back as float32,
    whether the kind is held in memory or read from features.h5 row by row."""
    import h5py
    import pyarrow as pa
    import pyarrow.parquet as pq

    import r2m.supervised.data as D

    if cache_bytes is not None:
        monkeypatch.setattr(D, "CACHE_BYTES", cache_bytes)
    rng = np.random.default_rng(0)
    grid = rng.normal(size=(7, 2, 2, 3)).astype(np.float16)
    pooled = rng.normal(size=(7, 3)).astype(np.float32)
    with h5py.File(tmp_path / "features.h5", "w") as f:
        f["grid"], f["pooled"] = grid, pooled
    pq.write_table(pa.table({"image_id": [f"i{k}" for k in range(7)], "row": list(range(7))}),
                   tmp_path / "index.parquet")
    feats = D.Features(tmp_path, ["grid", "pooled"])
    rows = np.array([5, 1, 5, 0, 6])
    for _ in range(2):  # a second batch reads the same (from memory when cached)
        got = feats.get(rows)
        assert got["grid"].dtype == torch.float32 and tuple(got["grid"].shape) == (5, 2, 2, 3)
        assert np.array_equal(got["grid"].numpy(), grid[[5, 1, 5, 0, 6]].astype(np.float32))
        assert np.array_equal(got["pooled"].numpy(), pooled[[5, 1, 5, 0, 6]])
    assert (feats._cache["grid"] is None) == (cache_bytes == 0)
    feats.close()


def test_teacher_forcing_cuts_and_ends():
    inputs, targets, lengths = teacher_forcing([[5, 6, 7], [8]], max_len=3)
    assert lengths.tolist() == [3, 2]
    assert targets.tolist() == [[5, 6, 7], [8, END, PAD]]  # the cut caption has no <#end>
    assert inputs.tolist() == [[START, 5, 6], [START, 8, PAD]]


def _coco(images, caps):
    return {"images": [{"id": i, "file_name": f"{i}.png", "split": s} for i, s in images],
            "annotations": [{"id": k, "image_id": i, "caption": c} for k, (i, c) in enumerate(caps)]}


def test_sup_vocab_from_training_captions_only(tmp_path):
    prep = tmp_path / "prepared"
    prep.mkdir()
    (prep / "references.json").write_text(json.dumps(_coco([("t1", "test")], [("t1", "a zebra runs")])))
    (prep / "train_references.json").write_text(json.dumps(_coco(
        [("a", "train"), ("b", "train")],
        [("a", "a dog runs"), ("a", "a dog sits"), ("b", "a cat runs"), ("b", "word " * 50)])))
    stats = build(prep, tmp_path / "sv", min_count=2, max_tokens=40)
    assert stats["paired"] and stats["captions"] == {"train": 3, "val": 0, "test": 1}
    assert stats["dropped_too_long_or_empty"] == 1
    itos = json.loads((tmp_path / "sv/vocab.json").read_text())["itos"]
    assert itos[4:] == ["a", "dog", "runs"]  # count >= 2, most frequent first (ties a-z); no test-only 'zebra'
    import pyarrow.parquet as pq

    t = pq.read_table(tmp_path / "sv/captions.parquet").to_pylist()
    assert t[-1]["split"] == "test" and t[-1]["ids"] == [4, 3, 6]  # zebra -> <UNK>
    assert skip_reason(tmp_path / "sv") is None


def test_sup_vocab_without_pairs_says_why(tmp_path):
    prep = tmp_path / "prepared"
    prep.mkdir()
    (prep / "references.json").write_text(json.dumps(_coco([("t1", "test")], [("t1", "a dog")])))
    stats = build(prep, tmp_path / "sv", min_count=1, max_tokens=40)
    assert not stats["paired"]
    assert "no paired training captions" in skip_reason(tmp_path / "sv")


def test_tiny_writes_paired_captions_disjoint_from_the_corpus(tmp_path):
    import logging

    from r2m.datasets.recipes import build_references
    from r2m.datasets.tiny import tiny
    from r2m.params import DatasetEntry

    entry = DatasetEntry(kind="tiny", n_train_images=6, n_val_images=2, n_test_images=2, n_sentences=200,
                         image_size=32)
    tiny(entry, tmp_path, logging.getLogger("t"))
    build_references(entry, tmp_path, tmp_path, logging.getLogger("t"))  # the references stage
    train = json.loads((tmp_path / "train_references.json").read_text())
    assert len(train["images"]) == 6 and len(train["annotations"]) == 30
    corpus = set((tmp_path / "corpus.txt").read_text().splitlines())
    assert not corpus & {a["caption"] for a in train["annotations"]}
    refs = json.loads((tmp_path / "references.json").read_text())
    assert {i["id"] for i in refs["images"]}.isdisjoint({i["id"] for i in train["images"]})


def test_build_sup_model_reads_its_params_section():
    from r2m.params import Params

    section = Params.model_fields["mrnn"].default_factory().model_dump()
    m = build_sup_model("mrnn", section, 30, {"pooled": (7,), "grid": (2, 2, 7)})
    assert m.cfg.image_dim == 7 and m.cfg.multimodal == 512
    with pytest.raises(ValueError, match="pooled"):
        build_sup_model("mrnn", section, 30, {"grid": (2, 2, 7)})
    # Mao et al.'s layers by hand: embedding 1 (V x 128), embedding 2 (128 -> 256), U_r (256 x 256, no bias),
    # V_w (256 -> 512), V_r (256 x 512, no bias), V_I (7 x 512, no bias), output (512 -> V)
    V = 30
    want = V * 128 + (128 * 256 + 256) + 256 * 256 + (256 * 512 + 512) + 256 * 512 + 7 * 512 + (512 * V + V)
    assert m.param_count() == want


# --------------------------------------------------------------------------- retrieval
def _brute_ranks(scores, relevant):
    """Loop version: sort candidates by score (ties: non-relevant first), position of the first relevant."""
    ranks = []
    for q in range(scores.shape[0]):
        order = sorted(range(scores.shape[1]), key=lambda c: (-scores[q, c], bool(relevant[q, c])))
        ranks.append(next(k + 1 for k, c in enumerate(order) if relevant[q, c]))
    return np.array(ranks)


def test_retrieval_ranks_and_recalls_match_a_brute_force_loop():
    from r2m.supervised.retrieval import first_match_ranks, recall_metrics

    rng = np.random.default_rng(0)
    for _ in range(5):
        scores = rng.integers(0, 4, size=(7, 12)).astype(float)  # small integers: many ties
        relevant = np.zeros((7, 12), dtype=bool)
        for q in range(7):
            relevant[q, rng.choice(12, size=rng.integers(1, 4), replace=False)] = True
        ranks = first_match_ranks(scores, relevant)
        assert ranks.tolist() == _brute_ranks(scores, relevant).tolist()
        m = recall_metrics(ranks)
        for k in (1, 5, 10):
            assert m[f"R@{k}"] == pytest.approx(100.0 * sum(r <= k for r in ranks) / 7)
        assert m["Med r"] == float(np.median(ranks))
    # ties count against the query: a relevant item tied with two others ranks third
    assert first_match_ranks(np.array([[1.0, 1.0, 1.0]]), np.array([[True, False, False]])).tolist() == [3]


def test_p_sentence_normalisation_changes_the_sentence_ranking():
    from r2m.supervised.retrieval import retrieval_scores

    # sentence 0 ("a generic caption") is likely under every image; sentence 1 is image 1's own, less
    # likely in absolute terms but far more likely under image 1 than under image 0
    logp = np.log(np.array([[0.50, 0.01],
                            [0.40, 0.20]]))
    sentence_image = np.array([0, 1])
    raw = retrieval_scores(logp, sentence_image, normalise=False)
    norm = retrieval_scores(logp, sentence_image)
    # image 1 as query: unnormalised, the generic sentence 0 wins (rank of the truth = 2)
    assert raw["sentence_retrieval"]["R@1"] == 50.0
    # normalised by P(s) = mean over the images, sentence 1 (0.2 / 0.105) beats sentence 0 (0.4 / 0.45)
    assert norm["sentence_retrieval"]["R@1"] == 100.0
    # image retrieval ranks images by P(s | I) and is not normalised
    assert raw["image_retrieval"] == norm["image_retrieval"]
    # a prior estimated from other images changes it again: sentence 0 rare elsewhere
    prior = np.log(np.array([[0.01, 0.5], [0.02, 0.5]]))
    assert retrieval_scores(logp, sentence_image, prior)["sentence_retrieval"]["R@1"] == 50.0


def test_chance_levels():
    from r2m.supervised.retrieval import chance_metrics

    c = chance_metrics(100, 1)
    assert c["R@1"] == pytest.approx(1.0) and c["R@10"] == pytest.approx(10.0) and c["Med r"] == 50.0
    c5 = chance_metrics(500, 5)
    assert c5["R@10"] == pytest.approx(100 * (1 - math.comb(495, 10) / math.comb(500, 10)))


def test_tables_list_every_configured_dataset_and_model():
    from r2m.reports.baselines import BASE_HEADER, baseline_rows, retrieval_rows

    ev = {"Bleu_1": 0.5, "Bleu_2": 0.4, "Bleu_3": 0.3, "Bleu_4": 0.2, "METEOR": 0.1, "ROUGE_L": 0.3,
          "CIDEr": 0.9, "SPICE": None}
    skip = {"skipped": "no paired training captions"}
    models = ["mrnn", "other"]
    evals = {("demo", m): skip for m in models} | {("tiny_paired", m): ev for m in models}
    train = {("tiny_paired", m): {"test_perplexity": 3.25, "steps": 10, "train_pairs": 5} for m in models}
    mostfreq = {"demo": skip, "tiny_paired": {**ev, "CIDEr": 0.1, "caption": "a dog"}}
    rows = baseline_rows(["demo", "tiny_paired"], models, evals, train, mostfreq)
    demo = [r for r in rows if r[0] == "demo"]
    assert len(demo) == 1 and demo[0][2] == "skipped" and "no paired" in demo[0][-1]
    tiny = [r for r in rows if r[0] == "tiny_paired"]
    assert [r[1] for r in tiny] == ["m-RNN", "other", "most frequent training caption"]
    cells = dict(zip(BASE_HEADER, tiny[0], strict=True))
    assert [cells[c] for c in ("B-1", "B-2", "B-3", "B-4", "M", "R", "C", "S", "PPL")] == [
        "50.0", "40.0", "30.0", "20.0", "10.0", "30.0", "90.0", "", "3.25"]
    assert any(r[2] == "published" and r[1] == "m-RNN-beam" for r in rows)

    res = {"sentence_retrieval": {"R@1": 10.0, "R@5": 20.0, "R@10": 30.0, "Med r": 12.0},
           "image_retrieval": {"R@1": 5.0, "R@5": 15.0, "R@10": 25.0, "Med r": 20.5},
           "chance": {"sentence_retrieval": {"R@1": 1.0, "R@5": 5.0, "R@10": 9.0, "Med r": 50.0},
                      "image_retrieval": {"R@1": 1.0, "R@5": 5.0, "R@10": 10.0, "Med r": 50.0}},
           "n_images": 100, "n_sentences": 500}
    sup = {("demo", m): skip for m in models} | {("tiny_paired", m): res for m in models}
    rows = retrieval_rows(sup, {"demo": res}, ["demo", "tiny_paired"], models, ["demo"])
    by = [(r[0], r[1], r[2]) for r in rows if r[2] != "published"]
    assert ("demo", "m-RNN, other", "skipped") in by and ("demo", "R2M (joint space)", "this run") in by
    assert ("tiny_paired", "m-RNN", "this run") in by and ("tiny_paired", "other", "this run") in by
    assert ("tiny_paired", "random ranking", "chance") in by
    assert any(r[1] == "m-RNN-VggNet" and r[3] == "35.4" for r in rows)
