"""S-CNN-RNN as seed 002 describes it: the CNN trained end to end (r2m.supervised.finetune), the
concept vocabulary (most frequent caption words, stopwords kept, coverage), the multi-label
protocol (C-/O- P/R/F1 over all classes / all images, 0/0 = 0) and the skipped-pretraining case."""

from __future__ import annotations

import pytest
import torch

from r2m.evaluation.multilabel import topk_multilabel
from r2m.models.scnn import SCNNConfig, concept_coverage, concept_vocab, word_counts
from r2m.text.vocab import END, START

torch.set_num_threads(1)


# --------------------------------------------------------------------------- concept vocabulary
def test_concept_vocabulary_is_the_most_frequent_words_stopwords_kept() -> None:
    caps = [["a", "dog", "on", "a", "sofa"], ["a", "cat", "on", "grass"], ["the", "dog", "runs", "<UNK>"]]
    # a x3, dog x2, on x2, then cat/grass/runs/sofa/the x1 (ties alphabetical); <UNK> is no word
    assert concept_vocab(caps, k=4) == ["a", "dog", "on", "cat"]
    assert concept_vocab(caps, k=3, drop_stopwords=True) == ["dog", "cat", "grass"]
    counts = word_counts(caps)
    assert sum(counts.values()) == 12 and "<UNK>" not in counts
    assert concept_coverage(counts, ["a", "dog", "on", "cat"]) == pytest.approx(8 / 12)
    assert concept_coverage(counts, []) == 0.0 and concept_coverage(word_counts([]), ["a"]) == 0.0


def test_prepare_params_records_the_coverage() -> None:
    from r2m.models.scnn import SCNN

    table = {"image_id": ["i1", "i1", "i2"], "split": ["train", "train", "val"],
             "caption": ["A dog on a sofa.", "the dog", "a horse"]}
    section = SCNN.prepare_params({"num_concepts": 2, "hidden": 8}, table)
    # train words: a x2, dog x2, on, sofa, the (7 occurrences; the val caption does not count)
    assert section["concepts"] == ["a", "dog"]
    assert section["concept_coverage"] == pytest.approx(4 / 7)
    m = SCNN.from_params(section, vocab_size=9, shapes={"pooled": (6,)})
    assert m.train_info()["concept_coverage"] == pytest.approx(4 / 7)
    assert m.train_info()["label"] == "S-CNN-RNN (frozen CNN)"


# --------------------------------------------------------------------------- multi-label protocol
def test_multilabel_protocol_by_hand_on_three_images() -> None:
    """4 classes, top-2 per image. Class 3 is never predicted (P 0/0 = 0) and class 1 never true
    (R 0/0 = 0); image 2 has no true label (R 0/0 = 0)."""
    scores = torch.tensor([[0.9, 0.8, 0.1, 0.0],   # predicts {0, 1}, truth {0, 3}
                           [0.1, 0.2, 0.9, 0.0],   # predicts {1, 2}, truth {2, 3}
                           [0.7, 0.1, 0.6, 0.0]])  # predicts {0, 2}, truth {}
    truth = torch.tensor([[1, 0, 0, 1], [0, 0, 1, 1], [0, 0, 0, 0]])
    r = topk_multilabel(scores, truth, k=2)
    # per class (tp / predicted, tp / true): 0: 1/2, 1/1; 1: 0/2, 0/0; 2: 1/2, 1/1; 3: 0/0, 0/2
    assert r["C-P"] == pytest.approx((0.5 + 0 + 0.5 + 0) / 4)
    assert r["C-R"] == pytest.approx((1 + 0 + 1 + 0) / 4)
    assert r["C-F1"] == pytest.approx(2 * 0.25 * 0.5 / 0.75)
    # per image: 0: 1/2, 1/2; 1: 1/2, 1/2; 2: 0/2, 0/0
    assert r["O-P"] == pytest.approx((0.5 + 0.5 + 0) / 3)
    assert r["O-R"] == pytest.approx((0.5 + 0.5 + 0) / 3)
    assert r["O-F1"] == pytest.approx(1 / 3)
    assert topk_multilabel(torch.zeros(0, 4), torch.zeros(0, 4))["C-P"] == 0.0


# --------------------------------------------------------------------------- the CNN end to end
def e2e_model(k: int = 5, V: int = 9):
    from r2m.supervised.finetune import build_cnn, end_to_end_class

    ex = build_cnn("random_cnn", {"size": 32, "dim": 16, "seed": 0})
    torch.manual_seed(0)
    cfg = SCNNConfig(vocab_size=V, image_dim=16, concepts=[f"c{j}" for j in range(k)], hidden=12, dropout=0.0,
                     cnn="end_to_end")
    return end_to_end_class("scnn")(cfg).attach_cnn(ex.model), ex


