"""Lightning 2.6.6's answers for issue 41's items 1-3, computed while the test runs.

    lightning_live_values.py OUT_DIR

tests/trainer/lightning_loop_test.cpp runs this with the project's Python
and fits the same runs with strata: ModelCheckpoint's state in two files
of one step and save_last at the end of a fit that saved nothing (the
files Lightning leaves), and the metrics.csv Lightning's CSVLogger writes
with a LearningRateMonitor under gradient accumulation. The module is the
C++ test's Probe (y = x on index data, SGD, validation logging
val_loss = 100 + global_step), its Linear(1, 1) set to w = 0.5, b = 0 so
that both sides log the same losses. One process for every case (importing
Lightning is most of the time). Prints one JSON object; exit status 77
when lightning is not installed.
"""
import csv
import json
import logging
import os
import sys
import warnings

try:
    import torch
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger
    from torch.utils.data import DataLoader, TensorDataset
except ImportError as e:
    print("lightning is not installed (%s)" % e, file=sys.stderr)
    sys.exit(77)

warnings.filterwarnings("ignore")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


def indices(n, batch):
    x = torch.arange(n, dtype=torch.float32).unsqueeze(1)
    return DataLoader(TensorDataset(x, x.clone()), batch_size=batch)


class Probe(pl.LightningModule):
    """lr, and a StepLR(step_size=1, gamma=0.5) stepped each "step" or "epoch" when scheduler is set."""

    def __init__(self, lr=0.01, scheduler=None):
        super().__init__()
        self.linear = torch.nn.Linear(1, 1)
        with torch.no_grad():
            self.linear.weight.fill_(0.5)
            self.linear.bias.zero_()
        self.lr = lr
        self.scheduler = scheduler

    def training_step(self, batch, idx):
        x, y = batch
        loss = (self.linear(x) - y).pow(2).mean() * 1e-3
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch, idx):
        self.log("val_loss", 100.0 + self.trainer.global_step)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr)
        if self.scheduler is None:
            return optimizer
        step_lr = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": step_lr, "interval": self.scheduler}}


class StopAtStep(pl.Callback):
    """Sets should_stop after the batch that reaches `step` (as a Timer would)."""

    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, module, outputs, batch, idx):
        if trainer.global_step == self.step:
            trainer.should_stop = True


def fit(root, module, train, val=None, **kw):
    kw.setdefault("logger", False)
    t = pl.Trainer(default_root_dir=root, accelerator="cpu", devices=1, enable_progress_bar=False,
                   enable_model_summary=False, num_sanity_val_steps=0, **kw)
    t.fit(module, train, val)
    return t


def files(d):
    return sorted(os.listdir(d)) if os.path.exists(d) else []


def main(root):
    out = {}
    # Item 1: two checkpoints of one step (epoch=2-step=30 and last.ckpt, save_last,
    # top -1, 10 batches x 3 epochs): the ModelCheckpoint state inside each.
    d = os.path.join(root, "same_step")
    mc = ModelCheckpoint(dirpath=d, save_last=True, save_top_k=-1)
    fit(root, Probe(), indices(40, 4), max_epochs=3, callbacks=[mc])

    def mc_state(name):
        state = torch.load(os.path.join(d, name), weights_only=False)["callbacks"]
        (key,) = [k for k in state if k.startswith("ModelCheckpoint")]
        return state[key]

    out["same_step_same_state"] = dict(equal=mc_state("epoch=2-step=30.ckpt") == mc_state("last.ckpt"),
                                       files=files(d))
    # Item 2: save_last with save_top_k=0; and with a monitor never logged (no validation data).
    d = os.path.join(root, "save_last_top_0")
    mc = ModelCheckpoint(dirpath=d, save_last=True, save_top_k=0)
    t = fit(root, Probe(), indices(8, 4), max_epochs=2, callbacks=[mc])
    out["save_last_top_0"] = dict(files=files(d), last=os.path.basename(mc.last_model_path),
                                  global_step=t.global_step)
    d = os.path.join(root, "save_last_monitor_missing")
    mc = ModelCheckpoint(dirpath=d, monitor="val_nope", save_last=True, save_top_k=1)
    fit(root, Probe(), indices(8, 4), max_epochs=2, callbacks=[mc])
    out["save_last_monitor_missing"] = dict(files=files(d), last=os.path.basename(mc.last_model_path))
    # Item 3: LearningRateMonitor with accumulate_grad_batches=2, 2 epochs, validation at
    # each epoch's end; each run's settings and the rows of its metrics.csv as csv.reader
    # reads them.
    lr_runs = {
        # logging_interval "step", a per-step schedule, every step logged: 6 batches (3 steps) an epoch.
        "step_interval_step_schedule": dict(interval="step", scheduler="step", batches=6, log_every_n_steps=1),
        # "epoch", the same schedule: one row at each epoch's start.
        "epoch_interval_step_schedule": dict(interval="epoch", scheduler="step", batches=6, log_every_n_steps=1),
        # "step", an epoch schedule, every 2nd step logged: 5 batches (steps of 2, 2, 1) an epoch.
        "step_interval_every_2_epoch_schedule": dict(interval="step", scheduler="epoch", batches=5,
                                                     log_every_n_steps=2),
        # every 2nd step logged, should_stop set after step 3 (8 batches an epoch): step 3's
        # values are logged though off the cadence.
        "step_interval_stop_at_3": dict(interval="step", scheduler="step", batches=8, log_every_n_steps=2,
                                        stop_at_step=3),
    }
    out["lr_monitor"] = {}
    for name, run in lr_runs.items():
        run.setdefault("stop_at_step", None)
        callbacks = [LearningRateMonitor(logging_interval=run["interval"])]
        if run["stop_at_step"] is not None:
            callbacks.append(StopAtStep(run["stop_at_step"]))
        logger = CSVLogger(root, name=name)
        fit(root, Probe(lr=0.1, scheduler=run["scheduler"]), indices(run["batches"], 1), indices(4, 4),
            max_epochs=2, accumulate_grad_batches=2, log_every_n_steps=run["log_every_n_steps"], logger=logger,
            enable_checkpointing=False, callbacks=callbacks)
        with open(os.path.join(logger.log_dir, "metrics.csv"), newline="") as f:
            out["lr_monitor"][name] = dict(run, rows=list(csv.reader(f)))
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main(sys.argv[1])
