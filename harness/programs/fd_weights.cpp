// fd-weights: writes HF-compatible seeded random weights (config.json + model.safetensors, or shards
// and model.safetensors.index.json as the Hub ships them) and inspects checkpoints.
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "fastdecode/model/checkpoint.h"
#include "fastdecode/model/weights.h"
#include "fastdecode/core/cli_main.h"

int main(int argc, char** argv) {
  CLI::App app{"fd-weights: seeded random HF-compatible weights (see docs/WEIGHTS.md)", "fd-weights"};
  app.require_subcommand(1);
  std::string model, out, dtype = "fp16", file, info_model;
  int64_t layers = 0;
  uint64_t seed = 0;
  double max_shard_gb = 0;
  bool quiet = false, force = false;
  CLI::App* rnd = app.add_subcommand(
      "random",
      "Write config.json + model.safetensors (or, with --max-shard-gb, HF shards + index) with seeded random weights");
  rnd->add_option("--model", model, "Model config (HF config.json), e.g. experiments/models/llama-2-7b.json")->required();
  rnd->add_option("--layers", layers, "Keep only the first N layers (reduced-layer runs)")->check(CLI::PositiveNumber);
  rnd->add_option("--seed", seed, "Seed; the same seed gives the same bytes on every machine")->required();
  rnd->add_option("--dtype", dtype, "Storage dtype")->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  rnd->add_option("--out", out, "Output folder")->required();
  rnd->add_option("--max-shard-gb", max_shard_gb,
                  "Shard as transformers' save_pretrained: model-00001-of-0000N.safetensors of at most X GB "
                  "(1 GB = 1e9 bytes; a bigger tensor gets a shard of its own) + model.safetensors.index.json; "
                  "one model.safetensors when everything fits")
      ->check(CLI::PositiveNumber);
  rnd->add_flag("--force", force,
                "Overwrite a checkpoint already in the folder: every model.safetensors, model-*-of-*.safetensors "
                "and model.safetensors.index.json there is removed first, so the folder holds one checkpoint");
  rnd->add_flag("--quiet", quiet, "No progress line");
  CLI::App* info = app.add_subcommand(
      "info", "List the tensors of a checkpoint with their shard (validates every header and the index)");
  info->add_option("path", file, "Checkpoint folder, model.safetensors.index.json or a .safetensors file")->required();
  info->add_option("--model", info_model, "Also check the tensor set against this model config (HF config.json)");
  info->add_option("--layers", layers, "With --model: the first N layers only")->check(CLI::PositiveNumber);

  return fd::guarded_main(app, argc, argv, [&]() {
    if (*info) {
      const auto ckpt = fd::Checkpoint::open(file);
      if (!info_model.empty()) {
        fd::ModelConfig cfg = fd::load_model_config(info_model);
        if (layers > 0) cfg = fd::with_layers(cfg, layers);
        auto src = fd::open_safetensors_source(file);
        fd::check_tensor_source(cfg, *src);
      }
      for (const auto& e : ckpt.entries()) {
        const fd::TensorInfo& t = ckpt.info(e);
        std::string shape;
        for (size_t i = 0; i < t.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(t.shape[i]);
        std::printf("%-60s %-5s %-22s %s\n", t.name.c_str(), std::string(fd::dtype_safetensors_name(t.dtype)).c_str(),
                    ("[" + shape + "]").c_str(),
                    std::filesystem::path(ckpt.shard_of(e).path()).filename().string().c_str());
      }
      std::printf("%zu tensors, %lld bytes in %zu file(s)%s%s\n", ckpt.entries().size(), (long long)ckpt.total_bytes(),
                  ckpt.shards().size(), ckpt.index_path().empty() ? "" : ", index ",
                  ckpt.index_path().c_str());
      if (!info_model.empty()) std::printf("matches %s\n", info_model.c_str());
      return 0;
    }
    fd::ModelConfig cfg = fd::load_model_config(model);
    if (layers > 0) cfg = fd::with_layers(cfg, layers);
    const double shard_bytes = std::round(max_shard_gb * 1e9);
    if (max_shard_gb > 0 && shard_bytes < 1)
      throw fd::ConfigError("--max-shard-gb " + std::to_string(max_shard_gb) + " is under one byte");
    const auto existing = fd::checkpoint_files_in(out);
    if (!existing.empty() && !force)
      throw fd::ConfigError((std::filesystem::path(out) / existing.front()).string() +
                            " exists; pass --force to replace the checkpoint in " + out);
    const bool tty = !quiet && isatty(fileno(stderr));
    fd::write_random_weights(cfg, seed, fd::dtype_from_name(dtype), out, [&](int64_t done, int64_t total) {
      if (tty) std::fprintf(stderr, "\r  %.1f / %.1f MB", double(done) / 1e6, double(total) / 1e6);
    }, int64_t(shard_bytes));
    if (tty) std::fprintf(stderr, "\n");
    const size_t files = fd::checkpoint_files_in(out).size();
    std::printf("wrote %s (%s, %lld layers, %.1f M parameters, seed %llu, %s; %s)\n", out.c_str(), cfg.name.c_str(),
                (long long)cfg.num_layers, double(cfg.num_params()) / 1e6, (unsigned long long)seed, dtype.c_str(),
                files > 1 ? (std::to_string(files - 1) + " shards + index").c_str() : "model.safetensors");
    return 0;
  });
}
