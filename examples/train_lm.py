"""Train a tiny character-level language model to add, with checkpoints and resume.

    uv run accel launch --num_processes 2 --cpu examples/train_lm.py      # two CPU processes
    python examples/train_lm.py                                           # one process
    uv run accel launch --num_processes 2 --cpu examples/train_lm.py --resume --epochs 12

A decoder-only transformer (pre-norm blocks, causal attention, tied LM head) learns two-digit
addition from facts generated in this file, one per sample, with the sum's digits written
least significant first ("17+25=240" for 42), the order in which carries are worked out. The
facts are split in two: the model trains on 90% and is evaluated on the sums it never saw, so
the eval accuracy (the share of those sums answered exactly) measures how much arithmetic it
learned rather than memorized. On 2 CPU processes it reaches 100% within a few epochs.

The loop is an ordinary PyTorch loop; `Accelerator` makes it run on one or many processes,
with gradient accumulation, mixed precision, experiment tracking (a JSONL file by default,
under <project_dir>/train_lm/metrics.jsonl) and checkpoints under <project_dir>/checkpoints;
the trained weights end in <project_dir>/model/model.safetensors.
A run without --resume starts over in its project_dir; --resume continues from the newest
checkpoint, mid-epoch if that is where it was taken.
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from accel import Accelerator, ProjectConfiguration
from accel.utils import set_seed

# -- data ---------------------------------------------------------------------------------------

VOCAB = "0123456789+=\n"
STOI = {ch: i for i, ch in enumerate(VOCAB)}


def fact(a: int, b: int) -> str:
    """`a+b=` then the sum's digits least significant first, as a sum is worked out by hand
    (carries flow left to right, the direction the model reads): 17+25=24 means 42."""
    return f"{a:02d}+{b:02d}={str(a + b).zfill(3)[::-1]}\n"


ANSWER = slice(6, 9)  # positions of the answer digits in a fact (after "aa+bb=")


def make_facts(max_operand: int = 99, seed: int = 1234) -> list[str]:
    """Every sum with 0 <= a, b <= max_operand, in a fixed shuffled order."""
    facts = [fact(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    random.Random(seed).shuffle(facts)  # the same order on every process and every run
    return facts


class Facts(Dataset):
    """One fact per sample: the input characters and the next character at each position,
    with only the answer digits as targets (the operands are random: nothing to learn)."""

    def __init__(self, facts: list[str]) -> None:
        self.data = torch.tensor([[STOI[ch] for ch in f] for f in facts], dtype=torch.long)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.data[index]
        targets = torch.full_like(row[1:], -100)  # ignored by cross_entropy
        targets[ANSWER.start - 1 : ANSWER.stop - 1] = row[ANSWER]
        return row[:-1], targets


def make_datasets(eval_fraction: float = 0.1) -> tuple[Dataset, Dataset]:
    facts = make_facts()
    n_eval = int(len(facts) * eval_fraction)
    return Facts(facts[n_eval:]), Facts(facts[:n_eval])


# -- model --------------------------------------------------------------------------------------


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(dim, dim=2)
        q, k, v = (t.view(batch, length, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, length, dim))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    """Token + position embeddings, a stack of blocks, and an LM head tied to the embedding."""

    def __init__(self, vocab: int, max_len: int, dim: int, n_layers: int, n_heads: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(Block(dim, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied: one matrix reads and writes characters
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


# -- training helpers ---------------------------------------------------------------------------


class Progress:
    """The optimizer-step count, saved in each checkpoint so a resumed run counts on."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = int(state["step"])


