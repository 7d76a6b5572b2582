"""``r2m bench train``: R²M training throughput (sentences/s) on synthetic batches.

One timed step = teacher-forced forward (encoder, FM, decoder RM, reconstructor RM), the loss
(L_S by default: logits on every valid token + ‖v − ṽ‖²), backward, global-norm clipping and an
Adam update — what a text-stage step costs. Defaults are the paper sizes (d 512, H 2, d_k 256,
vocabulary 18,679, batch 256, sentence length 20 incl. <#end>, 3 concepts per sentence).
``--mode image`` times an L_I step instead (greedy free-running decoding of ``--length`` steps).
"""

from __future__ import annotations

import time

import torch

from r2m.losses.objectives import loss_i, loss_s
from r2m.losses.xe import xe_loss
from r2m.models.r2m import R2M, R2MConfig
from r2m.text.vocab import START
from r2m.training.stage_losses import token_xe
from r2m.training.stages import make_adam
from r2m.utils.cliargs import bench_parser as parser
from r2m.utils.cliargs import int_in, step_options


def _devices(arg: str) -> list[str]:
    if arg != "auto":
        return [arg]
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def bench_train(device: str, variant: str, steps: int, warmup: int, batch: int, length: int, vocab: int,
                d: int, heads: int, d_k: int, mode: str = "s", bf16: bool = False, seed: int = 0, fused: bool = True) -> dict:
    torch.manual_seed(seed)
    dev = torch.device(device)
    img_dim = 1536
    model = R2M(R2MConfig.for_variant(variant, vocab_size=vocab, d=d, heads=heads, d_k=d_k,
                                      image_dim=img_dim)).to(dev).train()
    opt = make_adam(model, 1e-4)
    g = torch.Generator().manual_seed(seed)
    concepts = torch.randint(4, vocab, (batch, 3), generator=g).to(dev)
    clens = torch.full((batch,), 3, device=dev)
    targets = torch.randint(4, vocab, (batch, length), generator=g).to(dev)
    targets[:, -1] = 2
    inputs = torch.cat([torch.full((batch, 1), START, device=dev), targets[:, :-1]], 1)
    lengths = torch.full((batch,), length, device=dev)
    feats = torch.randn(batch, img_dim, generator=g).to(dev)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16 and dev.type == "cuda")

    def step() -> float:
        with autocast:
            if mode == "image":
                v = model.encode(concepts, clens)
                out = model.greedy(v, length, stop_early=False)
                loss, _ = loss_i(model.project_image(feats), v, out["v_tilde_raw"], 1.0)
            else:
                out = model(concepts, clens, inputs, lengths, reconstruct=mode == "s")
                h = out["hidden"].reshape(-1, out["hidden"].shape[-1])
                xe = token_xe(model, h, targets.reshape(-1)) if fused else xe_loss(model.logits(h), targets.reshape(-1))
                loss = loss_s(xe, out["v"], out["v_tilde_raw"], 1.0)[0] if mode == "s" else xe
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        opt.step()
        return float(loss.detach())

    for _ in range(warmup):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"device": device, "variant": variant, "mode": mode, "batch": batch, "length": length,
            "params": model.param_count(include_image_proj=False), "threads": torch.get_num_threads(),
            "s_per_step": dt / steps, "sentences_per_s": batch * steps / dt,
            "sentences_per_cpu_s": batch * steps / cpu}


def main(argv: list[str] | None = None) -> int:
    p = parser("train", __doc__.splitlines()[0])
    from r2m.params import VARIANT_NAMES

    p.add_argument("--variant", choices=VARIANT_NAMES, default="r2m")
    step_options(p, steps=3, warmup=1, batch=256, length=20, vocab=18679)
    p.add_argument("--d", type=int_in(1, 16384), default=512)
    p.add_argument("--heads", type=int_in(1, 256), default=2)
    p.add_argument("--d-k", type=int_in(1, 16384), default=256)
    p.add_argument("--mode", choices=["s", "xe", "image"], default="s", help="L_S (default), L_XE or L_I step")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast on CUDA")
    p.add_argument("--no-fused-xe", action="store_true", help="plain logits + cross-entropy (for comparison)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    for dev in _devices(a.device):
        r = bench_train(dev, a.variant, a.steps, a.warmup, a.batch, a.length, a.vocab, a.d, a.heads, a.d_k,
                        a.mode, a.bf16, fused=not a.no_fused_xe)
        print(f"train[{r['mode']}] {r['variant']} on {dev} ({r['threads']} threads): batch {r['batch']} x "
              f"len {r['length']}, {r['params'] / 1e6:.1f}M params: {r['s_per_step']:.3f} s/step, "
              f"{r['sentences_per_s']:.1f} sentences/s ({r['sentences_per_cpu_s']:.1f} per CPU-second)", flush=True)
    return 0
