"""Show, Attend and Tell (models/sat.py) and S-CNN-RNN (models/scnn.py): equations, training
schedule, memorisation and beam search through the shared decoding interface."""

from __future__ import annotations

import math

import pytest
import torch

from r2m.captioning.beam import beam_search
from r2m.evaluation.multilabel import topk_multilabel
from r2m.models.catalog import MODELS, load_model
from r2m.models.sat import SAT, SATConfig, doubly_stochastic
from r2m.models.scnn import SCNN, SCNNConfig, concept_bce, concept_labels, concept_vocab
from r2m.text.vocab import END, PAD, START

torch.set_num_threads(1)


def sat(seed: int = 0, V: int = 9, D: int = 6, **kw) -> SAT:
    torch.manual_seed(seed)
    kw.setdefault("feature_norm", False)  # the equations on raw annotations
    return SAT(SATConfig(vocab_size=V, feat_dim=D, embed=8, hidden=12, dropout=0.0, **kw)).eval()


def scnn(seed: int = 0, V: int = 9, F: int = 6, k: int = 5, **kw) -> SCNN:
    torch.manual_seed(seed)
    return SCNN(SCNNConfig(vocab_size=V, image_dim=F, concepts=[f"c{j}" for j in range(k)], hidden=12, dropout=0.0,
                           **kw)).eval()


# --------------------------------------------------------------------------- SAT
@torch.no_grad()
def test_sat_attention_sums_to_one_and_masked_locations_get_none() -> None:
    m = sat()
    a = torch.randn(3, 2, 4, 6)  # a 2x4 grid -> L = 8
    mask = torch.ones(3, 8)
    mask[0, 5:] = 0
    mask[2, :1] = 0
    out = m(a, torch.randint(4, 9, (3, 5)), mask=mask)
    alpha = out["alpha"]
    assert alpha.shape == (3, 5, 8)
    torch.testing.assert_close(alpha.sum(-1), torch.ones(3, 5))
    assert alpha[0, :, 5:].abs().max() == 0 and alpha[2, :, 0].abs().max() == 0
    assert (alpha[1] > 0).all()
    # masked locations cannot influence anything: change their features, same outputs
    a2 = a.clone().reshape(3, 8, 6)
    a2[0, 5:] += 100.0
    inputs = torch.randint(4, 9, (3, 5), generator=torch.Generator().manual_seed(1))
    o1, o2 = m(a, inputs, mask=mask), m(a2, inputs, mask=mask)
    torch.testing.assert_close(o1["hidden"][0], o2["hidden"][0])
    assert not torch.allclose(o1["hidden"][1], m(a2 + 1.0, inputs, mask=mask)["hidden"][1])


def test_doubly_stochastic_against_hand_computation() -> None:
    alphas = torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]]])  # [1, T=3, L=3]
    # all steps: column sums 0.9, 1.35, 0.75 -> 0.01 + 0.1225 + 0.0625
    torch.testing.assert_close(doubly_stochastic(alphas), torch.tensor([0.195]))
    # last step padded: sums 0.6, 1.05, 0.35 -> 0.16 + 0.0025 + 0.4225
    step = torch.tensor([[1.0, 1.0, 0.0]])
    torch.testing.assert_close(doubly_stochastic(alphas, step), torch.tensor([0.585]))
    # a masked location is left out of the sum
    torch.testing.assert_close(doubly_stochastic(alphas, step, torch.tensor([[1.0, 1.0, 0.0]])), torch.tensor([0.1625]))


