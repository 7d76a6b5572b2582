"""The static-shape training step (r2m.training.step): the same losses and gradients as
today's dynamic step on ragged batches (L_XE, L_S, L_M, L_I; both profiles' loss forms), the step
decision and its CUDA-graph fallback (driven on CPU with a stand-in for torch.cuda), the static
buffers' copy-in, the deferred non-finite check and the TF32 switch."""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from pathlib import Path

import pytest
import torch

from r2m import runtime as R
from r2m.bench.schedule import synthetic_image, synthetic_text
from r2m.models.r2m import R2M, R2MConfig
from r2m.text.vocab import END
from r2m.training import loop as L
from r2m.training import step as ST
from r2m.training.data import ImageBatch, StaticImageBatch, StaticTextBatch, TextBatch, pad_image, pad_text
from r2m.training.stage_losses import image_objective, text_objective
from test_loop import Batch, Sched  # the loop's toy batch and schedule

V, IMAGE_DIM, MAX_LEN = 23, 10, 9

CONFIGS = {  # ours, and the official profile's model switches
    "ours": dict(),
    "official": dict(init="official", dropout_scope="encoder", rm_input="always", qkv_norm=True),
}


def _model(cfg: str, seed: int = 0) -> R2M:
    torch.manual_seed(seed)
    m = R2M(R2MConfig(vocab_size=V, d=16, heads=2, d_k=8, dropout=0.0, image_dim=IMAGE_DIM, **CONFIGS[cfg]))
    return m.train()  # training mode (dropout 0: both steps see the same values)


def _text_batch(seed: int) -> TextBatch:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, MAX_LEN + 1, (7,), generator=g)
    lengths[0] = 2  # ragged, and shorter than max_len
    b = synthetic_text(g, lengths, V, 4)
    return dataclasses.replace(b, concepts=b.concepts[:, :int(b.concept_lens.max())])


def _image_batch(seed: int) -> ImageBatch:
    return synthetic_image(torch.Generator().manual_seed(seed), [str(i) for i in range(6)], V, 3, IMAGE_DIM)


def _loss_and_grads(model: R2M, fn) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss, comp = fn(model)
    loss.backward()
    grads = {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}
    return loss.detach(), {k: v.detach() for k, v in comp.items()}, grads


def _assert_same(dyn, sta) -> None:
    """Losses to 1e-6; gradients to 1e-6 of the model's gradient scale (its largest element, at
    least 1): both steps run in float32 and sum in different orders (the dynamic CPU step's fused
    chunked L_XE against the masked mean), which moves the last bits of ~13-sized gradients."""
    (l1, c1, g1), (l2, c2, g2) = dyn, sta
    torch.testing.assert_close(l2, l1, rtol=1e-6, atol=1e-6)
    assert set(c1) == set(c2)
    for k in c1:
        torch.testing.assert_close(c2[k], c1[k], rtol=1e-6, atol=1e-6)
    scale = max(1.0, max(float(g.abs().max()) for g in g1.values()))
    assert any(g.abs().sum() > 0 for g in g1.values())
    for n in g1:
        torch.testing.assert_close(g2[n], g1[n], rtol=0, atol=1e-6 * scale, msg=lambda m, n=n: f"grad of {n}: {m}")


TEXT_FORMS = [  # (beta, rec, xe_reduction, similarity): L_XE and L_S under both profiles' forms
    (None, "sum_normalized", "token_mean", "cosine"),
    (None, "sum_normalized", "sentence_sum", "cosine"),
    (0.3, "sum_normalized", "token_mean", "cosine"),
    (0.3, "mse_raw", "sentence_sum", "inner"),
]


@pytest.mark.parametrize("cfg", list(CONFIGS))
@pytest.mark.parametrize("form", TEXT_FORMS, ids=lambda f: "-".join(str(x) for x in f))
@pytest.mark.parametrize("seed", [0, 1])
def test_static_text_step_matches_the_dynamic_one(cfg: str, form, seed: int) -> None:
    beta, rec, red, sim = form
    batch = _text_batch(seed)
    static = pad_text(batch, MAX_LEN, 6)
    assert isinstance(static, StaticTextBatch) and static.inputs.shape[1] == MAX_LEN > batch.inputs.shape[1]
    assert static.concepts.shape[1] == 6 > batch.concepts.shape[1]
    model = _model(cfg, seed)
    twin = copy.deepcopy(model)
    dyn = _loss_and_grads(model, lambda m: text_objective(m, batch, beta, rec, red, sim))
    sta = _loss_and_grads(twin, lambda m: text_objective(m, static, beta, rec, red, sim))
    _assert_same(dyn, sta)


ENDS = torch.tensor([2, 4, 3, 6, 2, 5])  # the step each greedy caption ends at (all before MAX_LEN)


