"""Lightning 2.6.6's answers for the loop settings of issue 25.

tests/trainer/lightning_loop_test.cpp asserts these values as literals;
this script is how they were measured (run it with the venv's Python:
`python tests/trainer/lightning_loop_values.py`). The module is the
C++ test's Probe: y = x regression on index data, SGD; its validation
logs val_loss = 100 + global_step (or a value the case gives), so every
score is known without the weights. Issue 41's items (ModelCheckpoint's
state and save_last, the LearningRateMonitor) are decided by Lightning as
the test runs: tests/trainer/lightning_live_values.py.
"""
import csv
import glob
import json
import os
import sys
import tempfile
import warnings

import torch
import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

warnings.filterwarnings("ignore")
import logging
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


def indices(n, batch):
    x = torch.arange(n, dtype=torch.float32).unsqueeze(1)
    return DataLoader(TensorDataset(x, x.clone()), batch_size=batch)


class Probe(pl.LightningModule):
    def __init__(self, val_value=lambda module: 100.0 + module.trainer.global_step):
        super().__init__()
        self.linear = torch.nn.Linear(1, 1)
        self.val_value = val_value

    def training_step(self, batch, idx):
        x, y = batch
        loss = (self.linear(x) - y).pow(2).mean() * 1e-3
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch, idx):
        self.log("val_loss", float(self.val_value(self)))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Record(Callback):
    """Where each validation ran: (global_step, batches seen in the epoch)."""

    def __init__(self):
        self.validations = []
        self.sanity = 0

    def on_validation_end(self, trainer, module):
        if trainer.sanity_checking:
            self.sanity += 1
        else:
            self.validations.append(trainer.global_step)


def trainer(root, **kw):
    kw.setdefault("enable_progress_bar", False)
    kw.setdefault("enable_model_summary", False)
    kw.setdefault("logger", False)
    kw.setdefault("enable_checkpointing", False)
    kw.setdefault("num_sanity_val_steps", 0)
    return pl.Trainer(default_root_dir=root, accelerator="cpu", devices=1, **kw)


def run(name, root, module, train, val=None, **kw):
    rec = Record()
    kw["callbacks"] = kw.get("callbacks", []) + [rec]
    if any(isinstance(c, ModelCheckpoint) for c in kw["callbacks"]):
        kw["enable_checkpointing"] = True
    t = trainer(root, **kw)
    t.fit(module, train, val)
    return t, rec


def ckpts(mc):
    return {os.path.basename(p): round(float(v), 6) for p, v in mc.best_k_models.items()}