def test_sat_loss_is_nll_plus_lambda_times_regulariser() -> None:
    m = sat(dsr_lambda=0.7)
    a = torch.randn(2, 4, 6)
    inputs = torch.tensor([[START, 4, 5, 6], [START, 7, 0, 0]])
    targets = torch.tensor([[4, 5, 6, END], [7, END, 0, 0]])
    lengths = torch.tensor([4, 2])
    with torch.no_grad():
        loss, parts = m.loss(a, inputs, targets, lengths)
        f = m(a, inputs)
        lp = torch.log_softmax(m.logits(f["hidden"]), -1)
        nll = -(lp[0, torch.arange(4), targets[0]].sum() + lp[1, torch.arange(2), targets[1, :2]].sum())
        al = f["alpha"]
        reg = ((1 - al[0].sum(0)) ** 2).sum() + ((1 - al[1, :2].sum(0)) ** 2).sum()
    # Eq. 9 per caption, summed and divided by the 6 valid words (the loop's per-word average)
    torch.testing.assert_close(loss, (nll + 0.7 * reg) / 6)
    torch.testing.assert_close(parts["xe"], nll / 6)
    torch.testing.assert_close(parts["dsr"], 0.7 * reg / 6)


@torch.no_grad()
def test_sat_beta_gates_the_context() -> None:
    m = sat()
    a = torch.randn(2, 5, 6)
    state = m.decode_init(a)
    h = state[3]
    z, alpha, beta = m.attend(state[0], state[1], state[2], h)
    torch.testing.assert_close(beta, torch.sigmoid(m.beta(h)).squeeze(-1))
    torch.testing.assert_close(z, beta.unsqueeze(-1) * torch.einsum("bl,bld->bd", alpha, a))
    # driving β to 0 removes the image from the step: the outputs no longer depend on a
    m.beta.bias.fill_(-1e4)
    o1, _, _, _ = m.decode_step(m.decode_init(a), torch.tensor([START, START]))
    a2 = a + torch.randn_like(a)
    s2 = list(m.decode_init(a2))
    s2[3:] = m.decode_init(a)[3:]  # same h0, c0: only the attended annotations differ
    o2, _, _, _ = m.decode_step(tuple(s2), torch.tensor([START, START]))
    torch.testing.assert_close(o1, o2)
    m2 = sat(selector=False)
    assert m2.beta is None


def test_sat_init_from_mean_annotation() -> None:
    m = sat()
    a = torch.randn(2, 5, 6)
    _, _, _, h0, c0 = m.decode_init(a)
    mean = a.mean(1)
    torch.testing.assert_close(h0, torch.tanh(m.init_h(mean)))
    torch.testing.assert_close(c0, torch.tanh(m.init_c(mean)))
    # feature_norm: each annotation vector standardised over its channels first (scale-free)
    mn = sat(feature_norm=True)
    s1, s2 = mn.decode_init(a), mn.decode_init(a * 50.0 + 3.0)
    torch.testing.assert_close(s1[0], s2[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s1[0].mean(-1), torch.zeros(2, 5), atol=1e-5, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("which", ["sat", "sat_hard_argmax", "scnn"])
@pytest.mark.parametrize("max_rows", [4096, 5])
def test_stepwise_score_block_scores_each_pair_as_its_own_teacher_forced_pass(which: str, max_rows: int) -> None:
    """The batched retrieval scorer (decode_init once per image, sentences longest first, finished ones
    dropped) gives every (image, sentence) pair the log-probability of a forward pass on that pair alone;
    max_rows 5 splits the 4 sentences x 3 images into chunks of one sentence each."""
    from r2m.models.sat_hard import SATHard, SATHardConfig
    from r2m.supervised.data import teacher_forcing

    a = torch.randn(3, 5, 6)
    if which == "sat":
        m = sat(seed=3, selector=True)
    elif which == "scnn":
        m, a = scnn(seed=3), a[:, 0]  # S-CNN-RNN reads a pooled vector [b, F]
    else:
        torch.manual_seed(3)
        m = SATHard(SATHardConfig(vocab_size=9, feat_dim=6, embed=8, hidden=12, dropout=0.0,
                                  test_attention="argmax")).eval()
    caps = [[5, 6, 7], [8, 2], [4], [3, 5, 6, 7, 8, 2]]  # lengths out of order, the last one cut at max_len
    inputs, targets, lengths = teacher_forcing(caps, max_len=5)
    got = m.score_block(a, inputs, targets, lengths, max_rows=max_rows)
    want = torch.tensor([[float(m.sentence_logprob(a[i: i + 1], inputs[j: j + 1], targets[j: j + 1],
                                                   lengths[j: j + 1])) for j in range(4)] for i in range(3)])
    assert got.shape == (3, 4)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert len(set(got.flatten().tolist())) == 12  # every pair its own score (no image or sentence mixed up)


# --------------------------------------------------------------------------- S-CNN-RNN
def test_scnn_concept_labels_from_captions() -> None:
    caps = [[["a", "dog", "on", "grass"], ["the", "dog", "runs"]],
            [["a", "cat", "on", "a", "sofa"]],
            [["a", "dog", "and", "a", "cat"]]]
    flat = [c for image in caps for c in image]
    concepts = concept_vocab(flat, k=3, drop_stopwords=True)  # dog x3, cat x2, then grass/runs/sofa x1: alphabetical
    assert concepts == ["dog", "cat", "grass"]
    assert concept_vocab(flat, k=2) == ["a", "dog"]  # the seed's rule: stopwords kept
    s = concept_labels(caps, concepts)
    torch.testing.assert_close(s, torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 1.0, 0.0]]))