def _ragged_ending(model: R2M) -> R2M:
    """``model`` whose greedy captions end at :data:`ENDS` (a constant <#end> bonus from that step
    on, no gradient), so the dynamic step really stops early, at max(ENDS) < max_len."""
    orig, t = model.logits, [0]

    def logits(h: torch.Tensor) -> torch.Tensor:
        out = orig(h)
        bonus = torch.zeros_like(out)
        bonus[:, END] = 100.0 * (t[0] >= ENDS - 1).to(out.dtype)
        t[0] += 1
        return out + bonus

    model.logits = logits
    return model


IMAGE_FORMS = [  # (gamma, rec, rank, similarity): L_M and L_I under both profiles' forms
    (0.0, "sum_normalized", "vsepp", "cosine"),
    (0.7, "sum_normalized", "vsepp", "cosine"),
    (0.0, "mse_raw", "official", "inner"),
    (0.7, "mse_raw", "official", "inner"),
]


@pytest.mark.parametrize("cfg", list(CONFIGS))
@pytest.mark.parametrize("form", IMAGE_FORMS, ids=lambda f: "-".join(str(x) for x in f))
def test_static_image_step_matches_the_dynamic_one(cfg: str, form) -> None:
    gamma, rec, rank, sim = form
    batch = _image_batch(3)
    model = _model(cfg, 3)
    static = pad_image(batch, 5)
    assert isinstance(static, StaticImageBatch) and static.concepts.shape[1] == 5
    with torch.no_grad():  # the dynamic greedy stops at the last end, the static one runs max_len steps
        v = model.encode(batch.concepts, batch.concept_lens)
        g = _ragged_ending(copy.deepcopy(model)).greedy(v, MAX_LEN)
        assert g["tokens"].shape[1] == int(ENDS.max()) < MAX_LEN and torch.equal(g["lengths"], ENDS)
        assert _ragged_ending(copy.deepcopy(model)).greedy(v, MAX_LEN, stop_early=False)["tokens"].shape[1] == MAX_LEN
    model, twin = _ragged_ending(copy.deepcopy(model)), _ragged_ending(copy.deepcopy(model))
    dyn = _loss_and_grads(model, lambda m: image_objective(m, batch, gamma, 0.2, MAX_LEN, rec, rank, sim))
    sta = _loss_and_grads(twin, lambda m: image_objective(m, static, gamma, 0.2, MAX_LEN, rec, rank, sim))
    _assert_same(dyn, sta)


# --------------------------------------------------------------------------- the decision
def test_step_mode_decides_static_and_graph() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    m = ST.step_mode(cpu)
    assert (m.static, m.graph) == (False, False) and "cpu" in m.why
    assert ST.step_mode(cpu, static="1") == ST.StepMode(True, False, m.why)
    assert ST.step_mode(cuda) == ST.StepMode(True, True, "")
    assert "R2M_CUDA_GRAPH=0" in ST.step_mode(cuda, want_graph=False).why
    assert "DDP" in ST.step_mode(cuda, distributed=True).why
    off = ST.step_mode(cuda, static="0")
    assert (off.static, off.graph) == (False, False) and "dynamic shapes" in off.why
    with pytest.raises(ValueError, match="R2M_STATIC_STEP"):
        ST.step_mode(cpu, static="yes")


def test_make_step_logs_once_why_the_graph_is_off_on_cuda(caplog) -> None:
    model = torch.nn.Linear(2, 1)
    eager = ST.EagerStep(model, torch.optim.SGD(model.parameters(), lr=0.1), lambda b: (model(b).sum(), {}), 1.0)
    log = logging.getLogger("t")
    with caplog.at_level(logging.INFO, "t"):
        assert ST.make_step(eager, ST.step_mode(torch.device("cpu")), log, "x") is eager
        assert not caplog.records  # CPU: nothing to say
        ST.make_step(eager, ST.step_mode(torch.device("cuda"), distributed=True), log, "x")
    assert [r.getMessage() for r in caplog.records] == ["x: CUDA graph off (DDP (torchrun) trains eagerly)"]


# --------------------------------------------------------------------------- static buffers
def test_static_buffers_copy_in() -> None:
    a, b = pad_text(_text_batch(0), MAX_LEN, 6), pad_text(_text_batch(1), MAX_LEN, 6)
    buf = ST.static_buffers(a)
    assert isinstance(buf, StaticTextBatch) and buf.inputs.data_ptr() != a.inputs.data_ptr()
    ptrs = [t.data_ptr() for t in (buf.concepts, buf.concept_lens, buf.inputs, buf.targets, buf.lengths)]
    out = ST.copy_into(buf, b)
    assert out is buf and ptrs == [t.data_ptr() for t in (buf.concepts, buf.concept_lens, buf.inputs,
                                                           buf.targets, buf.lengths)]  # in place
    for name in ("concepts", "concept_lens", "inputs", "targets", "lengths"):
        assert torch.equal(getattr(buf, name), getattr(b, name))
    with pytest.raises(ValueError, match="differ from the captured"):
        ST.copy_into(buf, pad_text(_text_batch(0), MAX_LEN + 1, 6))
    img = pad_image(_image_batch(0), 5)
    ibuf = ST.copy_into(ST.static_buffers(img), pad_image(_image_batch(1), 5))
    assert isinstance(ibuf, StaticImageBatch) and torch.equal(ibuf.feats, _image_batch(1).feats)
    assert ST.signature(img) == ST.signature(ibuf)


