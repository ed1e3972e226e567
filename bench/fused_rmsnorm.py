"""Fused all-reduce + residual add + RMSNorm against what a PyTorch user runs.

Three ways to compute, on the same tensors, in the same run:
  fused       torch.ops.mkernel.all_reduce_rmsnorm: one kernel
  mk+torch    torch.ops.mkernel.all_reduce, then `h = y + residual` and
              torch.nn.functional.rms_norm(h, weight): mKernel unfused
  nccl+torch  torch.distributed.all_reduce on an NCCL process group (in place),
              then the same two torch ops: the usual baseline
Timed after warm-up with CUDA events around 20 calls, eagerly (what a
training step pays, host launch costs included) and replayed from a CUDA
graph (what a serving engine's decode step pays); the table holds the
medians per call in microseconds and the ratios to nccl+torch. The three results are
also compared with each other (max |difference| relative to max |value|).

    torchrun --nproc-per-node 1 bench/fused_rmsnorm.py [--tokens 1,16,128,1024,8192] [--hidden 4096,8192]
             [--iters 300] [--share-gpu] [--out table.md]

--share-gpu puts every rank on GPU 0 (NCCL cannot: the nccl+torch column is
left out). With one rank, or ranks sharing one GPU, the numbers are one-GPU
proxies: they show what fusion saves in launches and passes over memory, not
NVLink speed.
"""
import argparse
import os
import statistics
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import mkernel.torch as mt

ap = argparse.ArgumentParser()
ap.add_argument("--tokens", default="1,16,128,1024,8192")
ap.add_argument("--hidden", default="4096,8192")
ap.add_argument("--iters", type=int, default=300)
ap.add_argument("--warmup", type=int, default=30)
ap.add_argument("--share-gpu", action="store_true")
ap.add_argument("--out", default="")
args = ap.parse_args()

local = int(os.environ.get("LOCAL_RANK", "0"))
dev = torch.device("cuda", 0 if args.share_gpu else local)
torch.cuda.set_device(dev)
dist.init_process_group("gloo" if args.share_gpu else "nccl", device_id=None if args.share_gpu else dev)
rank, world = dist.get_rank(), dist.get_world_size()
comm = mt.Communicator()
dtype = torch.bfloat16
eps = 1e-6


def timed(fn, graph):
    """Median microseconds per call: blocks of `per` calls back to back
    (eager), or one CUDA graph of `per` calls replayed (graph)."""
    per = 20
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(args.warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = None
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(per):
                fn()
        g.replay()
        torch.cuda.synchronize()
    ts = []
    for _ in range(max(1, args.iters // per)):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        if g is not None:
            g.replay()
        else:
            for _ in range(per):
                fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000.0 / per)
    return statistics.median(ts)


def rel(a, b):
    a, b = a.float(), b.float()
    return ((a - b).abs().max() / (b.abs().max() + 1e-30)).item()


rows = []
for hidden in [int(h) for h in args.hidden.split(",")]:
    for tokens in [int(t) for t in args.tokens.split(",")]:
        g = torch.Generator(device=dev).manual_seed(1000 * rank + tokens + hidden)
        x = torch.randn(tokens, hidden, device=dev, dtype=dtype, generator=g)
        residual = torch.randn(tokens, hidden, device=dev, dtype=dtype, generator=g)
        weight = (1 + 0.1 * torch.randn(hidden, device=dev, generator=g)).to(dtype)
        buf = x.clone()

        def fused():
            return comm.all_reduce_rmsnorm(x, residual, weight, eps)

        def mk_torch():
            y = torch.ops.mkernel.all_reduce(x, "sum", comm.id)
            h = y + residual
            return F.rms_norm(h, (hidden,), weight, eps), h

        def nccl_torch():
            buf.copy_(x)  # in place on a copy: every iteration reduces the same data
            dist.all_reduce(buf)
            h = buf + residual
            return F.rms_norm(h, (hidden,), weight, eps), h

        # agreement (before timing)
        fo, fro = fused()
        mo, mro = mk_torch()
        agree = max(rel(fo, mo), rel(fro, mro))
        if not args.share_gpu:
            no, _ = nccl_torch()
            agree = max(agree, rel(fo, no))
        for graph in (False, True):
            t_f = timed(fused, graph)
            t_m = timed(mk_torch, graph)
            t_n = None if args.share_gpu else timed(nccl_torch, graph)
            rows.append((graph, tokens, hidden, t_f, t_m, t_n, agree))
            if rank == 0:
                print("%s tokens %5d hidden %5d: fused %.1f us, mk+torch %.1f us, nccl+torch %s us (agree %.2g)" %
                      ("graph" if graph else "eager", tokens, hidden, t_f, t_m, "-" if t_n is None else "%.1f" % t_n,
                       agree), flush=True)

if rank == 0:
    gpu = torch.cuda.get_device_name(dev)
    lines = ["| launch | tokens | hidden | MB | fused us | mk+torch us | nccl+torch us | nccl+torch / fused "
             "| mk+torch / fused | max rel. diff |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for graph, tokens, hidden, t_f, t_m, t_n, agree in rows:
        mb = tokens * hidden * 2 / 2**20
        lines.append("| %s | %d | %d | %.3g | %.1f | %.1f | %s | %s | %.2f | %.2g |" % (
            "graph" if graph else "eager", tokens, hidden, mb, t_f, t_m, "-" if t_n is None else "%.1f" % t_n,
            "-" if t_n is None else "%.2f" % (t_n / t_f), t_m / t_f, agree))
    head = ("world %d (%s), %s, bf16, eps %g, medians of %d calls (blocks of 20) after %d warm-up, torch %s\n\n" %
            (world, "ranks sharing GPU 0" if args.share_gpu else "one GPU per rank", gpu, eps, args.iters,
             args.warmup, torch.__version__))
    text = head + "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
comm.destroy()
dist.destroy_process_group()