def test_concept_bce_is_eq5_by_hand() -> None:
    logits = torch.tensor([[0.0, 2.0, -1.0]])
    s = torch.tensor([[1.0, 0.0, 1.0]])
    p = [0.5, 1 / (1 + math.exp(-2.0)), 1 / (1 + math.exp(1.0))]
    want = -(math.log(p[0]) + math.log(1 - p[1]) + math.log(p[2]))
    torch.testing.assert_close(concept_bce(logits, s), torch.tensor([want]))


def test_scnn_pretraining_feeds_ground_truth_and_joint_feeds_prediction() -> None:
    m = scnn()
    feats = torch.randn(3, 6)
    s = (torch.rand(3, 5) > 0.5).float()
    v = m.encode({"pooled": feats, "concepts": s})
    assert v.shape == (3, 11) and m.encode({"pooled": feats}).shape == (3, 6)
    inputs = torch.tensor([[START, 4, 5], [START, 6, 0], [START, 7, 8]])
    targets = torch.tensor([[4, 5, END], [6, END, 0], [7, 8, END]])
    lengths = torch.tensor([3, 2, 3])
    seen = []
    hook = m.init_fc.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].detach().clone()))
    m.set_phase("pretrain")
    m.zero_grad()
    loss, parts = m.loss(v, inputs, targets, lengths)
    loss.backward()
    torch.testing.assert_close(seen[-1], s)
    # L = L_r (per word) + L_u / (number of words)
    torch.testing.assert_close(parts["l_u"], concept_bce(m.concept_logits(feats), s).sum().detach() / 8)
    torch.testing.assert_close(loss, parts["xe"] + parts["l_u"])
    # pre-training: the LSTM's loss does not reach the concept head (only L_u does)
    g_pre = m.concept_head.weight.grad.clone()
    m.zero_grad()
    (concept_bce(m.concept_logits(feats), s).sum() / 8).backward()
    torch.testing.assert_close(g_pre, m.concept_head.weight.grad)
    m.set_phase("train")  # train_sup = joint fine-tuning
    assert m.phase == "joint"
    m.zero_grad()
    m.loss(v, inputs, targets, lengths)[0].backward()
    torch.testing.assert_close(seen[-1], torch.sigmoid(m.concept_logits(feats)).detach())
    assert not torch.allclose(m.concept_head.weight.grad, g_pre)  # L_r now reaches the concept head
    # captioning (no labels): ŝ, no L_u
    out = m(m.encode({"pooled": feats}), inputs, lengths)
    assert out["aux"] == {}
    torch.testing.assert_close(seen[-1], torch.sigmoid(m.concept_logits(feats)).detach())
    hook.remove()
    with pytest.raises(ValueError, match="phase"):
        m.set_phase("other")


