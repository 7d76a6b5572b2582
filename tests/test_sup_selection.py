"""Safety net: ``train_sup`` with ``select_by`` keeps the best-scoring step's weights (not the last),
on a small ``tiny`` set; the selector's scores are known and not monotone."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

from r2m import params as P
from r2m.stage import registry as S
from r2m.stage.context import StageContext
from r2m.supervised import select as sup_select
from r2m.utils.io import read_json

SCORES = {2: 0.1, 4: 0.7, 6: 0.3, 8: 0.5}


def _params() -> P.Params:
    sched = {"steps": 8, "batch_size": 8, "lr": 3e-3, "max_len": 12, "eval_every": 2, "checkpoint_every": 4}
    raw = {"datasets": ["syn"], "baselines": {"datasets": ["syn"], "models": ["mrnn"]},
           "catalog": {"syn": {"kind": "tiny", "seed": 3, "n_train_images": 10, "n_val_images": 3,
                               "n_test_images": 3, "n_sentences": 20, "image_size": 32}},
           "detect_concepts": {"backend": "precomputed"},
           "sup_features": {"backend": "random_cnn", "options": {"size": 32, "dim": 16}},
           "sup_vocab": {"min_count": 1},
           "train_sup": {**sched, "per_model": {"mrnn": {"select_by": "bleu4"}}},
           "mrnn": {"embed1": 8, "embed2": 12, "recurrent": 12, "multimodal": 16, "dropout": 0.0}}
    return P.for_dataset(P.validate(raw), "syn")


def _run(root: Path, stage: str, model: str | None = None) -> None:
    ctx = StageContext(stage=S.get(stage), params=_params(), dataset="syn", model=model, root=root)
    mod, fn = S.get(stage).impl.split(":")
    importlib.import_module(mod).__dict__[fn](ctx)


def test_train_sup_keeps_the_best_scoring_weights(tmp_path: Path, monkeypatch) -> None:
    torch.set_num_threads(1)
    for stage in ("prepare", "references", "extract_features_sup", "sup_vocab"):
        _run(tmp_path, stage)
    seen: dict[int, dict[str, torch.Tensor]] = {}

    def fake_selector(ctx, feats, itos, metric, device):
        assert metric == "bleu4"

        def select(model, step):
            seen[step] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
            return SCORES[step]

        return select

    monkeypatch.setattr(sup_select, "val_selector", fake_selector)
    _run(tmp_path, "train_sup", "mrnn")
    m = read_json(tmp_path / "results/syn/mrnn/s0/train_sup/train_metrics.json")
    assert [s["step"] for s in m["selection"]] == [2, 4, 6, 8]
    assert [s["bleu4"] for s in m["selection"]] == [SCORES[s] for s in (2, 4, 6, 8)]
    assert m["selected_step"] == 4 and m["steps"] == 8
    ck = torch.load(tmp_path / "models/syn/mrnn/s0/train_sup/model.pt", weights_only=True)
    assert ck["step"] == 4
    sd = ck["state_dict"]
    assert sd.keys() == seen[4].keys()
    assert all(torch.equal(sd[k], seen[4][k]) for k in sd)
    assert not all(torch.equal(seen[4][k], seen[8][k]) for k in sd)  # training moved the weights after step 4


@pytest.mark.parametrize("metric", ["nope"])
def test_train_sup_rejects_an_unknown_metric(metric: str) -> None:
    with pytest.raises(ValueError, match="select_by"):
        sup_select.val_selector(None, None, [], metric, "cpu")
