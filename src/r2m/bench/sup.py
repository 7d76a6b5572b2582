"""``r2m bench sup``: training throughput (sentences/s) of a supervised baseline on synthetic pairs.

One timed step = encode the image features, teacher-forced forward, the per-word NLL over valid
positions, backward, clipping and an Adam update (with L2 as weight_decay) — a ``train_sup`` step.
Defaults: m-RNN at the paper's sizes (128/256/256/512), VGG16 fc7 features (4096), a vocabulary of
10,000 words, batch 64, captions of 16 steps incl. <#end>.
"""

from __future__ import annotations

import time

import torch

from r2m.utils.cliargs import bench_parser as parser
from r2m.utils.cliargs import int_in, step_options


def bench_sup(model_name: str, device: str, steps: int, warmup: int, batch: int, length: int, vocab: int,
              feat_dim: int, grid: int, seed: int = 0) -> dict:
    from r2m.models.catalog import build_sup_model, sup_model
    from r2m.params import Params

    torch.manual_seed(seed)
    dev = torch.device(device)
    section = Params.model_fields[model_name].default_factory().model_dump()
    shapes = {"pooled": (feat_dim,), "grid": (grid, grid, feat_dim)}
    model = build_sup_model(model_name, section, vocab, shapes).to(dev).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, weight_decay=1e-5)
    g = torch.Generator().manual_seed(seed)
    feats = {k: torch.rand((batch, *shapes[k]), generator=g).to(dev) for k in sup_model(model_name).feature_kinds}
    targets = torch.randint(4, vocab, (batch, length), generator=g).to(dev)
    targets[:, -1] = 2
    inputs = torch.cat((torch.ones(batch, 1, dtype=torch.long, device=dev), targets[:, :-1]), 1)
    lengths = torch.full((batch,), length, device=dev)

    def step() -> None:
        loss, _ = model.loss(model.encode(feats), inputs, targets, lengths)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()

    for _ in range(warmup):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    return {"model": model_name, "device": device, "params": model.param_count(), "step_s": dt / steps,
            "sentences_per_s": batch * steps / dt}


def main(argv: list[str] | None = None) -> int:
    p = parser("sup", __doc__.splitlines()[0])
    from r2m.params import SUP_MODEL_NAMES

    p.add_argument("--model", choices=SUP_MODEL_NAMES, default="mrnn")
    step_options(p, steps=10, warmup=2, batch=64, length=16, vocab=10000)
    p.add_argument("--feat-dim", type=int_in(1, 65536), default=4096)
    p.add_argument("--grid", type=int_in(1, 256), default=14)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else []) if args.device == "auto" else [args.device]
    for dev in devices:
        r = bench_sup(args.model, dev, args.steps, args.warmup, args.batch, args.length, args.vocab,
                      args.feat_dim, args.grid)
        print(f"{r['model']} on {r['device']}: {r['params']:,} parameters, batch {args.batch} x {args.length} steps, "
              f"vocabulary {args.vocab}: {r['step_s'] * 1000:.1f} ms/step, {r['sentences_per_s']:.0f} sentences/s")
    return 0