def test_scnn_concepts_and_labels_from_the_paired_captions() -> None:
    table = {"image_id": ["i1", "i1", "i2", "i3"], "split": ["train", "train", "train", "val"],
             "caption": ["A dog on grass.", "The dog runs", "a cat on a sofa", "a horse"]}
    section = SCNN.prepare_params({"num_concepts": 3, "hidden": 8, "drop_stopwords": True}, table)
    assert section["concepts"] == ["dog", "cat", "grass"]  # val captions do not count
    m = SCNN.from_params(section, vocab_size=9, shapes={"pooled": (6,)})
    m.bind_data(table)
    torch.testing.assert_close(m.labels_of(["i2", "i1", "i3"]),
                               torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]))
    f = m.batch_features({"pooled": torch.zeros(1, 6)}, ["i1"])
    assert f["concepts"].tolist() == [[1.0, 0.0, 1.0]]
    with pytest.raises(KeyError, match="i9"):
        m.labels_of(["i9"])


def test_topk_multilabel_by_hand() -> None:
    scores = torch.tensor([[0.9, 0.8, 0.1, 0.0], [0.1, 0.2, 0.9, 0.8]])
    truth = torch.tensor([[1, 0, 1, 0], [0, 0, 1, 0]])
    r = topk_multilabel(scores, truth, k=2)
    # image 0 predicts {0,1}: P 1/2, R 1/2; image 1 predicts {2,3}: P 1/2, R 1
    assert r["O-P"] == pytest.approx(0.5) and r["O-R"] == pytest.approx(0.75)
    assert r["O-F1"] == pytest.approx(2 * 0.5 * 0.75 / 1.25)
    # all four classes (0/0 = 0): 0 (pred once, tp 1: P 1, R 1), 1 (pred once, tp 0: P 0, no truth: R 0),
    # 2 (pred once, tp 1: P 1, R 1/2), 3 (pred once, tp 0: P 0, no truth: R 0)
    assert r["C-P"] == pytest.approx(0.5) and r["C-R"] == pytest.approx(0.375)


# --------------------------------------------------------------------------- both
def _exhaustive_best(m, x, max_len: int, vocab: int, banned=(PAD, START)) -> tuple[list[int], float]:
    """Score every sequence (ending at <#end> or at max_len) by expanding all prefixes."""
    allowed = [t for t in range(vocab) if t not in banned]
    best: tuple[list[int], float] = ([], float("-inf"))
    frontier = [([], 0.0, m.decode_init(x), START)]
    for _ in range(max_len):
        nxt = []
        for seq, score, state, prev in frontier:
            h, st, _, _ = m.decode_step(state, torch.tensor([prev]))
            lp = torch.log_softmax(m.logits(h).float(), -1)[0]
            for t in allowed:
                s = score + float(lp[t])
                if t == END:
                    if s > best[1]:
                        best = (seq + [t], s)
                else:
                    nxt.append((seq + [t], s, st, t))
        frontier = nxt
    for seq, score, _, _ in frontier:  # never ended
        if score > best[1]:
            best = (seq, score)
    return best


@torch.no_grad()
@pytest.mark.parametrize("which", ["sat", "scnn"])
def test_beam_search_equals_exhaustive_search_on_a_5_word_vocabulary(which: str) -> None:
    V, max_len = 4 + 5, 4  # the specials + 5 words; 7 choices per step
    for seed in range(3):
        m = sat(seed, V=V) if which == "sat" else scnn(seed, V=V)
        with torch.no_grad():
            m.out.bias[END] += 0.5
        x = torch.randn(1, 3, 6) if which == "sat" else torch.randn(1, 6)
        seq, score = _exhaustive_best(m, x, max_len, V)
        wide = beam_search(m, x, beam=7 ** (max_len - 1), max_len=max_len)  # keeps every prefix
        got = wide["tokens"][0, 0, : int(wide["lengths"][0, 0])].tolist()
        assert got == seq
        assert float(wide["scores"][0, 0]) == pytest.approx(score, abs=1e-5)
        narrow = beam_search(m, x, beam=3, max_len=max_len)  # a lower bound of the exact best
        assert float(narrow["scores"][0, 0]) <= score + 1e-5


