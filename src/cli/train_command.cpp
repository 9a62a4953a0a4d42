// `strata train`: parses the flags into a TrainConfig and runs the job.
#include "cli/commands.h"
#include "cli/train_job.h"

#include <memory>

namespace strata::cli {

Command make_train_command() {
  auto config = std::make_shared<TrainConfig>();
  Command command;
  command.register_fn = [config](CLI::App& app) {
    CLI::App* sub = app.add_subcommand(
        "train",
        "Train the example GPT on byte-level text on several workers.\n"
        "Default data: the texts under /usr/share/common-licenses.\n"
        "Example: strata train --devices 2 --strategy ddp --max-steps 300 --ckpt-dir ckpt\n"
        "         strata train --devices 2 --strategy fsdp --activation-checkpointing --ckpt-dir ckpt");
    TrainConfig& c = *config;
    sub->add_option("--strategy", c.strategy,
                    "Training strategy: ddp (replicated), fsdp (fully sharded), single_device")
        ->capture_default_str();
    sub->add_option("--wrap-policy", c.wrap_policy,
                    "fsdp: comma-separated module types that become sharded units (default: Block, each "
                    "transformer block; 'none': the whole model is one unit)");
    sub->add_flag("--activation-checkpointing", c.activation_checkpointing,
                  "fsdp: recompute every transformer block's forward during backward instead of keeping its "
                  "activations");
    sub->add_option("--state-dict-type", c.state_dict_type,
                    "Checkpoint layout: sharded (one file per rank; fsdp's default) or full (one file; ddp "
                    "writes only this)");
    sub->add_flag("--sequential-save", c.sequential_save,
                  "fsdp: workers on a host write their checkpoint shards one after another (less host memory)");
    sub->add_option("--accelerator", c.accelerator, "Device kind: cpu, cuda, auto")->capture_default_str();
    sub->add_option("--devices", c.devices, "Workers on this host")->capture_default_str();
    sub->add_option("--num-nodes", c.num_nodes, "Hosts (start each with strata launch)")->capture_default_str();
    sub->add_option("--precision", c.precision, "32-true or bf16-mixed")->capture_default_str();
    sub->add_flag("--debug", c.debug, "Check every collective across ranks and report communication per step");
    sub->add_option("--model-size", c.model_size, "GPT preset: tiny, small, medium, large")->capture_default_str();
    sub->add_option("--data", c.data, "Text file or folder to train on (default: /usr/share/common-licenses)");
    sub->add_option("--seq-len", c.seq_len, "Tokens per window (default: the model's block size)");
    sub->add_option("--max-steps", c.max_steps, "Optimizer steps to train for")->capture_default_str();
    sub->add_option("--batch-size", c.batch_size, "Global batch: windows per step over all workers")
        ->capture_default_str();
    sub->add_option("--grad-accum", c.grad_accum, "Micro-batches accumulated per step")->capture_default_str();
    sub->add_option("--lr", c.lr, "AdamW learning rate")->capture_default_str();
    sub->add_option("--weight-decay", c.weight_decay, "AdamW weight decay")->capture_default_str();
    sub->add_option("--grad-clip", c.grad_clip, "Clip the global gradient norm to this (0: off)")
        ->capture_default_str();
    sub->add_option("--seed", c.seed, "Seed for initialisation and data order")->capture_default_str();
    sub->add_option("--ckpt-dir", c.ckpt_dir, "Folder for checkpoints (one step-NNNNNNNN entry per save)");
    sub->add_option("--ckpt-every", c.ckpt_every, "Save every K steps (0: only at the end)")
        ->capture_default_str();
    sub->add_option("--resume", c.resume, "Checkpoint to resume from, or 'latest' (newest in --ckpt-dir)");
    sub->add_option("--metrics-file", c.metrics_file,
                    "Append one JSON line per step: step, loss, lr, epoch, tokens_per_s, elapsed_s");
    sub->add_option("--log-every", c.log_every, "Print a progress line every K steps when not on a terminal")
        ->capture_default_str();
    sub->add_option("--sample-tokens", c.sample_tokens, "Tokens of text to sample at the end (0: none)")
        ->capture_default_str();
    return sub;
  };
  command.run = [config] { return run_train(*config); };
  return command;
}

}  // namespace strata::cli
