"""Pretrain a small GPT on token blocks, with document masking (torch only, CPU or GPU).

    python examples/pretrain_tokens.py --workdir /tmp/pretrain --steps 60
    torchrun --nproc-per-node=2 examples/pretrain_tokens.py --workdir /tmp/pretrain --steps 60

Makes a synthetic corpus of JSONL documents, trains a BPE tokenizer on it on the spot
(Hugging Face ``tokenizers``: nothing is downloaded), packs it with ``pack_tokens`` (what
``shardstream pack-text`` runs), then trains a two-layer GPT on ``TokenBlocks``: blocks of
``seq_len`` tokens cut across documents and shard ends, each batch with ``cu_seqlens`` and
``position_ids``. Attention never crosses a document: the mask is block-diagonal causal,
made from ``position_ids`` (restart at 0 at each document; ``--mask position_ids``) or from
``cu_seqlens`` (``--mask cu_seqlens``, the layout ``flash_attn_varlen_func`` takes). It saves
a checkpoint every ``--save-every`` steps (the model, the optimizer and the loader's position,
``loader_state_dict``) and resumes from it with ``--resume``, at any world size. Prints one
line per step: ``step N loss X``, and at the end ``tokens T blocks B``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from shardstream import Part, TokenBlocks, TokenIndex, collate_blocks, loader_state_dict
from shardstream.tokens import pack_tokens

WORDS = (
    "the a data shard token block model train loss learn stream read write index epoch rank "
    "worker batch sample document boundary mask attention layer head vector gradient step "
    "memory store object network disk cache order shuffle seed resume exact elastic"
).split()
EOD = "<|endoftext|>"


def make_corpus(path: Path, num_docs: int, seed: int = 0) -> None:
    """``num_docs`` JSONL documents of made-up sentences, with ids that hold dots."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(num_docs):
            sentences = []
            for _ in range(rng.randint(1, 12)):
                words = [rng.choice(WORDS) for _ in range(rng.randint(3, 14))]
                sentences.append(" ".join(words).capitalize() + ".")
            f.write(json.dumps({"id": f"synth.doc.{i}", "text": " ".join(sentences)}) + "\n")


def train_tokenizer(corpus: Path, out: Path, vocab_size: int = 512) -> None:
    """A byte-level BPE trained on the corpus, saved as ``tokenizer.json``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOD], show_progress=False)
    texts = (json.loads(line)["text"] for line in corpus.open(encoding="utf-8"))
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.save(str(out))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # mask: (b, 1, n, n) bool
        x = x + self.out(y.transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, seq_len: int, dim: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab_size, dim), nn.Embedding(seq_len, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.tokens(input_ids) + self.positions(position_ids)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


def mask_from_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """Block-diagonal causal mask (b, 1, n, n): a token sees the earlier tokens of its document."""
    docs = torch.cumsum(position_ids == 0, dim=1)  # a document number per token
    n = position_ids.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool, device=position_ids.device).tril()
    return ((docs[:, :, None] == docs[:, None, :]) & causal)[:, None]


def mask_from_cu_seqlens(cu_seqlens: torch.Tensor, batch: int, seq_len: int) -> torch.Tensor:
    """The same mask from ``cu_seqlens`` over the batch flattened to ``batch * seq_len`` tokens."""
    lengths = torch.diff(cu_seqlens).long()
    docs = torch.repeat_interleave(torch.arange(len(lengths), device=cu_seqlens.device), lengths).view(batch, seq_len)
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=cu_seqlens.device).tril()
    return ((docs[:, :, None] == docs[:, None, :]) & causal)[:, None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--docs", type=int, default=600, help="synthetic documents")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=60, help="steps this run trains (then stops)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--mask", choices=("position_ids", "cu_seqlens"), default="position_ids")
    parser.add_argument("--save-every", type=int, default=20)
    parser.add_argument("--resume", action="store_true", help="resume from WORKDIR/checkpoint.pt")
    args = parser.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        torch.distributed.init_process_group("gloo")
    corpus, tokenizer, data = args.workdir / "corpus.jsonl", args.workdir / "tokenizer.json", args.workdir / "tokens"
    if rank == 0 and not (data / "index.bin").exists():
        args.workdir.mkdir(parents=True, exist_ok=True)
        make_corpus(corpus, args.docs)
        train_tokenizer(corpus, tokenizer)
        # rank 0 packs it all: Part(0, 1), not the part torchrun's RANK/WORLD_SIZE would pick
        whole = Part(0, 1)
        pack_tokens(corpus, data, tokenizer=tokenizer, id_field="id", max_shard_tokens=4096, part=whole, progress=False)
    if world > 1:
        torch.distributed.barrier()

    torch.manual_seed(0)
    blocks = TokenBlocks(data, seq_len=args.seq_len, batch_size=args.batch_size, seed=1)
    module = GPT(TokenIndex.open(data).vocab_size, args.seq_len)
    model = nn.parallel.DistributedDataParallel(module) if world > 1 else module
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    checkpoint = args.workdir / "checkpoint.pt"
    step = 0
    if args.resume and checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        blocks.load_state_dict(state["loader"])  # any world size, number of workers or batch size
        step = state["step"]
    loader = DataLoader(blocks, batch_size=args.batch_size, num_workers=args.num_workers, collate_fn=collate_blocks)
    seen_tokens = seen_blocks = 0
    stop = step + args.steps
    while step < stop:
        consumed = 0  # blocks this rank took from this iterator (what loader_state_dict counts)
        for batch in loader:
            if args.mask == "position_ids":
                mask = mask_from_positions(batch["position_ids"])
            else:
                mask = mask_from_cu_seqlens(batch["cu_seqlens"], *batch["input_ids"].shape)
            logits = model(batch["input_ids"], batch["position_ids"], mask)
            loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            consumed += len(batch["keys"])
            seen_blocks += len(batch["keys"])
            seen_tokens += batch["input_ids"].numel()
            if rank == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            if step % args.save_every == 0 or step == stop:
                state = loader_state_dict(loader, consumed)  # the job's position: the same on every rank
                if rank == 0:
                    saved = {"model": module.state_dict(), "optimizer": optimizer.state_dict(), "loader": state}
                    torch.save({**saved, "step": step}, checkpoint)
            if step >= stop or not math.isfinite(loss.item()):
                break
        else:
            blocks.set_epoch(blocks.epoch + 1)
    if rank == 0:
        print(f"tokens {seen_tokens} blocks {seen_blocks}", flush=True)
    if world > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