def _paired_set(n: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    caps = [[4 + (i + j) % 5 for j in range(2 + i % 3)] for i in range(n)]
    T = max(len(c) for c in caps) + 1
    inputs = torch.zeros(n, T, dtype=torch.long)
    targets = torch.zeros(n, T, dtype=torch.long)
    for i, c in enumerate(caps):
        inputs[i, : len(c) + 1] = torch.tensor([START, *c])
        targets[i, : len(c) + 1] = torch.tensor([*c, END])
    lengths = torch.tensor([len(c) + 1 for c in caps])
    return caps, inputs, targets, lengths, g


@pytest.mark.parametrize("which", ["sat", "scnn"])
def test_each_model_memorises_a_tiny_paired_set(which: str, tmp_path) -> None:
    caps, inputs, targets, lengths, g = _paired_set()
    n = len(caps)
    torch.manual_seed(0)
    if which == "sat":
        m = SAT(SATConfig(vocab_size=9, feat_dim=8, embed=16, hidden=32, dropout=0.0))
        x = torch.randn(n, 2, 2, 8, generator=g)
        s = None
    else:
        m = SCNN(SCNNConfig(vocab_size=9, image_dim=8, concepts=list("abcde"), hidden=32, dropout=0.0))
        x = torch.randn(n, 8, generator=g)
        s = torch.zeros(n, 5)
        for i, c in enumerate(caps):
            s[i, torch.tensor(c) - 4] = 1.0
        xs = m.encode({"pooled": x, "concepts": s})
    opt = torch.optim.Adam(m.parameters(), lr=0.02)
    m.train()
    for step in range(150):
        opt.zero_grad()
        if which == "sat":
            loss, _ = m.loss(x.flatten(1, 2), inputs, targets, lengths)
        else:
            m.set_phase("pretrain" if step < 75 else "train")
            loss, _ = m.loss(xs, inputs, targets, lengths)
        loss.backward()
        opt.step()
    m.eval()
    x = m.encode({"grid": x} if which == "sat" else {"pooled": x})
    dec = beam_search(m, x, beam=3, max_len=8)
    for i, c in enumerate(caps):
        assert dec["tokens"][i, 0, : int(dec["lengths"][i, 0])].tolist() == [*c, END]
    # checkpoint round trip through the registry
    torch.save(m.checkpoint(), tmp_path / "model.pt")
    m2, ckpt = load_model(tmp_path)
    assert ckpt["model"] == which and isinstance(m2, MODELS.load(which))
    dec2 = beam_search(m2.eval(), x, beam=3, max_len=8)
    assert torch.equal(dec["tokens"], dec2["tokens"])


# --------------------------------------------------------------------------- attention vs boxes
def test_attention_hit_rate_against_boxes_by_hand() -> None:
    import numpy as np

    from r2m.evaluation.attention_hits import attention_hit_rate, cells_in_boxes, smooth_map

    inside = cells_in_boxes((2, 2), (100, 100), [[0, 0, 60, 40]])  # covers cell (0,0) centre (25,25) only
    assert inside.tolist() == [[True, False], [False, False]]
    on = np.array([[0.7, 0.1], [0.1, 0.1]])
    off = np.array([[0.1, 0.7], [0.1, 0.1]])
    recs = [(["a", "dogs", "near", "cat"], np.stack([on, on, on, off]), {"dog": [[0, 0, 60, 40]], "cat": [[0, 0, 60, 40]]},
             (100, 100))]
    r = attention_hit_rate(recs, {"dog": "dog", "dogs": "dog", "cat": "cat"})
    assert r["events"] == 2 and r["hit_rate"] == 0.5 and r["chance"] == 0.25
    assert r["attention_mass_in_box"] == pytest.approx((0.7 + 0.1) / 2)
    m = smooth_map(on, (40, 40))
    assert m.shape == (40, 40) and m.max() == pytest.approx(1.0) and m[5, 5] > m[35, 35]


# --------------------------------------------------------------------------- the stages on a small tiny set
def test_stages_pretrain_train_select_and_inspect(tmp_path) -> None:
    """prepare → references → extract_features_sup (grid) → sup_vocab → pretrain_sup → train_sup → inspect_sup for SAT
    and S-CNN-RNN on a few synthetic images: S-CNN-RNN's train_sup starts from its pretraining,
    SAT's checkpoint is selected by val BLEU-4, the inspections are written."""
    import json as _json

    from r2m import params as P
    from r2m.stage import registry as S
    from r2m.stage.context import StageContext
    from r2m.utils.io import read_json

    torch.set_num_threads(1)
    sched = {"steps": 6, "batch_size": 8, "lr": 3e-3, "max_len": 12, "eval_every": 3, "checkpoint_every": 3}
    raw = {"datasets": ["syn"], "baselines": {"datasets": ["syn"], "models": ["sat", "scnn"]},
           "catalog": {"syn": {"kind": "tiny", "seed": 3, "n_train_images": 10, "n_val_images": 3,
                               "n_test_images": 3, "n_sentences": 20, "image_size": 64}},
           "detect_concepts": {"backend": "precomputed"},
           "sup_features": {"backend": "random_cnn", "options": {"kinds": ["pooled", "grid"]}},
           "sup_vocab": {"min_count": 1},
           "train_sup": {**sched, "per_model": {"sat": {"select_by": "bleu4"}, "scnn": {"pretrain_steps": 4}}},
           "sat": {"embed": 8, "hidden": 12, "att_dim": 8, "dropout": 0.0},
           "scnn": {"hidden": 12, "dropout": 0.0},
           "caption": {"beam": 2, "max_len": 8, "batch_size": 4, "split": "test"},
           "report": {"figure_images": 3}}  # every test image: its caption is in inspect.json
    params = P.for_dataset(P.validate(raw), "syn")

    def run(stage: str, model: str | None = None) -> None:
        import importlib

        ctx = StageContext(stage=S.get(stage), params=params, dataset="syn", model=model, root=tmp_path)
        mod, fn = S.get(stage).impl.split(":")
        importlib.import_module(mod).__dict__[fn](ctx)

    for stage in ("prepare", "references", "extract_features_sup", "sup_vocab"):
        run(stage)
    for model in ("sat", "scnn"):
        run("pretrain_sup", model)
    assert "no pretraining phase" in read_json(tmp_path / "models/syn/sat/s0/pretrain_sup/skipped.json")["skipped"]
    pre = torch.load(tmp_path / "models/syn/scnn/s0/pretrain_sup/model.pt", weights_only=True)
    assert pre["stage"] == "pretrain_sup" and pre["config"]["concepts"]
    for model in ("sat", "scnn"):
        run("train_sup", model)
        run("inspect_sup", model)
    sat_m = read_json(tmp_path / "results/syn/sat/s0/train_sup/train_metrics.json")
    assert sat_m["select_by"] == "bleu4" and [s["step"] for s in sat_m["selection"]] == [3, 6]
    best = max(sat_m["selection"], key=lambda s: s["bleu4"])["step"]
    assert sat_m["selected_step"] == best
    ins = _json.loads((tmp_path / "results/syn/sat/s0/train_sup/inspect/inspect.json").read_text())
    assert ins["images"] == 3 and len(ins["figures"]) == 3
    assert all((tmp_path / "results/syn/sat/s0/train_sup/inspect" / f["file"]).exists() for f in ins["figures"])
    # every caption word naming an object with a ground-truth box in its image is one event (or one
    # whose box covers no grid cell centre), counted here by hand from the captions and the boxes
    from r2m.supervised.inspect_sat import ground_truth_boxes
    from r2m.text.singular import Singulariser

    boxes = ground_truth_boxes(tmp_path / "data/syn/prepared")
    assert boxes, "tiny writes ground-truth boxes (prepared/detections.jsonl)"
    sing = Singulariser()
    want = sum(sing.singular(w) in boxes.get(f["image_id"], {}) for f in ins["figures"] for w in f["caption"].split())
    ah = ins["attention_hits"]
    assert ah["events"] + ah["events_without_cells"] == want
    assert 0 <= ah["chance"] <= 1 and (ah["chance"] > 0) == (ah["events"] > 0)
    ml = read_json(tmp_path / "results/syn/scnn/s0/train_sup/inspect/inspect.json")
    assert set(ml["multilabel"]) == {"C-P", "C-R", "C-F1", "O-P", "O-R", "O-F1"} and ml["top_k"] == 3
