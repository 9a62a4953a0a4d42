// `strata train`: parses the flags into a TrainConfig and runs the job.
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/train_job.h"
#include "strata/runtime/process.h"

#include <memory>

namespace strata::cli {

Command make_train_command() {
  auto config = std::make_shared<TrainConfig>();
  auto numbers = std::make_shared<NumericFlags>("train");
  auto strategy_flag = std::make_shared<CLI::Option*>(nullptr);
  Command command;
  command.register_fn = [config, numbers, strategy_flag](CLI::App& app) {
    CLI::App* sub = app.add_subcommand(
        "train",
        "Train the example GPT on byte-level text, or on token ids (--data FILE.bin --vocab-size V), on several "
        "workers.\n"
        "Default data: the texts under /usr/share/common-licenses.\n"
        "Example: strata train --devices 2 --strategy ddp --max-steps 300 --ckpt-dir ckpt --logger csv\n"
        "         strata train --devices 2 --lr-schedule cosine --warmup-steps 30 --min-lr 2e-4\n"
        "         strata train --devices 2 --strategy fsdp --activation-checkpointing --ckpt-dir ckpt");
    TrainConfig& c = *config;
    *strategy_flag = sub->add_option("--strategy", c.strategy,
                    "Training strategy: ddp (replicated), fsdp (fully sharded), single_device; with --accelerator "
                    "xla: xla (replicated, the default on several devices), xla_fsdp (fully sharded), single_device "
                    "(the default on one)")
        ->capture_default_str();
    sub->add_option("--wrap-policy", c.wrap_policy,
                    "fsdp, xla_fsdp: comma-separated module types that become sharded units (default: Block, each "
                    "transformer block; 'none': the whole model is one unit)");
    sub->add_flag("--activation-checkpointing", c.activation_checkpointing,
                  "fsdp, xla_fsdp: recompute every transformer block's forward during backward instead of keeping its "
                  "activations");
    sub->add_option("--state-dict-type", c.state_dict_type,
                    "Checkpoint layout: sharded (one file per rank; the default of fsdp and xla_fsdp) or full (one "
                    "file; the replicated strategies write only this)");
    sub->add_flag("--sequential-save", c.sequential_save,
                  "fsdp, xla_fsdp: workers on a host write their checkpoint shards one after another (less host memory)");
    sub->add_option("--accelerator", c.accelerator,
                    "Device kind: cpu, cuda (one worker per GPU, worker i on cuda:i), auto, xla (one PJRT device; "
                    "ops without a lowering run on the CPU and are reported)")
        ->capture_default_str();
    sub->add_option("--pjrt-plugin", c.pjrt_plugin,
                    "--accelerator xla: the PJRT plugin (.so) to load; default: STRATA_PJRT_PLUGIN, else the CPU "
                    "plugin installed in the Python environment");
    NumericFlags& n = *numbers;
    n.add_integer(sub, "--devices", "Workers on this host (-1: one per visible GPU with --accelerator cuda; one worker on the CPU)", -1, 1024,
                  [&c](int64_t v) { c.devices = int(v); }, "2");
    n.add_integer(sub, "--num-nodes", "Hosts (start each with strata launch)", 1, 1024,
                  [&c](int64_t v) { c.num_nodes = int(v); }, "1");
    sub->add_option("--precision", c.precision, "32-true or bf16-mixed")->capture_default_str();
    sub->add_flag("--requeue", c.requeue,
                  "Under SLURM: on SIGUSR1 (sbatch --signal=USR1@90, its warning before the time limit or a "
                  "pre-emption) save the step, stop, and requeue the job with scontrol; the requeued job resumes "
                  "from that checkpoint (SLURM_RESTART_COUNT > 0 resumes as --resume latest does)");
    sub->add_flag("--debug", c.debug, "Check every collective across ranks and report communication per step");
    sub->add_option("--model-size", c.model_size, "GPT preset: tiny, small, medium, large")->capture_default_str();
    sub->add_option("--data", c.data,
                    "Text file or folder to train on, read as bytes (default: /usr/share/common-licenses); or a "
                    "file of token ids named *.bin (nanoGPT's train.bin: uint16 little-endian, memory-mapped), "
                    "with --vocab-size");
    n.add_integer(sub, "--vocab-size", "--data FILE.bin: the vocabulary of its ids (the model's; every id must "
                  "be below it)", 1, TrainConfig::kMaxVocabSize, [&c](int64_t v) { c.vocab_size = v; }, "");
    n.add_integer(sub, "--seq-len", "Tokens per window", 1, TrainConfig::kMaxSeqLen,
                  [&c](int64_t v) { c.seq_len = v; }, "the model's block size");
    n.add_integer(sub, "--max-steps", "Optimizer steps to train for", 1, 1000000000,
                  [&c](int64_t v) { c.max_steps = v; }, "300");
    n.add_integer(sub, "--batch-size", "Global batch: windows per step over all workers", 1, 1 << 20,
                  [&c](int64_t v) { c.batch_size = v; }, "32");
    n.add_integer(sub, "--grad-accum", "Micro-batches accumulated per step", 1, 1 << 20,
                  [&c](int64_t v) { c.grad_accum = v; }, "1");
    n.add_real(sub, "--lr", "AdamW learning rate", Range{false, 0, 10, true}, [&c](double v) { c.lr = v; }, "0.002");
    sub->add_option("--lr-schedule", c.lr_schedule,
                    "Learning-rate schedule: constant (--lr after the warm-up), cosine or linear (warm up, then "
                    "decay from --lr to --min-lr at --lr-decay-steps, as GPT training does); the rate each step "
                    "used is logged as lr-AdamW and saved with checkpoints")
        ->capture_default_str();
    n.add_integer(sub, "--warmup-steps", "Steps of linear warm-up from --lr / N to --lr (0: none)", 0, 1000000000,
                  [&c](int64_t v) { c.warmup_steps = v; }, "0");
    n.add_integer(sub, "--lr-decay-steps", "cosine, linear: the step the decay reaches --min-lr at (then held)", 1,
                  1000000000, [&c](int64_t v) { c.lr_decay_steps = v; }, "--max-steps");
    n.add_real(sub, "--min-lr", "cosine, linear: the rate the decay ends at", Range{false, 0, 10},
               [&c](double v) { c.min_lr = v; }, "--lr / 10");
    n.add_real(sub, "--weight-decay", "AdamW weight decay", Range{false, 0, 10}, [&c](double v) { c.weight_decay = v; },
               "0");
    n.add_real(sub, "--grad-clip", "Clip the global gradient norm to this (0: off)", Range{false, 0, 1e6},
               [&c](double v) { c.grad_clip = v; }, "1");
    sub->add_option("--optimizer", c.optimizer,
                    "adamw-fused (strata::optim::AdamW: ATen's fused kernel, one pass per parameter) or adamw "
                    "(torch::optim::AdamW's loop); the same update to rounding, and the same checkpoints")
        ->check(CLI::IsMember({"adamw-fused", "adamw"}))
        ->capture_default_str();
    sub->add_option("--attention", c.attention,
                    "explicit (matmul, causal mask, softmax) or sdpa (scaled_dot_product_attention: the flash "
                    "kernel; the same function to rounding)")
        ->check(CLI::IsMember({"explicit", "sdpa"}))
        ->capture_default_str();
    n.add_unsigned(sub, "--seed", "Seed for initialisation and data order", [&c](uint64_t v) { c.seed = v; }, "1337");
    sub->add_option("--ckpt-dir", c.ckpt_dir, "Folder for checkpoints (one step-NNNNNNNN entry per save)");
    n.add_integer(sub, "--ckpt-every", "Save every K steps (0: only at the end)", 0, 1000000000,
                  [&c](int64_t v) { c.ckpt_every = v; }, "0");
    sub->add_option("--resume", c.resume,
                    "Checkpoint to resume from, or 'last' (also 'latest': the newest complete one in --ckpt-dir)");
    sub->add_option("--metrics-file", c.metrics_file,
                    "Append one JSON line per step: step, loss, lr, epoch, tokens_per_s, samples_per_s, elapsed_s, mfu");
    n.add_integer(sub, "--log-every", "Print a progress line every K steps when not on a terminal", 1, 1000000000,
                  [&c](int64_t v) { c.log_every = v; }, "10");
    n.add_integer(sub, "--sample-tokens", "Tokens of text to sample at the end (0: none)", 0,
                  TrainConfig::kMaxSampleTokens, [&c](int64_t v) { c.sample_tokens = v; }, "200");
    n.add_integer(sub, "--max-epochs", "Passes over the training windows to stop after (0: only --max-steps)", 0,
                  1000000000, [&c](int64_t v) { c.max_epochs = v; }, "0");
    n.add_integer(sub, "--val-every", "Validate on the held-out windows every K steps (0: never)", 0, 1000000000,
                  [&c](int64_t v) { c.val_every = v; }, "50 when the data leaves a batch to hold out");
    n.add_real(sub, "--val-fraction", "Share of the windows held out for validation (the end of the text)",
               Range{false, 0, 0.5, true}, [&c](double v) { c.val_fraction = v; }, "0.1");
    n.add_integer(sub, "--val-batches", "Batches per validation", 1, 1000000, [&c](int64_t v) { c.val_batches = v; },
                  "10");
    n.add_integer(sub, "--early-stopping", "Stop when val_loss has not improved for K validations (0: off)", 0,
                  1000000, [&c](int64_t v) { c.early_stopping = v; }, "0");
    n.add_integer(sub, "--save-top-k", "Keep the K checkpoints of lowest val_loss in <ckpt-dir>/best (0: off)", 0,
                  1000000, [&c](int64_t v) { c.save_top_k = v; }, "0");
    sub->add_option("--logger", c.logger, "Experiment log: csv (Lightning's CSVLogger layout), jsonl, tensorboard (event files) or mlflow (a tracking server, --mlflow-uri); several as a comma-separated list. Logs train_loss, val_loss, lr-AdamW, tokens_per_s, samples_per_s, mfu and the configuration as hyperparameters");
    sub->add_option("--log-dir", c.log_dir, "Folder of --logger's runs (<log-dir>/train/version_N)")
        ->capture_default_str();
    sub->add_option("--mlflow-uri", c.mlflow_uri, "--logger mlflow: the tracking server, http(s)://HOST:PORT (default: MLFLOW_TRACKING_URI); the run is named train/version_N");
    sub->add_option("--mlflow-experiment", c.mlflow_experiment, "--logger mlflow: the experiment of the run (created when missing)")
        ->capture_default_str();
    return sub;
  };
  command.run = [config, numbers, strategy_flag] {
    // Note [The process's malloc] (src/runtime/heap.cpp): an xla step's
    // host side allocates a great deal, so the job prefers mimalloc there
    // (STRATA_MALLOC=system keeps glibc's). It may start the command again.
    if (config->accelerator == "xla") strata::runtime::apply_process_malloc("mimalloc");
    numbers->apply();
    // --strategy's default is ddp; on xla it is single_device on one device
    // and xla on several (ranks as threads: Note [The Trainer's ranks as
    // threads] in trainer/trainer.h).
    if (config->accelerator == "xla" && (*strategy_flag)->count() == 0)
      config->strategy = config->devices == 1 ? "single_device" : "xla";
    return run_train(*config);
  };
  return command;
}

}  // namespace strata::cli
