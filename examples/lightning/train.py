"""A small PyTorch Lightning job, as its users write it: CPU, DDP over gloo with Lightning's own
process launching (``devices=2``: the script starts its second rank itself), ``ModelCheckpoint``
every few optimizer steps with ``save_last``, and ``--ckpt-path last`` to resume. It knows nothing
of ckpt-chaos.

    python examples/lightning/train.py --ckpt-dir /tmp/ckpt --steps 12
    python examples/lightning/train.py --ckpt-dir /tmp/ckpt --steps 12 --ckpt-path last   # resume
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regression(L.LightningModule):
    def __init__(self, lr: float = 1e-2):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}


def dataset(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    y = x @ torch.randn(16, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ckpt-path", default=None, help="resume: a checkpoint file, or 'last'")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--batch", type=int, default=8, help="per rank")
    p.add_argument("--devices", type=int, default=2)
    args = p.parse_args()

    L.seed_everything(0, workers=True)
    checkpoints = ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=args.save_every, save_top_k=-1,
                                  save_last=True)
    trainer = L.Trainer(accelerator="cpu", devices=args.devices, strategy="ddp", max_steps=args.steps,
                        callbacks=[checkpoints], deterministic=True, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    loader = DataLoader(dataset(args.samples, 0), batch_size=args.batch, shuffle=True)
    trainer.fit(Regression(), loader, ckpt_path=args.ckpt_path)


if __name__ == "__main__":
    main()
