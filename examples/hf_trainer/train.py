"""A small Hugging Face ``transformers.Trainer`` job, as its documentation writes one: a tiny GPT-2
built from a config in code (no download), an in-memory dataset of token ids, ``save_steps`` every
few steps into ``checkpoint-N`` folders, and on relaunch ``trainer.train(resume_from_checkpoint=True)``
when ``get_last_checkpoint`` finds one. CPU, gloo, under torchrun. It knows nothing of ckpt-chaos.

    torchrun --standalone --nproc-per-node 2 examples/hf_trainer/train.py --ckpt-dir /tmp/ckpt --steps 12

``--skip-data-skip``: the planted variant a user could well write, ``ignore_data_skip=True`` ("the
resume is slow with a big dataset, skip the skipping"): a resume in the middle of an epoch starts
the epoch's batches over, so the samples of the steps before the checkpoint are trained on twice.

``--print-losses``: rank 0 prints each step's loss as ``step N loss <float.hex>`` (to compare runs
by hand, bit for bit); ``--crash-after-step N``: every rank exits at once, status 1, after step N
(a crash, to try the resume by hand).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: the model is built from a config
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint


class Tokens(Dataset):
    """``n`` sequences of ``length`` token ids drawn from a seeded generator: a language-model task
    with some structure (each token is the previous one plus a small step, mod the vocabulary)."""

    def __init__(self, n: int, length: int, vocab: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (n, 1), generator=g)
        steps = torch.randint(1, 4, (n, length - 1), generator=g)
        self.ids = torch.cat([start, start + steps.cumsum(1)], 1) % vocab

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class LoggedTrainer(Trainer):
    """``--print-losses``: rank 0 prints each step's training loss, unrounded (the logged ``loss`` is
    rounded to 4 digits)."""

    print_losses = False

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self.print_losses and self.is_world_process_zero():
            print(f"step {self.state.global_step + 1} loss {loss.item().hex()}", flush=True)
        return loss


class CrashAfter(TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os._exit(1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--batch", type=int, default=8, help="per process")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-data-skip", action="store_true", help="planted: ignore_data_skip=True")
    p.add_argument("--print-losses", action="store_true")
    p.add_argument("--crash-after-step", type=int, default=None)
    args = p.parse_args()

    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(args.seed)
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(
        output_dir=str(args.ckpt_dir),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        learning_rate=1e-2,
        warmup_steps=3,
        weight_decay=0.01,
        save_strategy="steps",
        save_steps=args.save_every,
        save_total_limit=2,
        logging_strategy="steps",
        logging_steps=1,
        report_to="none",
        seed=args.seed,
        data_seed=args.seed,
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_num_workers=0,
        disable_tqdm=True,
        ddp_find_unused_parameters=False,
        ignore_data_skip=args.skip_data_skip,
    )
    LoggedTrainer.print_losses = args.print_losses
    trainer = LoggedTrainer(model=model, args=training,
                            train_dataset=Tokens(args.samples, 16, config.vocab_size, args.seed),
                            callbacks=[CrashAfter(args.crash_after_step)] if args.crash_after_step else [])
    last = get_last_checkpoint(str(args.ckpt_dir)) if args.ckpt_dir.is_dir() else None
    if last is not None and trainer.is_world_process_zero():
        print(f"resuming from {last}", flush=True)
    trainer.train(resume_from_checkpoint=True if last is not None else None)
    if trainer.is_world_process_zero():
        print(f"done at step {trainer.state.global_step}", flush=True)
    # Leaving the process group to the interpreter's exit sometimes aborts a rank that has finished
    # ("terminate called without an active exception"); destroying it right after the last gather
    # sometimes deadlocks (gloo's worker thread waits for the GIL to free that gather's tensors while
    # the destructor, holding the GIL, joins it). A barrier first lets every collective finish.
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