class ProgressBar:
    """A one-line bar on stderr when it is a terminal; otherwise a line every tenth of the run."""

    def __init__(self, total: int, start: int, enabled: bool) -> None:
        self.total, self.start, self.enabled = total, start, enabled
        self.tty = sys.stderr.isatty()
        self.t0 = time.perf_counter()
        self.every = max(1, total // 10)

    def update(self, step: int, loss: float | None, lr: float) -> None:
        if not self.enabled or not (self.tty or step % self.every == 0 or step == self.total):
            return
        rate = (step - self.start) / max(time.perf_counter() - self.t0, 1e-9)
        filled = int(20 * step / self.total)
        line = (
            f"[{'#' * filled}{'.' * (20 - filled)}] step {step}/{self.total} "
            f"loss {'-' if loss is None else f'{loss:.3f}'} lr {lr:.2e} {rate:.1f} steps/s"
        )
        print(f"\r{line}" if self.tty else line, end="" if self.tty else "\n", file=sys.stderr)

    def close(self) -> None:
        if self.enabled and self.tty:
            print(file=sys.stderr)


def warmup_cosine(warmup: int, total: int) -> Callable[[int], float]:
    """LR multiplier: linear warmup over `warmup` steps, then cosine decay to 10% at `total`."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


@torch.no_grad()
def evaluate(accelerator: Accelerator, model: nn.Module, loader: DataLoader) -> dict[str, float]:
    """Loss per answer digit, and the share of held-out sums answered exactly, over all ranks."""
    model.eval()
    losses, correct = [], []
    for inputs, targets in loader:
        logits = model(inputs).float()
        answer = targets != -100
        loss = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        loss = (loss * answer).sum(dim=1) / answer.sum(dim=1)
        exact = ((logits.argmax(dim=-1) == targets) | ~answer).all(dim=1).float()
        # One value per fact; gather_for_metrics drops the facts that were repeated to pad
        # the last batch, so every eval fact counts exactly once.
        loss, exact = accelerator.gather_for_metrics((loss, exact))
        losses.append(loss)
        correct.append(exact)
    model.train()
    losses, correct = torch.cat(losses), torch.cat(correct)
    assert len(losses) == len(loader.dataset), (len(losses), len(loader.dataset))
    return {"eval/loss": losses.mean().item(), "eval/accuracy": correct.mean().item()}


@torch.no_grad()
def add(model: nn.Module, a: int, b: int) -> int:
    """The model's answer to a+b (greedy decoding of the reversed digits)."""
    model.eval()
    device = next(model.parameters()).device
    prompt = fact(a, b)[: ANSWER.start]
    idx = torch.tensor([[STOI[ch] for ch in prompt]], device=device)
    for _ in range(ANSWER.stop - ANSWER.start):
        next_id = model(idx)[0, -1].argmax().view(1, 1)
        idx = torch.cat([idx, next_id], dim=1)
    model.train()
    digits = "".join(VOCAB[i] for i in idx[0, ANSWER.start :].tolist())
    return int(digits[::-1]) if digits.isdigit() else -1


# -- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mixed_precision", choices=["no", "fp16", "bf16", "fp8"], default=None)
    p.add_argument("--gradient_accumulation_steps", type=int, default=None)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--max_steps", type=int, default=None, help="stop after this many steps")
    p.add_argument("--batch_size", type=int, default=32, help="per process")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup_steps", type=int, default=20)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--project_dir", default="./runs/train_lm")
    p.add_argument("--checkpoint_every", type=int, default=50, help="steps between checkpoints")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    p.add_argument("--log_with", default="jsonl", help="tracker names, comma-separated, or none")
    p.add_argument("--log_every", type=int, default=10, help="steps between train-loss logs")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    log_with = None if args.log_with == "none" else args.log_with.split(",")
    accelerator = Accelerator(
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        log_with=log_with,
        project_config=ProjectConfiguration(
            project_dir=args.project_dir, automatic_checkpoint_naming=True, total_limit=2
        ),
    )
    set_seed(args.seed)  # the same initial weights on every process
    checkpoints = Path(args.project_dir) / "checkpoints"
    if not args.resume and accelerator.is_main_process and checkpoints.exists():
        accelerator.print(f"Starting over: removing the old checkpoints in {checkpoints}")
        shutil.rmtree(checkpoints)
    accelerator.wait_for_everyone()

    train_set, eval_set = make_datasets()
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, drop_last=True)
    eval_loader = DataLoader(eval_set, batch_size=args.batch_size)
    train_loader, eval_loader = accelerator.prepare(train_loader, eval_loader)
    # One optimizer step per `gradient_accumulation_steps` batches of the (per-process) loader.
    steps_per_epoch = math.ceil(len(train_loader) / accelerator.gradient_accumulation_steps)
    total_steps = args.max_steps or args.epochs * steps_per_epoch
    epochs = math.ceil(total_steps / steps_per_epoch)

    model = TinyLM(len(VOCAB), ANSWER.stop, args.dim, args.layers, args.heads)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    # The prepared scheduler steps once per process at each optimizer step (a schedule written
    # for one process then spans the same number of samples on N), so count in those ticks.
    ticks = accelerator.num_processes
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_cosine(args.warmup_steps * ticks, total_steps * ticks)
    )
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)

    if args.resume:
        accelerator.load_state()  # the newest complete checkpoint under project_dir
        accelerator.print(f"Resumed at step {progress.step}, epoch {train_loader.iteration}")
    jsonl = {"resume_step": progress.step + 1} if args.resume else {"overwrite": True}
    accelerator.init_trackers(
        "train_lm",
        config=vars(args) | {"num_processes": accelerator.num_processes},
        init_kwargs={"jsonl": jsonl} if log_with and "jsonl" in log_with else None,
    )
    accelerator.print(
        f"{sum(p.numel() for p in model.parameters())} parameters, {len(train_set)} train and "
        f"{len(eval_set)} eval facts, {accelerator.num_processes} process(es), "
        f"{total_steps} steps of {args.batch_size * accelerator.num_processes} facts "
        f"x {accelerator.gradient_accumulation_steps} accumulation"
    )
    train(
        accelerator,
        args,
        model,
        optimizer,
        scheduler,
        train_loader,
        eval_loader,
        progress,
        total_steps,
        epochs,
    )

    # The trained weights, for inference: <project_dir>/model/model.safetensors.
    accelerator.save_model(model, Path(args.project_dir) / "model")
    if accelerator.is_main_process:
        plain = accelerator.unwrap_model(model)
        for a, b in [(12, 34), (58, 27), (99, 1)]:
            accelerator.print(f"{a}+{b} = {add(plain, a, b)} (true {a + b})")
    accelerator.end_training()