out = {}
with tempfile.TemporaryDirectory() as root:
    # 1. EarlyStopping at an epoch's end: val_loss never improves.
    t, rec = run("1", root, Probe(lambda m: 5.0), indices(16, 4), indices(8, 4), max_epochs=10,
                 callbacks=[EarlyStopping("val_loss", patience=1)])
    out["1_early_stop_epoch_end"] = dict(global_step=t.global_step, current_epoch=t.current_epoch,
                                         validations=rec.validations)
    # 2. val_check_interval 1/3 over 64 batches.
    t, rec = run("2", root, Probe(), indices(64, 1), indices(4, 4), max_epochs=1, val_check_interval=1 / 3)
    out["2_fraction_third_of_64"] = dict(validations=rec.validations)
    # 3. check_val_every_n_epoch=None, val_check_interval=3, accumulate 2, 6 batches x 2 epochs.
    t, rec = run("3", root, Probe(), indices(6, 1), indices(4, 4), max_epochs=2, val_check_interval=3,
                 check_val_every_n_epoch=None, accumulate_grad_batches=2)
    out["3_none_every_3_batches_accum2"] = dict(validations=rec.validations, global_step=t.global_step)
    # 4. limit_train_batches=0.
    t, rec = run("4", root, Probe(), indices(16, 4), indices(8, 4), max_epochs=3, limit_train_batches=0)
    out["4_limit_train_0"] = dict(global_step=t.global_step, current_epoch=t.current_epoch,
                                  validations=rec.validations)
    # 5. ModelCheckpoint(monitor="epoch"/"step"), mode max, top 2, 4 epochs of 4 batches.
    for monitor in ("epoch", "step"):
        d = os.path.join(root, "ck5" + monitor)
        mc = ModelCheckpoint(dirpath=d, monitor=monitor, mode="max", save_top_k=2)
        t, rec = run("5", root, Probe(), indices(16, 4), max_epochs=4, callbacks=[mc])
        out["5_monitor_" + monitor] = dict(best_k=ckpts(mc), best=os.path.basename(mc.best_model_path),
                                           best_score=float(mc.best_model_score),
                                           files=sorted(os.listdir(d)))
    # 6, 7, 13 (logged step inside an accumulation). CSV header, rows, logged_metrics:
    # 6 batches, accumulate 2, validation every 3 batches, log every step, 1 epoch.
    logger = CSVLogger(root, name="csv6")
    t, rec = run("6", root, Probe(), indices(6, 1), indices(4, 4), max_epochs=1, val_check_interval=3,
                 accumulate_grad_batches=2, log_every_n_steps=1, logger=logger)
    with open(os.path.join(logger.log_dir, "metrics.csv")) as f:
        rows = list(csv.reader(f))
    out["6_csv"] = dict(header=rows[0], rows=rows[1:], logged_metrics=sorted(t.logged_metrics),
                        validations=rec.validations)
    # 7 without a logger.
    t, rec = run("7", root, Probe(), indices(8, 4), indices(4, 4), max_epochs=1)
    out["7_logged_metrics_no_logger"] = sorted(t.logged_metrics)
    # 9. monitor val_loss, every_n_train_steps=2, save_last, validation every 5 batches, 10 batches.
    d = os.path.join(root, "ck9")
    mc = ModelCheckpoint(dirpath=d, monitor="val_loss", every_n_train_steps=2, save_last=True, save_top_k=-1)
    t, rec = run("9", root, Probe(), indices(10, 1), indices(4, 4), max_epochs=1, val_check_interval=5,
                 callbacks=[mc])
    out["9_step_ckpt_before_validation"] = dict(best_k=ckpts(mc), files=sorted(os.listdir(d)),
                                                validations=rec.validations)
    # 10. a step save on an epoch's last batch, validation at each epoch end:
    # 4 batches x 3 epochs, every_n_train_steps=4, top -1.
    d = os.path.join(root, "ck10")
    mc = ModelCheckpoint(dirpath=d, monitor="val_loss", every_n_train_steps=4, save_top_k=-1)
    t, rec = run("10", root, Probe(), indices(4, 1), indices(4, 4), max_epochs=3, callbacks=[mc])
    out["10_save_on_last_batch"] = dict(best_k=ckpts(mc), best_score=float(mc.best_model_score),
                                        validations=rec.validations)
    # 10. the same with validation every 2 batches (not only at the epoch's end): the
    # save on the epoch's last batch waits for the validation after it.
    d = os.path.join(root, "ck10b")
    mc = ModelCheckpoint(dirpath=d, monitor="val_loss", every_n_train_steps=4, save_top_k=-1)
    t, rec = run("10b", root, Probe(), indices(4, 1), indices(4, 4), max_epochs=2, val_check_interval=2,
                 callbacks=[mc])
    out["10_save_on_last_batch_waits"] = dict(best_k=ckpts(mc), best_score=float(mc.best_model_score),
                                              validations=rec.validations)
    # 9/10: a monitor never logged, without validation data: a warning, no checkpoint ranked.
    d = os.path.join(root, "ck10c")
    mc = ModelCheckpoint(dirpath=d, monitor="val_nope", save_top_k=1)
    t, rec = run("10c", root, Probe(), indices(8, 4), max_epochs=2, callbacks=[mc])
    out["10_monitor_missing_without_validation"] = dict(files=sorted(os.listdir(d)) if os.path.exists(d) else [], global_step=t.global_step)
    # 11. val_check_interval=6 into 20 batches, 2 epochs.
    t, rec = run("11", root, Probe(), indices(20, 1), indices(4, 4), max_epochs=2, val_check_interval=6)
    out["11_interval_6_of_20"] = dict(validations=rec.validations)
    # 12. mid-epoch stops: max_steps=7 with 4 batches an epoch; EarlyStopping with
    # validation every 2 batches of 4, val_loss never improving.
    t, rec = run("12a", root, Probe(), indices(16, 4), max_epochs=10, max_steps=7)
    out["12_max_steps_7_of_4"] = dict(global_step=t.global_step, current_epoch=t.current_epoch)
    t, rec = run("12b", root, Probe(), indices(16, 4), max_epochs=10, max_steps=3)
    out["12_max_steps_3_of_4"] = dict(global_step=t.global_step, current_epoch=t.current_epoch)
    t, rec = run("12c", root, Probe(lambda m: 5.0), indices(4, 1), indices(4, 4), max_epochs=10,
                 val_check_interval=2, callbacks=[EarlyStopping("val_loss", patience=2)])
    out["12_early_stop_mid_epoch"] = dict(global_step=t.global_step, current_epoch=t.current_epoch,
                                          validations=rec.validations)
    # 12/15: should_stop set in a batch's hooks (a Timer's way): a validation follows
    # that batch. 8 batches, validation at the epoch's end, stop set after batch 3.
    class StopAt3(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, idx):
            if trainer.global_step == 3:
                trainer.should_stop = True
    t, rec = run("12d", root, Probe(), indices(8, 1), indices(4, 4), max_epochs=3, callbacks=[StopAt3()])
    out["12_should_stop_in_a_batch"] = dict(global_step=t.global_step, current_epoch=t.current_epoch,
                                            validations=rec.validations)
    # EarlyStopping with check_val_every_n_epoch=2: the epochs without validation are not checked.
    t, rec = run("12e", root, Probe(lambda m: 5.0), indices(4, 2), indices(4, 4), max_epochs=10,
                 check_val_every_n_epoch=2, callbacks=[EarlyStopping("val_loss", patience=1)])
    out["12_early_stop_every_2_epochs"] = dict(global_step=t.global_step, current_epoch=t.current_epoch,
                                               validations=rec.validations)
    # 13. sanity validation (default num_sanity_val_steps=2) and the default checkpoint folder with a logger.
    logger = CSVLogger(root, name="csv13")
    calls = []
    m = Probe(lambda m: (calls.append(m.trainer.sanity_checking), 100.0 + m.trainer.global_step)[1])
    t, rec = run("13", root, m, indices(8, 4), indices(16, 4), max_epochs=1, num_sanity_val_steps=2,
                 logger=logger, enable_checkpointing=True, log_every_n_steps=1)
    with open(os.path.join(logger.log_dir, "metrics.csv")) as f:
        rows13 = list(csv.reader(f))
    out["13_sanity"] = dict(sanity_val_batches=sum(calls), val_batches=len(calls) - sum(calls),
                            sanity_ends=rec.sanity, csv=rows13,
                            ckpt_dir=os.path.relpath(t.checkpoint_callback.dirpath, root),
                            ckpt_files=sorted(os.listdir(t.checkpoint_callback.dirpath)))
    # 15. fast_dev_run=2 and overfit_batches=2 (10 training batches, 4 validation batches).
    logger = CSVLogger(root, name="csv15")
    calls = []
    m = Probe(lambda m: (calls.append(1), 1.0)[1])
    t, rec = run("15a", root, m, indices(10, 1), indices(4, 1), max_epochs=5, fast_dev_run=2, logger=logger,
                 enable_checkpointing=True, num_sanity_val_steps=2)
    out["15_fast_dev_run_2"] = dict(global_step=t.global_step, current_epoch=t.current_epoch,
                                    val_batches=len(calls), validations=rec.validations,
                                    log_dir_exists=os.path.exists(os.path.join(root, "csv15")),
                                    ckpt_dir_exists=os.path.exists(os.path.join(root, "checkpoints")))
    seen = []
    class SeeBatches(Probe):
        def training_step(self, batch, idx):
            seen.append(("train", batch[0].flatten().tolist()))
            return super().training_step(batch, idx)
        def validation_step(self, batch, idx):
            seen.append(("val", batch[0].flatten().tolist()))
            return super().validation_step(batch, idx)
    x = torch.arange(20, dtype=torch.float32).unsqueeze(1)
    shuffled = DataLoader(TensorDataset(x, x.clone()), batch_size=2, shuffle=True)
    val = DataLoader(TensorDataset(x + 100, x.clone()), batch_size=2)
    t, rec = run("15b", root, SeeBatches(), shuffled, val, max_epochs=2, overfit_batches=2)
    out["15_overfit_batches_2"] = dict(global_step=t.global_step, current_epoch=t.current_epoch, seen=seen,
                                       validations=rec.validations)

json.dump(out, sys.stdout, indent=1)
print()