def test_static_shape_width_only_grows() -> None:
    shape = ST.StaticShape(lambda b, w: pad_text(b, MAX_LEN, w), 2)
    first = shape(_text_batch(0))
    assert first.concepts.shape[1] == max(2, _text_batch(0).concepts.shape[1])
    wide = TextBatch(torch.zeros(7, 9, dtype=torch.long), *list(vars(_text_batch(1)).values())[1:])
    assert shape(wide).concepts.shape[1] == 9 and shape(_text_batch(0)).concepts.shape[1] == 9


# --------------------------------------------------------------------------- the graph step's control flow
class _FakeCuda:
    """torch.cuda's stream/graph API as no-ops on CPU; ``graph`` raises like a failed capture."""

    class Stream:
        def wait_stream(self, other) -> None:
            pass

    class CUDAGraph:
        pass

    def __init__(self, fail: str) -> None:
        self.fail = fail

    def current_stream(self):
        return self.Stream()

    def stream(self, s):
        import contextlib

        return contextlib.nullcontext()

    def graph(self, g, stream=None):
        raise RuntimeError(self.fail)

    def synchronize(self) -> None:
        pass


def test_graph_step_falls_back_to_eager_when_capture_raises(monkeypatch, caplog) -> None:
    def run(graph: bool) -> tuple[list[float], R2M]:
        model = _model("ours", 5)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        eager = ST.EagerStep(model, opt, lambda b: text_objective(model, b, 0.3), 1.0)
        step = ST.GraphStep(eager, logging.getLogger("g"), "train_s", warmup=2) if graph else eager
        losses = [float(step(pad_text(_text_batch(k), MAX_LEN, 6))[0][0]) for k in range(5)]
        if graph:
            assert not step.used_graph and "capture raised RuntimeError: no capture here" in step.why
        return losses, model

    fake = _FakeCuda("no capture here\nsecond line")
    monkeypatch.setattr(ST, "CUDA_API", fake)
    with caplog.at_level(logging.INFO, "g"):
        got, m1 = run(graph=True)
    monkeypatch.undo()
    want, m2 = run(graph=False)
    assert got == want  # warm-up steps and the fallback are ordinary eager steps
    assert all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values(), strict=True))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["train_s: CUDA graph off from here on (capture raised RuntimeError: no capture here); eager steps"]


def test_graph_record_says_why() -> None:
    mode = ST.step_mode(torch.device("cpu"))
    rec = ST.graph_record(object(), mode)
    assert rec == {"cuda_graph": False, "cuda_graph_off": mode.why, "static_step": False}


# --------------------------------------------------------------------------- the deferred check
class _Toy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 1)

    def checkpoint(self, **meta):
        return {"state_dict": {k: v.detach().cpu() for k, v in self.state_dict().items()}, **meta}


def _toy_spec(work: Path, x: torch.Tensor, loss, schedule: Sched) -> L.Loop:
    """The loop on :class:`_Toy` fitting ``x``'s first column, every batch ``x``, no validation."""
    model = _Toy()
    return L.Loop(name="toy", model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.05),
                  objective=L.LoopObjective(("mse",), loss, lambda m, b: loss(m, b)[1], lambda ev: ev["mse"]),
                  schedule=schedule, batches=lambda s: iter(lambda: Batch(x, x[:, :1]), None),
                  val_batches=lambda: [], device=torch.device("cpu"), work=work, fingerprint="fp",
                  log=logging.getLogger("toy"), lr_param="toy.lr = 0.05")


def _poisoned_mse(at: int, bad: float, calls: list[int]):
    """The toy's mean squared error, times ``bad`` at its ``at``-th call (counted in ``calls[0]``)."""
    def loss(model, b):
        calls[0] += 1
        err = ((model.lin(b.x) - b.y) ** 2).mean()
        return (err * bad if calls[0] == at else err), {"mse": err}
    return loss


