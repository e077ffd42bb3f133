// Reading and writing safetensors files: an 8-byte little-endian header length N, N bytes of JSON
// (tensor name -> {"dtype", "shape", "data_offsets": [begin, end]} with offsets relative to the first
// byte after the header, plus an optional "__metadata__": {string: string}), then the tensor bytes.
// Only F32, F16 and BF16 tensors are supported; any other dtype is reported as unsupported.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "fastdecode/core/dtype.h"

namespace fd {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  size_t offset = 0;  // bytes from the start of the data section
  size_t nbytes = 0;
  int64_t numel() const;  // product of the dims (1 for a scalar, shape [])
};

// Formats a shape as "[4096, 4096]" (used in error messages).
std::string shape_to_string(const std::vector<int64_t>& shape);

// A read-only, memory-mapped safetensors file. The whole header is validated by open(), so every
// TensorInfo it returns describes bytes that lie inside the mapping. A bad file (truncated, bad header,
// unsupported dtype, ...) is an fd::ConfigError naming the file and, where there is one, the tensor.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  // In the order of the JSON header (which is data order for files written by SafetensorsWriter and
  // by the Python safetensors library).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(std::string_view name) const;  // nullptr if absent
  const TensorInfo& get(std::string_view name) const;   // throws fd::Error if absent
  const void* data(const TensorInfo& t) const;          // t must come from this file
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  size_t file_size() const { return map_size_; }

  // Reads tensor `name`, checks that its shape equals `expected_shape` exactly and converts it to fp32.
  std::vector<float> read_f32(std::string_view name, const std::vector<int64_t>& expected_shape) const;

 private:
  SafetensorsFile() = default;
  void release() noexcept;

  std::string path_;
  const unsigned char* map_ = nullptr;  // whole file, PROT_READ / MAP_PRIVATE
  size_t map_size_ = 0;
  size_t data_start_ = 0;  // 8 + header length
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// Streaming writer. The full tensor list (names, dtypes, shapes) is given up front so the header can be
// written first; each tensor's bytes then follow in the same order, one write() call each, so a large
// file never has to be held in memory. Tensors are laid out contiguously in the given order; the JSON
// header is padded with spaces so the data starts on an 8-byte boundary (as the reference
// implementation does). Everything goes to path + ".tmp", which finish() renames to path, so an
// interrupted write never leaves a file that looks complete.
class SafetensorsWriter {
 public:
  // The offset and nbytes fields of `tensors` are ignored and filled in by the writer.
  SafetensorsWriter(std::string path, std::vector<TensorInfo> tensors,
                    std::map<std::string, std::string> metadata = {});
  SafetensorsWriter(SafetensorsWriter&& other) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&&) = delete;
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  ~SafetensorsWriter();  // if not finished: closes and removes the .tmp file

  // `name` must be the next tensor in order and `nbytes` its exact byte size.
  void write(std::string_view name, const void* bytes, size_t nbytes);
  // Checks that every tensor was written, flushes to disk and renames path.tmp -> path.
  void finish();

  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // with offsets filled in
  const std::string& path() const { return path_; }

 private:
  void write_all(const void* bytes, size_t n, std::string_view what);

  std::string path_;
  std::string tmp_path_;
  std::vector<TensorInfo> tensors_;
  size_t next_ = 0;
  int fd_ = -1;
  bool finished_ = false;
};

}  // namespace fd