def _batch():
    torch.manual_seed(1)
    images = torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8)
    s = torch.tensor([[1.0, 0, 1, 0, 0], [0, 1, 0, 0, 1], [1, 1, 0, 0, 0]])
    inputs = torch.tensor([[START, 4, 5], [START, 6, 0], [START, 7, 8]])
    targets = torch.tensor([[4, 5, END], [6, END, 0], [7, 8, END]])
    return images, s, inputs, targets, torch.tensor([3, 2, 3])


def _step(model, phase: str, terms: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """One Adam step on the chosen loss terms; returns the CNN weights before the step."""
    images, s, inputs, targets, lengths = _batch()
    model.train()
    model.set_phase(phase)
    before = {k: v.detach().clone() for k, v in model.cnn.state_dict().items()}
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-5)
    opt.zero_grad()
    _, parts = model.loss(model.encode({"image": images, "concepts": s}), inputs, targets, lengths)
    sum(parts[t] for t in terms).backward()
    opt.step()
    return before


def _changed(model, before) -> bool:
    return any(not torch.equal(before[k], v) for k, v in model.cnn.state_dict().items())


def test_rnn_pretraining_leaves_the_cnn_and_joint_fine_tuning_changes_it() -> None:
    model, _ = e2e_model()
    lstm_before = model.lstm.weight_hh.detach().clone()
    before = _step(model, "pretrain", ("xe",))  # the RNN's pre-training: L_r with the LSTM fed s
    assert not _changed(model, before)
    assert all(p.grad is None or not p.grad.any() for p in model.cnn.parameters())
    assert not torch.equal(lstm_before, model.lstm.weight_hh)
    before = _step(model, "pretrain", ("l_u",))  # the CNN's pre-training: Eq. 5 on the pixels
    assert _changed(model, before)
    before = _step(model, "train", ("xe",))  # joint fine-tuning: L_r (fed ŝ) reaches the CNN
    assert _changed(model, before)


def test_end_to_end_checkpoint_is_a_plain_scnn_checkpoint(tmp_path) -> None:
    from r2m.models.catalog import load_model
    from r2m.supervised.finetune import load_cnn, save_cnn
    from r2m.utils.checkpoint import save_torch

    model, _ = e2e_model()
    save_torch(tmp_path / "model.pt", model.checkpoint(stage="train_sup", step=1, dataset="x"))
    save_cnn(model, tmp_path, "random_cnn", {"size": 32, "dim": 16})
    head, ck = load_model(tmp_path)
    assert ck["model"] == "scnn" and not any(k.startswith("cnn.") for k in ck["state_dict"])
    assert type(head).__name__ == "SCNN" and head.train_info()["label"] == "S-CNN-RNN (end to end)"
    other, _ = e2e_model()
    with torch.no_grad():
        for p in other.cnn.parameters():
            p.add_(1.0)
    assert load_cnn(other, tmp_path, "random_cnn")
    for a, b in zip(model.cnn.state_dict().values(), other.cnn.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="vgg16"):
        load_cnn(other, tmp_path, "vgg16")
    images = _batch()[0]
    with torch.no_grad():  # the head on the CNN's pooled feature = the end-to-end encode
        torch.testing.assert_close(head.encode({"pooled": model.cnn(images)["pooled"]}),
                                   model.encode({"image": images}))


# --------------------------------------------------------------------------- the stages on a tiny fixture
@pytest.fixture
def tiny(tmp_path):
    from r2m import params as P
    from r2m.stage import registry as S
    from r2m.stage.context import StageContext

    def make(pretrain_steps: int):
        raw = {"datasets": ["syn"], "baselines": {"datasets": ["syn"], "models": ["scnn"]},
               "catalog": {"syn": {"kind": "tiny", "seed": 3, "n_train_images": 10, "n_val_images": 3,
                                   "n_test_images": 4, "n_sentences": 20, "image_size": 32}},
               "detect_concepts": {"backend": "precomputed"},
               "sup_features": {"backend": "random_cnn", "options": {"size": 32, "dim": 16}},
               "sup_vocab": {"min_count": 1},
               "train_sup": {"steps": 4, "batch_size": 8, "lr": 3e-3, "max_len": 12, "eval_every": 2,
                             "checkpoint_every": 2, "per_model": {"scnn": {"pretrain_steps": pretrain_steps}}},
               "scnn": {"hidden": 12, "dropout": 0.0, "num_concepts": 30},
               "retrieval": {"split": "test", "image_block": 4},
               "caption": {"beam": 2, "max_len": 8, "batch_size": 4, "split": "test"}}
        params = P.for_dataset(P.validate(raw), "syn")

        def run(stage: str, model: str | None = None) -> None:
            import importlib

            ctx = StageContext(stage=S.get(stage), params=params, dataset="syn", model=model, root=tmp_path)
            mod, fn = S.get(stage).impl.split(":")
            importlib.import_module(mod).__dict__[fn](ctx)

        return run

    return make, tmp_path