def test_deferred_check_stops_at_the_planted_step_and_keeps_last_pt_clean(tmp_path: Path) -> None:
    torch.manual_seed(0)
    x = torch.randn(8, 3)
    calls = [0]
    loss = _poisoned_mse(6, float("nan"), calls)
    with pytest.raises(L.NonFiniteLoss) as err:
        L.fit(_toy_spec(tmp_path, x, loss, Sched(eval_every=6)))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("toy: loss is nan at step 6 (mse=") and "toy.lr = 0.05" in msg
    assert calls[0] == 6  # read at step 6 (a validation step), before validation or a last.pt write
    last = torch.load(tmp_path / "last.pt", weights_only=True)
    assert last["step"] == 4 and all(math.isfinite(r[2]) for r in last["rows"] if r[1] == "train")
    assert all(torch.isfinite(v).all() for v in last["model"]["state_dict"].values())


def test_deferred_check_reads_between_checkpoints(tmp_path: Path) -> None:
    """A NaN at step 5 (no checkpoint, no validation) is found at the step-8 checkpoint, which it
    never writes: last.pt stays the step-4 one."""
    torch.manual_seed(0)
    x = torch.randn(8, 3)
    calls = [0]
    loss = _poisoned_mse(5, float("inf"), calls)
    with pytest.raises(L.NonFiniteLoss, match=r"^toy: loss is inf at step 5 \(mse="):
        L.fit(_toy_spec(tmp_path, x, loss, Sched(steps=12, eval_every=100)))
    assert calls[0] == 8
    assert torch.load(tmp_path / "last.pt", weights_only=True)["step"] == 4


# --------------------------------------------------------------------------- TF32
def test_tf32_switch(monkeypatch) -> None:
    before = torch.get_float32_matmul_precision()
    assert R.apply_tf32(torch.device("cpu"), True) is False
    assert torch.get_float32_matmul_precision() == before  # CPU: untouched
    assert R.Runtime.from_env().tf32 is True and R.Runtime.from_env().cuda_graph is True
    monkeypatch.setenv("R2M_TF32", "0")
    monkeypatch.setenv("R2M_CUDA_GRAPH", "0")
    monkeypatch.setenv("R2M_STATIC_STEP", "1")
    rt = R.Runtime.from_env()
    assert (rt.tf32, rt.cuda_graph, rt.static_step) == (False, False, "1")
    monkeypatch.setenv("R2M_TF32", "off")
    with pytest.raises(R.BadInput, match="R2M_TF32"):
        R.Runtime.from_env()


# --------------------------------------------------------------------------- records
def test_stage_metrics_record_the_step_on_cpu(tmp_path: Path) -> None:
    from r2m.training.stages import train
    from test_training import ctx_for, make_params, make_synthetic

    torch.set_num_threads(1)
    make_synthetic(tmp_path)
    # on the CPU on a CUDA machine too (it failed on the lent H100: the context's default device is auto)
    m = train(ctx_for(tmp_path, "train_xe", make_params(train_xe={"steps": 3}), runtime=R.Runtime(device="cpu")))
    assert m["tf32"] is False and m["cuda_graph"] is False and m["static_step"] is False
    assert "cpu" in m["cuda_graph_off"]


def test_bench_schedule_runs_the_shared_step_and_its_op_hook(monkeypatch) -> None:
    from r2m.bench import schedule as BS

    calls: list[str] = []

    def count(one_step):
        stats, names = one_step()
        calls.append(names[0])
        return {"ops_per_step": 7}

    monkeypatch.setattr(BS, "COUNT_OPS", count)
    torch.set_num_threads(1)
    r = BS.run_schedule("cpu", scale=0.0002, batch=4, vocab=40, d=8, heads=2, d_k=4, graph=False,
                        stages=("train_xe", "train_m"))
    assert (r["tf32"], r["graph"], r["static"]) == (False, False, False) and "cpu" in r["graph_off"]
    assert [s["ops"] for s in r["stages"]] == [{"ops_per_step": 7}] * 2 and calls == ["xe", "rank"]


def test_clip_grad_norm_equals_torchs():
    """The step's clipping is torch's ``clip_grad_norm_`` bit for bit (clipped and unclipped cases)."""
    from r2m.training.step import clip_grad_norm

    g = torch.Generator().manual_seed(3)
    for scale, max_norm in ((10.0, 1.0), (0.01, 5.0)):
        grads = [torch.randn(s, generator=g) * scale for s in ((7, 5), (5,), (3, 4, 2))]
        ours = [torch.nn.Parameter(torch.zeros_like(x)) for x in grads]
        ref = [torch.nn.Parameter(torch.zeros_like(x)) for x in grads]
        for p, q, x in zip(ours, ref, grads, strict=True):
            p.grad, q.grad = x.clone(), x.clone()
        clip_grad_norm(ours, max_norm)
        torch.nn.utils.clip_grad_norm_(ref, max_norm)
        for p, q in zip(ours, ref, strict=True):
            assert torch.equal(p.grad, q.grad)
        assert any(not torch.equal(p.grad, x) for p, x in zip(ours, grads, strict=True)) == (scale == 10.0)
