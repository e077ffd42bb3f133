// fd-generate: greedy generation with the fp32 reference model from a weights folder; writes the
// tokens and every step's logits so other implementations (NumPy, transformers) can be compared.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fastdecode/model/reference.h"
#include "fastdecode/core/sampling.h"
#include "fastdecode/core/cli_main.h"

namespace {

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || item.empty() || v < 0 || v > INT32_MAX)
      throw fd::ConfigError("--prompt: '" + item + "' is not a token id");
    ids.push_back(int32_t(v));
  }
  if (ids.empty()) throw fd::ConfigError("--prompt: no token ids");
  return ids;
}

// Minimal .npy (version 1.0) writer for a float32 C-order matrix.
void write_npy(const std::string& path, const std::vector<float>& data, int64_t rows, int64_t cols) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", " +
                       std::to_string(cols) + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  const uint16_t hlen = uint16_t(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  f.write(reinterpret_cast<const char*>(&hlen), 2);
  f.write(header.data(), std::streamsize(header.size()));
  f.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size() * sizeof(float)));
  if (!f) FD_THROW(path << ": write failed");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fd-generate: greedy decoding with the fp32 reference model, logits dumped for comparison",
               "fd-generate"};
  std::string weights, prompt, out;
  int64_t steps = 16, layers = 0;
  app.add_option("--weights", weights,
                 "Folder with config.json and model.safetensors, or model.safetensors.index.json and its shards")
      ->required();
  app.add_option("--prompt", prompt, "Comma-separated prompt token ids, e.g. 5,17,42")->required();
  app.add_option("--steps", steps, "Tokens to generate (1 prefill + steps-1 decodes)")->check(CLI::PositiveNumber);
  app.add_option("--layers", layers, "Run only the first N layers")->check(CLI::PositiveNumber);
  app.add_option("--out", out, "Output folder: result.json and logits.npy [steps, vocab]")->required();
  return fd::guarded_main(app, argc, argv, [&]() {
    const std::vector<int32_t> ids = parse_ids(prompt);
    namespace fs = std::filesystem;
    fd::ModelConfig cfg = fd::load_model_config((fs::path(weights) / "config.json").string());
    if (layers > 0) cfg = fd::with_layers(cfg, layers);
    for (int32_t t : ids)
      if (t >= cfg.vocab_size) throw fd::ConfigError("--prompt: token " + std::to_string(t) + " outside the vocabulary");
    if (int64_t(ids.size()) + steps - 1 > cfg.position_limit())
      throw fd::ConfigError("--steps: prompt + steps needs " + std::to_string(int64_t(ids.size()) + steps - 1) +
                            " positions; the model runs " + std::to_string(cfg.position_limit()) +
                            (cfg.position_limit_why.empty() ? std::string(" (max_position_embeddings)")
                                                            : " (" + cfg.position_limit_why + ")"));
    auto src = fd::open_safetensors_source(weights);
    fd::ReferenceModel model(fd::load_model_weights(cfg, *src));
    const int64_t seq = model.add_sequence(), V = cfg.vocab_size;
    std::vector<fd::RefToken> batch;
    for (size_t i = 0; i < ids.size(); ++i) batch.push_back({seq, ids[i], i + 1 == ids.size()});
    std::vector<float> all;
    std::vector<int32_t> gen;
    for (int64_t s = 0; s < steps; ++s) {
      std::vector<float> logits = model.forward(batch);
      gen.push_back(fd::argmax(logits.data(), V));
      all.insert(all.end(), logits.begin(), logits.end());
      batch = {{seq, gen.back(), true}};
    }
    fs::create_directories(out);
    write_npy((fs::path(out) / "logits.npy").string(), all, steps, V);
    fd::write_json_file((fs::path(out) / "result.json").string(),
                        {{"prompt", ids}, {"generated", gen}, {"model_type", cfg.hf.value("model_type", fd::arch_name(cfg.arch))},
                         {"layers", cfg.num_layers}, {"weights", weights}});
    std::printf("generated:");
    for (int32_t t : gen) std::printf(" %d", t);
    std::printf("\n");
    return 0;
  });
}