def _inputs_and_pretraining(run) -> None:
    """prepare → extract_features_sup → sup_vocab → pretrain_sup (scnn)."""
    for stage in ("prepare", "references", "extract_features_sup", "sup_vocab"):
        run(stage)
    run("pretrain_sup", "scnn")


def _cnn_state(folder):
    return torch.load(folder / "cnn.pt", weights_only=True)["state_dict"]


def test_end_to_end_stages_on_a_tiny_fixture(tiny) -> None:
    from r2m.utils.io import read_json
    from r2m.vision.extractors.factory import build_extractor

    make, root = tiny
    run = make(pretrain_steps=3)
    _inputs_and_pretraining(run)
    pre, out = root / "models/syn/scnn/s0/pretrain_sup", root / "models/syn/scnn/s0/train_sup"
    initial = build_extractor("random_cnn", {"size": 32, "dim": 16}).model.state_dict()
    pre_cnn = _cnn_state(pre)
    assert any(not torch.equal(initial[k], v) for k, v in pre_cnn.items())  # the CNN pre-trains on L_u
    assert not (pre / "features").exists()
    run("train_sup", "scnn")
    tuned = _cnn_state(out)
    assert any(not torch.equal(pre_cnn[k], v) for k, v in tuned.items())  # joint fine-tuning moves the CNN
    m = read_json(root / "results/syn/scnn/s0/train_sup/train_metrics.json")
    assert m["label"] == "S-CNN-RNN (end to end)" and m["cnn"] == "end_to_end"
    assert 0 < m["concept_coverage"] <= 1
    assert (out / "features/features.h5").exists()
    for stage in ("caption_sup", "retrieval_sup", "inspect_sup"):
        run(stage, "scnn")
    caps = read_json(root / "results/syn/scnn/s0/train_sup/captions.json")
    assert len(caps) == 4 and all(c["caption"] for c in caps)
    ins = read_json(root / "results/syn/scnn/s0/train_sup/inspect/inspect.json")
    assert ins["label"] == "S-CNN-RNN (end to end)" and ins["images"] == 4
    assert "R@1" in read_json(root / "results/syn/scnn/s0/train_sup/retrieval.json")["sentence_retrieval"]


def test_a_skipped_pretraining_leaves_no_model_and_is_never_loaded(tiny) -> None:
    from r2m.utils.io import read_json

    make, root = tiny
    run = make(pretrain_steps=2)
    _inputs_and_pretraining(run)
    pre = root / "models/syn/scnn/s0/pretrain_sup"
    assert (pre / "model.pt").exists() and (pre / "cnn.pt").exists()
    run = make(pretrain_steps=0)  # later written as skipped: the older model must go
    run("pretrain_sup", "scnn")
    assert "pretrain_steps is 0" in read_json(pre / "skipped.json")["skipped"]
    assert not (pre / "model.pt").exists() and not (pre / "cnn.pt").exists()
    # a stale model.pt beside the skip marker (e.g. restored by DVC) is never loaded: loading this
    # one would fail
    (pre / "model.pt").write_bytes(b"not a checkpoint")
    run("train_sup", "scnn")
    assert (root / "models/syn/scnn/s0/train_sup/model.pt").exists()


def test_report_rows_name_the_cnn_mode_and_the_protocol() -> None:
    from r2m.reports.baselines import ML_PROTOCOL, baseline_rows, multilabel_rows

    scores = {"Bleu_1": 0.5, "Bleu_2": 0.4, "Bleu_3": 0.3, "Bleu_4": 0.2, "METEOR": 0.2, "ROUGE_L": 0.4,
              "CIDEr": 1.2, "split": "test", "n_images": 4}
    rows = baseline_rows(["tiny_paired"], ["scnn"], {("tiny_paired", "scnn"): scores},
                         {("tiny_paired", "scnn"): {"label": "S-CNN-RNN (end to end)", "steps": 3}},
                         {"tiny_paired": {**scores, "caption": "a b"}})
    assert rows[0][1] == "S-CNN-RNN (end to end)"
    ml = {c: 0.5 for c in ("C-P", "C-R", "C-F1", "O-P", "O-R", "O-F1")}
    ins = {("tiny_paired", "scnn"): {"label": "S-CNN-RNN (frozen CNN)", "top_k": 3, "concepts": 30, "images": 4,
                                     "multilabel": ml, "frequency_baseline": ml}}
    got = multilabel_rows(ins)
    assert got[0][1] == "S-CNN-RNN (frozen CNN): concept head" and "0/0 = 0" in got[0][-1]
    assert all("not caption words" in r[-1] for r in got if r[2] == "published")
    assert "all classes" in ML_PROTOCOL
