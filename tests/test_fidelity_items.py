"""The paper benchmarks' default detector and features, sonnet's initialisation
of the memory units, the RM input Linear under ``official``, and each ``paper``-profile departure
from the equations as a named item whose equation form is available — each tested against its
definition."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import yaml

from r2m import params as P
from r2m.captioning.captioner import BANNED, searcher
from r2m.losses.ranking import rank_loss_official, ranking, triplet_hardest
from r2m.losses.reconstruction import reconstruction
from r2m.losses.xe import reduce_xe, xe_loss
from r2m.models.r2m import R2M, R2MConfig, RelationalMemory
from r2m.pipeline import validate as V
from r2m.text.vocab import PAD, START, UNK

torch.set_num_threads(1)
NEW_ITEMS = ("ban_unk", "rm_input", "qkv_norm", "out_bias", "xe_reduction", "similarity")


# --------------------------------------------------------------------------- item 1: benchmarks
@pytest.mark.parametrize("name", P.BENCHMARK_KINDS)
def test_benchmarks_resolve_to_the_papers_detector_and_features(raw, name) -> None:
    view = P.for_dataset(P.validate(raw), name)
    assert view.detect_concepts.backend == "tf_oid" and view.detect_concepts.options.get("source", "zoo") == "zoo"
    assert view.extract_features.backend == "inception_v4"
    assert view.extract_features.options["weights"].endswith("inception_v4.tf_in1k.safetensors")
    assert view.extract_features.options.get("preprocess", "official") == "official"


def test_snakemake_dry_run_params_of_coco_shutterstock(raw) -> None:
    """What ``snakemake -n reports/table1.csv --config 'datasets=["coco_shutterstock"]'`` gives the two
    image stages: the resolved params the rules carry (and the stages save)."""
    from r2m.stage.registry import STAGES

    raw = {**raw, "datasets": ["coco_shutterstock"]}
    p = P.validate(raw)
    stages = {s.name: s for s in STAGES}
    det = stages["detect_concepts"].resolved(p, {"dataset": "coco_shutterstock"})
    feat = stages["extract_features"].resolved(p, {"dataset": "coco_shutterstock"})
    assert det["detect_concepts"]["backend"] == "tf_oid"
    assert feat["extract_features"]["backend"] == "inception_v4"


def test_benchmark_without_the_tf_extra_stops_with_one_line(raw, monkeypatch, tmp_path) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "tensorflow" else real(name, *a, **k))
    weights = tmp_path / "inception_v4.tf_in1k.safetensors"
    weights.write_bytes(b"x")
    raw = copy.deepcopy(raw)
    raw["datasets"] = ["coco_shutterstock"]
    raw["catalog"]["coco_shutterstock"]["overrides"]["extract_features"]["options"]["weights"] = str(weights)
    with pytest.raises(P.ParamsError) as err:
        V.validate(raw)
    msg = str(err.value)
    assert "\n" not in msg and "tf_oid" in msg and "pip install -e '.[tf]'" in msg


def test_benchmark_missing_inception_v4_weights_says_where_to_put_them(raw, tmp_path) -> None:
    raw = copy.deepcopy(raw)
    raw["datasets"] = ["flickr30k_coco"]
    missing = tmp_path / "nowhere" / "inception_v4.safetensors"
    raw["catalog"]["flickr30k_coco"]["overrides"]["extract_features"]["options"]["weights"] = str(missing)
    with pytest.raises(P.ParamsError) as err:
        V.validate(raw)
    msg = str(err.value)
    assert "\n" not in msg and f"file not found: {missing}" in msg and "inception_v4.tf_in1k" in msg


def test_explicit_offline_override_works_and_is_recorded(raw) -> None:
    raw = copy.deepcopy(raw)
    over = raw["catalog"]["coco_shutterstock"]["overrides"]
    over["detect_concepts"] = {"backend": "offline"}
    over["extract_features"] = {"backend": "inception_v3_fid", "options": {"weights": None}}
    view = P.for_dataset(P.validate(raw), "coco_shutterstock")
    assert view.detect_concepts.backend == "offline" and view.extract_features.backend == "inception_v3_fid"
    saved = yaml.safe_load(P.dump(view))  # what a stage saves beside its outputs
    assert saved["detect_concepts"]["backend"] == "offline"
    assert saved["extract_features"]["backend"] == "inception_v3_fid"


# --------------------------------------------------------------------------- item 6: sonnet init
@torch.no_grad()
@pytest.mark.parametrize("variant", ["r2m", "no_fm"])
def test_official_init_of_the_memory_units_is_sonnets(variant) -> None:
    torch.manual_seed(0)
    d, V = 64, 50
    m = R2M(R2MConfig.for_variant(variant, vocab_size=V, d=d, d_k=32, init="official"))
    linears = [(n, x) for part in (m.fusion, m.decoder, m.reconstructor)
               for n, x in part.named_modules() if isinstance(x, torch.nn.Linear)]
    assert len(linears) >= 9
    for name, lin in linears:
        w, std = lin.weight, 1.0 / math.sqrt(lin.in_features)
        assert w.abs().max() <= 2 * std + 1e-7, name  # truncated at 2 sigma
        # the std of N(0, s) truncated at +-2s is 0.8796 s
        assert w.std().item() == pytest.approx(0.8796 * std, rel=0.15), name
    for mem in (m.decoder, m.reconstructor):
        assert mem.qkv.bias.abs().sum() == 0 and mem.gate_in.bias[:d].abs().sum() == 0
        assert torch.equal(mem.gate_in.bias[d:], torch.ones(d))  # sonnet's forget bias stays
        assert all(lay.bias.abs().sum() == 0 for lay in mem.mlp if isinstance(lay, torch.nn.Linear))
    fm_biases = [x.bias for _, x in m.fusion.named_modules() if isinstance(x, torch.nn.Linear) and x.bias is not None]
    assert fm_biases and all(b.abs().sum() == 0 for b in fm_biases)
    ours = R2M(R2MConfig.for_variant(variant, vocab_size=V, d=d, d_k=32, init="pytorch"))
    assert ours.decoder.qkv.bias.abs().sum() > 0  # PyTorch's default: uniform biases


# --------------------------------------------------------------------------- item 7: RM input Linear
def test_rm_input_linear_present_under_official_only() -> None:
    raw = {"datasets": ["a"], "catalog": {"a": {"kind": "demo"}, "b": {"kind": "coco_shutterstock"}}}
    p = P.validate(raw)
    assert P.for_dataset(p, "a").fidelity.rm_input == "when_needed"
    assert P.for_dataset(p, "b").fidelity.rm_input == "always"
    d = 32
    ours = R2M(R2MConfig(vocab_size=20, d=d, d_k=16, rm_input="when_needed"))
    off = R2M(R2MConfig(vocab_size=20, d=d, d_k=16, rm_input="always"))
    for mem in (ours.decoder, ours.reconstructor):
        assert isinstance(mem.inp, torch.nn.Identity)
    for mem in (off.decoder, off.reconstructor):
        assert isinstance(mem.inp, torch.nn.Linear) and mem.inp.in_features == d and mem.inp.out_features == d
    extra = 2 * (d * d + d)
    assert off.param_count() == ours.param_count() + extra
    # N > 1: the reconstructor needs the projection either way
    rm = RelationalMemory(input_dim=2 * d, d=d, slots=2, heads=2, d_k=16, mlp_layers=2)
    assert isinstance(rm.inp, torch.nn.Linear)


def test_rm_input_linear_is_applied_before_attention() -> None:
    torch.manual_seed(0)
    rm = RelationalMemory(input_dim=8, d=8, slots=1, heads=2, d_k=4, mlp_layers=2, input_linear="always")
    x = torch.randn(3, 5, 8)
    k, v, g = rm.precompute(x)
    x2 = rm.inp(x)
    _, k2, v2 = rm._split(rm.qkv_norm(rm.qkv(x2)))
    assert torch.allclose(k, k2) and torch.allclose(v, v2) and torch.allclose(g, rm.gate_in(x2))


# --------------------------------------------------------------------------- item 8: named departures
def test_new_items_resolve_by_profile_and_reach_the_stages_that_read_them() -> None:
    from r2m.stage.registry import FIDELITY_IMAGES, FIDELITY_TRAIN, STAGES

    for item in NEW_ITEMS:
        assert f"fidelity.{item}" in P.PROFILES, item
    assert P.PROFILES["fidelity.ban_unk"] == (True, False)
    assert P.PROFILES["fidelity.similarity"] == ("cosine", "inner")
    assert "fidelity.ban_unk" in FIDELITY_IMAGES
    for stage, items in FIDELITY_TRAIN.items():
        assert {"fidelity.rm_input", "fidelity.qkv_norm", "fidelity.out_bias", "fidelity.dropout"} <= set(items)
        assert ("fidelity.xe_reduction" in items) == (stage in ("train_xe", "train_s", "train_e2e"))
        assert ("fidelity.similarity" in items) == (stage != "train_xe")
    p = P.validate({"datasets": ["a"], "catalog": {"a": {"kind": "demo"}}})
    stages = {s.name: s for s in STAGES}
    ts = stages["train_s"].resolved(p, {"dataset": "a", "variant": "r2m", "seed": str(0)})
    assert ts["fidelity"]["xe_reduction"] == "token_mean" and ts["fidelity"]["similarity"] == "cosine"
    assert ts["fidelity"]["rm_input"] == "when_needed" and ts["fidelity"]["qkv_norm"] is True


def test_xe_reduction_sentence_sum_is_eq10() -> None:
    torch.manual_seed(0)
    B, T, Vv = 4, 6, 11
    logits, targets = torch.randn(B, T, Vv), torch.randint(0, Vv, (B, T))
    lengths = torch.tensor([6, 3, 1, 4])
    mask = torch.arange(T)[None] < lengths[:, None]
    tm = xe_loss(logits, targets, mask)
    assert reduce_xe("token_mean", tm, mask.sum(), B) is tm
    nll = -torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
    eq10 = torch.stack([nll[b, : lengths[b]].sum() for b in range(B)]).mean()
    assert torch.allclose(reduce_xe("sentence_sum", tm, mask.sum(), B), eq10, atol=1e-5)
    with pytest.raises(KeyError):
        reduce_xe("nope", tm, mask.sum(), B)


def test_similarity_inner_uses_the_raw_reconstruction() -> None:
    torch.manual_seed(0)
    v = torch.nn.functional.normalize(torch.randn(5, 8), dim=-1)
    raw, img = 3 * torch.randn(5, 8), torch.nn.functional.normalize(torch.randn(5, 8), dim=-1)
    unit = torch.nn.functional.normalize(raw, dim=-1)
    assert torch.allclose(reconstruction("sum_normalized", v, raw, "inner"), (v - raw).pow(2).sum(-1).mean())
    assert torch.allclose(reconstruction("sum_normalized", v, raw), (v - unit).pow(2).sum(-1).mean())
    assert torch.allclose(ranking("vsepp", img, raw, 0.2, "inner"), triplet_hardest(img, raw, 0.2))
    assert torch.allclose(ranking("vsepp", img, raw, 0.2, "cosine"), triplet_hardest(img, unit, 0.2))
    # the official forms always take the raw v~
    for sim in ("cosine", "inner"):
        assert torch.allclose(ranking("official", img, raw, 0.2, sim), rank_loss_official(img, raw, 0.2))
        assert torch.allclose(reconstruction("mse_raw", v, raw, sim), (v - raw).pow(2).mean())


def test_qkv_norm_off_is_eqs_5_6() -> None:
    on = RelationalMemory(input_dim=8, d=8, slots=1, heads=2, d_k=4, mlp_layers=2)
    off = RelationalMemory(input_dim=8, d=8, slots=1, heads=2, d_k=4, mlp_layers=2, qkv_norm=False)
    assert isinstance(on.qkv_norm, torch.nn.LayerNorm) and isinstance(off.qkv_norm, torch.nn.Identity)
    x = torch.randn(2, 3, 8)
    k, v, _ = off.precompute(x)
    _, k2, v2 = off._split(off.qkv(x))
    assert torch.equal(k, k2) and torch.equal(v, v2)


def test_out_bias_off_is_eq8() -> None:
    m = R2M(R2MConfig(vocab_size=20, d=16, d_k=8, out_bias=False, init="official"))
    assert m.out.bias is None
    h = torch.randn(3, 16)
    assert torch.allclose(m.eval().logits(h), h @ m.out.weight.t())


def test_dropout_none_is_the_papers_text() -> None:
    torch.manual_seed(0)
    m = R2M(R2MConfig(vocab_size=30, d=16, d_k=8, dropout=0.5, dropout_scope="none")).train()
    h = torch.randn(5, 16)
    assert torch.equal(m.logits(h), m.logits(h))
    c, cl = torch.tensor([[4, 5, 6]]), torch.tensor([3])
    assert torch.equal(m.encode(c, cl), m.encode(c, cl))
    assert not any(isinstance(x, torch.nn.Dropout) for x in m.modules())


def test_ban_unk_item_overrides_the_decoders_default() -> None:
    assert UNK in searcher("paper")[1] and UNK not in searcher("official")[1]
    assert UNK not in searcher("paper", ban_unk=False)[1]
    assert searcher("official", ban_unk=True, ban_specials=True)[1] == BANNED


def test_official_decoder_bans_nothing_by_default() -> None:
    """The released sentence_infer.py keeps every word of the softmax (only p < 1e-12 is skipped):
    no id is banned unless an item asks for it."""
    assert searcher("official")[1] == ()
    assert searcher("official", ban_unk=True)[1] == (UNK,)
    assert set(searcher("paper")[1]) == {PAD, START, UNK}
    assert set(searcher("paper", ban_specials=False)[1]) == {UNK}


def test_paper_defaults_build_the_same_model_as_before() -> None:
    """Today's values stay the ``paper`` defaults: the same modules, parameters and random draws."""
    torch.manual_seed(0)
    a = R2M(R2MConfig(vocab_size=40, d=32, d_k=16))
    torch.manual_seed(0)
    b = R2M(R2MConfig(vocab_size=40, d=32, d_k=16, rm_input="when_needed", qkv_norm=True, out_bias=True,
                      dropout_scope="encoder_output"))
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert isinstance(a.decoder.inp, torch.nn.Identity) and isinstance(a.decoder.qkv_norm, torch.nn.LayerNorm)
    # checkpoints written before these items load with the paper values
    cfg = {k: v for k, v in a.cfg.to_dict().items() if k not in ("rm_input", "qkv_norm", "out_bias")}
    R2M.from_checkpoint({"config": cfg, "state_dict": sa})
