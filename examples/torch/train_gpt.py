"""A small GPT-like model trained under DDP or FSDP on random tokens: the same
script runs on NCCL and on mKernel, and prints its step times and losses.

    torchrun --nproc-per-node 2 examples/torch/train_gpt.py                  # NCCL
    tools/mkernel-run torchrun --nproc-per-node 2 examples/torch/train_gpt.py  # mKernel's libnccl.so.2
    torchrun --nproc-per-node 2 examples/torch/train_gpt.py --backend mkernel  # mkernel.torch's backend
    ... --fsdp                  # FSDP instead of DDP
    ... --share-gpu             # every rank on GPU 0 (mKernel only: NCCL refuses a GPU twice)

The tokens come from a fixed seed and every rank starts from the same
weights, so two runs of one world size give the same losses when the
all-reduces give the same sums. Rank 0 prints one line per step:
"step N loss L time_ms T".
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, d, heads, layers, ctx):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf"), device=idx.device), diagonal=1)
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--fsdp", action="store_true")
    ap.add_argument("--share-gpu", action="store_true", help="every rank on GPU 0")
    ap.add_argument("--backend", default="nccl",
                    help="nccl, gloo, or mkernel (the mkernel.torch backend: CUDA on mKernel, CPU on gloo)")
    ap.add_argument("--prewarm", action="store_true", help="with --backend mkernel: compile the plans before step 0")
    args = ap.parse_args()

    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", 0 if args.share_gpu else local)
    torch.cuda.set_device(device)
    if args.backend == "mkernel":
        import mkernel.torch

        mkernel.torch.register()
        dist.init_process_group("cuda:mkernel,cpu:gloo")
    else:
        dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(1234)  # the same initial weights on every rank
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = GPT(args.vocab, args.dim, 8, args.layers, args.ctx).to(device)
    if args.fsdp:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        model = FSDP(model, device_id=device)
    else:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    if args.prewarm and args.backend == "mkernel":
        import mkernel

        t = time.perf_counter()
        pg = dist.distributed_c10d._get_default_group()
        pg._comm_for(torch.zeros(1, device=device))
        mkernel.prewarm(pg._mk, dtypes=("fp32",))
        if rank == 0:
            print(f"prewarm {1e3 * (time.perf_counter() - t):.1f} ms", flush=True)

    gen = torch.Generator(device="cpu").manual_seed(100 + rank)  # each rank its own data
    times = []
    for step in range(args.steps):
        idx = torch.randint(0, args.vocab, (args.batch, args.ctx + 1), generator=gen).to(device)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), idx[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)  # the mean loss over ranks, as printed
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        times.append(ms)
        if rank == 0:
            print(f"step {step} loss {total.item() / world:.8f} time_ms {ms:.2f}", flush=True)
    pg = dist.distributed_c10d._get_default_group()
    if rank == 0 and hasattr(pg, "stats"):
        print(f"calls by library: {pg.stats}", flush=True)
    if rank == 0:
        print(f"step 0 (first collectives, plans loaded or compiled) time_ms {times[0]:.2f}", flush=True)
        later = sorted(times[3:]) or times
        print(f"median step time_ms {later[len(later) // 2]:.2f} over steps 3..{args.steps - 1}, "
              f"world {world}, {'FSDP' if args.fsdp else 'DDP'}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