def train(
    accelerator: Accelerator,
    args: argparse.Namespace,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    train_loader: DataLoader,
    eval_loader: DataLoader,
    progress: Progress,
    total_steps: int,
    epochs: int,
) -> None:
    """The loop: accumulate, clip, step; log every few steps; evaluate each epoch; save."""
    bar = ProgressBar(total_steps, progress.step, enabled=accelerator.is_main_process)
    saved_at = progress.step if args.resume else -1
    window_loss, window_batches, mean = torch.zeros(()), 0, None

    def save() -> None:
        nonlocal saved_at
        if saved_at != progress.step:
            accelerator.save_state()
            saved_at = progress.step

    if not args.resume:  # a baseline, so the log shows how far the loss falls
        metrics = evaluate(accelerator, model, eval_loader)
        accelerator.log(metrics, step=0)
        accelerator.print(f"before training: eval loss {metrics['eval/loss']:.4f}")

    for epoch in range(train_loader.iteration, epochs):
        if progress.step >= total_steps:
            break
        # A restored loader keeps its mid-epoch position for the epoch it was saved in.
        train_loader.set_epoch(epoch)
        for inputs, targets in train_loader:
            with accelerator.accumulate(model):
                logits = model(inputs)
                loss = F.cross_entropy(logits.float().transpose(1, 2), targets)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            window_loss += loss.detach().cpu()
            window_batches += 1
            if not accelerator.sync_gradients:
                continue
            progress.step += 1
            lr = scheduler.get_last_lr()[0]
            if progress.step % args.log_every == 0 or progress.step == total_steps:
                mean = accelerator.reduce(window_loss / window_batches, "mean").item()
                accelerator.log({"train/loss": mean, "train/lr": lr}, step=progress.step)
                window_loss, window_batches = torch.zeros(()), 0
            bar.update(progress.step, mean, lr)
            # A checkpoint at the epoch's last batch waits for the evaluation below, so that
            # it records the next epoch as the place to resume.
            if progress.step % args.checkpoint_every == 0 and not train_loader.end_of_dataloader:
                save()
            if progress.step >= total_steps and not train_loader.end_of_dataloader:
                break  # (at the last batch, let the loop end so the loader moves to the next epoch)
        metrics = evaluate(accelerator, model, eval_loader)
        accelerator.log(metrics | {"epoch": epoch}, step=progress.step)
        bar.close()
        accelerator.print(
            f"epoch {epoch} step {progress.step}: eval loss {metrics['eval/loss']:.4f}, "
            f"accuracy {metrics['eval/accuracy']:.3f}"
        )
        if progress.step % args.checkpoint_every == 0 or progress.step >= total_steps:
            save()


if __name__ == "__main__":
    main()
