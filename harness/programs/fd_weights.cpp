// fd-weights: writes HF-compatible seeded random weights (config.json + model.safetensors) and
// inspects safetensors files.
#include <cstdio>
#include <filesystem>

#include "fastdecode/model/safetensors.h"
#include "fastdecode/model/weights.h"
#include "fastdecode/core/cli_main.h"

int main(int argc, char** argv) {
  CLI::App app{"fd-weights: seeded random HF-compatible weights (see docs/WEIGHTS.md)", "fd-weights"};
  app.require_subcommand(1);
  std::string model, out, dtype = "fp16", file;
  int64_t layers = 0;
  uint64_t seed = 0;
  bool quiet = false, force = false;
  CLI::App* rnd = app.add_subcommand("random", "Write config.json + model.safetensors with seeded random weights");
  rnd->add_option("--model", model, "Model config (HF config.json), e.g. experiments/models/llama-2-7b.json")->required();
  rnd->add_option("--layers", layers, "Keep only the first N layers (reduced-layer runs)")->check(CLI::PositiveNumber);
  rnd->add_option("--seed", seed, "Seed; the same seed gives the same bytes on every machine")->required();
  rnd->add_option("--dtype", dtype, "Storage dtype")->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  rnd->add_option("--out", out, "Output folder")->required();
  rnd->add_flag("--force", force, "Overwrite an existing model.safetensors in the folder");
  rnd->add_flag("--quiet", quiet, "No progress line");
  CLI::App* info = app.add_subcommand("info", "List the tensors of a safetensors file (validates the header)");
  info->add_option("file", file, "model.safetensors")->required();

  return fd::guarded_main(app, argc, argv, [&]() {
    if (*info) {
      const auto f = fd::SafetensorsFile::open(file);
      for (const auto& t : f.tensors()) {
        std::printf("%-60s %-5s [", t.name.c_str(), std::string(fd::dtype_safetensors_name(t.dtype)).c_str());
        for (size_t i = 0; i < t.shape.size(); ++i) std::printf("%s%lld", i ? ", " : "", (long long)t.shape[i]);
        std::printf("]\n");
      }
      return 0;
    }
    fd::ModelConfig cfg = fd::load_model_config(model);
    if (layers > 0) cfg = fd::with_layers(cfg, layers);
    const auto target = std::filesystem::path(out) / "model.safetensors";
    if (std::filesystem::exists(target) && !force)
      throw fd::ConfigError(target.string() + " exists; pass --force to overwrite");
    const bool tty = !quiet && isatty(fileno(stderr));
    fd::write_random_weights(cfg, seed, fd::dtype_from_name(dtype), out, [&](int64_t done, int64_t total) {
      if (tty) std::fprintf(stderr, "\r  %.1f / %.1f MB", double(done) / 1e6, double(total) / 1e6);
    });
    if (tty) std::fprintf(stderr, "\n");
    std::printf("wrote %s (%s, %lld layers, %.1f M parameters, seed %llu, %s)\n", out.c_str(), cfg.name.c_str(),
                (long long)cfg.num_layers, double(cfg.num_params()) / 1e6, (unsigned long long)seed, dtype.c_str());
    return 0;
  });
}
