#include "fastdecode/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <utility>

#include "fastdecode/core/error.h"

namespace fd {

namespace {

using ordered_json = nlohmann::ordered_json;  // keeps the header's key order (= file order)

// Headers are a few hundred KB even for huge models; anything bigger is a corrupt length field, and
// refusing it keeps a bad file from making us parse (or allocate for) gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// Reading: a bad or unreadable file is bad input, fd::ConfigError (programs exit 2 before any work).
#define FD_BAD_INPUT(msg) FD_THROW_BAD_INPUT(msg)
#define FD_FILE_ERROR(path, msg) FD_BAD_INPUT("safetensors file '" << (path) << "': " << msg)
#define FD_TENSOR_ERROR(path, name, msg) \
  FD_BAD_INPUT("safetensors file '" << (path) << "', tensor '" << (name) << "': " << msg)
// Writing (and mmap): a failure is a runtime error, fd::Error.
#define FD_IO_FILE_ERROR(path, msg) FD_THROW("safetensors file '" << (path) << "': " << msg)
#define FD_IO_TENSOR_ERROR(path, name, msg) \
  FD_THROW("safetensors file '" << (path) << "', tensor '" << (name) << "': " << msg)

// Called before anything else in an error path, so errno is still the failing call's.
std::string errno_text() { return std::strerror(errno); }

// numel and byte size with overflow checks: a header can claim any shape, and a wrapped product
// could otherwise match a small data range.
bool checked_numel(const std::vector<int64_t>& shape, int64_t* out) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return false;
  }
  *out = n;
  return true;
}

bool checked_nbytes(const std::vector<int64_t>& shape, DType dt, size_t* out) {
  int64_t n = 0;
  size_t bytes = 0;
  if (!checked_numel(shape, &n) || __builtin_mul_overflow(static_cast<size_t>(n), dtype_size(dt), &bytes))
    return false;
  *out = bytes;
  return true;
}

// Parses one tensor entry of the header; offsets are checked against `data_size` by the caller.
TensorInfo parse_entry(const std::string& path, const std::string& name, const ordered_json& e,
                       size_t data_size) {
  if (!e.is_object()) FD_TENSOR_ERROR(path, name, "expected a JSON object, found " << e.type_name());
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!e.contains(key)) FD_TENSOR_ERROR(path, name, "missing field \"" << key << "\"");
  TensorInfo t;
  t.name = name;

  const auto& dt = e["dtype"];
  if (!dt.is_string()) FD_TENSOR_ERROR(path, name, "\"dtype\" must be a string, found " << dt.type_name());
  const auto& dts = dt.get_ref<const std::string&>();
  if (!dtype_from_safetensors_name(dts, &t.dtype))
    FD_TENSOR_ERROR(path, name, "unsupported dtype \"" << dts << "\" (expected F32, F16 or BF16)");

  const auto& shape = e["shape"];
  if (!shape.is_array()) FD_TENSOR_ERROR(path, name, "\"shape\" must be an array, found " << shape.type_name());
  for (const auto& d : shape) {
    if (!d.is_number_integer())
      FD_TENSOR_ERROR(path, name, "shape dims must be non-negative integers, found " << d.dump());
    if (d.is_number_unsigned() ? d.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())
                               : d.get<int64_t>() < 0)
      FD_TENSOR_ERROR(path, name, "shape dims must be non-negative integers, found " << d.dump());
    t.shape.push_back(d.get<int64_t>());
  }

  const auto& off = e["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    FD_TENSOR_ERROR(path, name, "\"data_offsets\" must be [begin, end] with non-negative integers, found "
                                    << off.dump());
  const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
  if (end < begin) FD_TENSOR_ERROR(path, name, "data_offsets end " << end << " < begin " << begin);
  if (end > data_size)
    FD_TENSOR_ERROR(path, name, "data_offsets [" << begin << ", " << end << "] reach past the end of the data ("
                                                 << data_size << " bytes follow the header); truncated file?");
  t.offset = begin;
  t.nbytes = end - begin;

  size_t expect = 0;
  if (!checked_nbytes(t.shape, t.dtype, &expect))
    FD_TENSOR_ERROR(path, name, "shape " << shape_to_string(t.shape) << " is too large (size overflows)");
  if (expect != t.nbytes)
    FD_TENSOR_ERROR(path, name, "shape " << shape_to_string(t.shape) << " of " << dts << " needs " << expect
                                         << " bytes but data_offsets span " << t.nbytes);
  return t;
}

}  // namespace

int64_t TensorInfo::numel() const {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---------------------------------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const std::string err = errno_text();
    FD_FILE_ERROR(path, "cannot open: " << err);
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }  // also after mmap: the mapping keeps the file alive
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string err = errno_text();
    FD_FILE_ERROR(path, "cannot stat: " << err);
  }
  if (!S_ISREG(st.st_mode)) FD_FILE_ERROR(path, "not a regular file");
  const size_t size = static_cast<size_t>(st.st_size);
  // Checked before mmap: mapping 0 bytes is an error, and anything under 8 bytes has no header length.
  if (size < 8) FD_FILE_ERROR(path, "file is " << size << " bytes, too short for the 8-byte header length");
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (m == MAP_FAILED) {
    const std::string err = errno_text();
    FD_IO_FILE_ERROR(path, "mmap of " << size << " bytes failed: " << err);
  }
  f.map_ = static_cast<const unsigned char*>(m);
  f.map_size_ = size;  // from here on, f's destructor unmaps on any error

  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | f.map_[i];
  if (n > kMaxHeaderBytes)
    FD_FILE_ERROR(path, "header length " << n << " is absurdly large (limit " << kMaxHeaderBytes
                                         << " bytes); not a safetensors file?");
  if (n > size - 8)
    FD_FILE_ERROR(path, "header length " << n << " exceeds the file: only " << size - 8
                                         << " bytes follow the length field");
  f.data_start_ = 8 + n;
  const size_t data_size = size - f.data_start_;

  // nlohmann keeps the last of duplicate keys silently; the parse callback sees every top-level key.
  std::set<std::string> seen;
  std::string duplicate;
  auto cb = [&](int depth, nlohmann::detail::parse_event_t ev, ordered_json& j) {
    if (depth == 1 && ev == nlohmann::detail::parse_event_t::key && duplicate.empty() &&
        !seen.insert(j.get<std::string>()).second)
      duplicate = j.get<std::string>();
    return true;
  };
  ordered_json header;
  try {
    const char* h = reinterpret_cast<const char*>(f.map_ + 8);
    header = ordered_json::parse(h, h + n, cb);
  } catch (const nlohmann::json::exception& e) {
    FD_FILE_ERROR(path, "header is not valid JSON: " << e.what());
  }
  if (!header.is_object()) FD_FILE_ERROR(path, "header must be a JSON object, found " << header.type_name());
  if (!duplicate.empty()) FD_TENSOR_ERROR(path, duplicate, "name appears more than once in the header");

  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object())
        FD_FILE_ERROR(path, "\"__metadata__\" must be an object of strings, found " << value.type_name());
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          FD_FILE_ERROR(path, "\"__metadata__\" value for \"" << mk << "\" must be a string, found "
                                                              << mv.type_name());
        f.metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    f.index_.emplace(key, f.tensors_.size());
    f.tensors_.push_back(parse_entry(path, key, value, data_size));
  }

  // Overlap check: sorted by begin, each non-empty tensor must start at or after the previous end.
  std::vector<const TensorInfo*> order;
  for (const auto& t : f.tensors_)
    if (t.nbytes > 0) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const TensorInfo& a = *order[i - 1];
    const TensorInfo& b = *order[i];
    if (b.offset < a.offset + a.nbytes)
      FD_TENSOR_ERROR(path, b.name, "data [" << b.offset << ", " << b.offset + b.nbytes << ") overlaps tensor '"
                                             << a.name << "' at [" << a.offset << ", " << a.offset + a.nbytes
                                             << ")");
  }
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept { *this = std::move(o); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_size_ = std::exchange(o.map_size_, 0);
    data_start_ = o.data_start_;
    tensors_ = std::move(o.tensors_);
    index_ = std::move(o.index_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { release(); }

void SafetensorsFile::release() noexcept {
  if (map_) ::munmap(const_cast<unsigned char*>(map_), map_size_);
  map_ = nullptr;
  map_size_ = 0;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& SafetensorsFile::get(std::string_view name) const {
  if (const TensorInfo* t = find(name)) return *t;
  FD_TENSOR_ERROR(path_, name, "not found (the file has " << tensors_.size() << " tensors)");
}

const void* SafetensorsFile::data(const TensorInfo& t) const {
  FD_CHECK(map_ && data_start_ + t.offset + t.nbytes <= map_size_,
           "tensor '" << t.name << "' is not inside safetensors file '" << path_ << "'");
  return map_ + data_start_ + t.offset;
}

std::vector<float> SafetensorsFile::read_f32(std::string_view name, const std::vector<int64_t>& expected_shape) const {
  const TensorInfo& t = get(name);
  if (t.shape != expected_shape)
    FD_TENSOR_ERROR(path_, name, "expected shape " << shape_to_string(expected_shape) << ", found "
                                                   << shape_to_string(t.shape));
  // numel is bounded by the file size: open() checked numel * dtype_size == nbytes.
  std::vector<float> out(static_cast<size_t>(t.numel()));
  // Converted and scanned chunk by chunk (the chunk is still in cache for the scan): a NaN or Inf weight
  // is refused at load, naming the tensor, instead of running to garbage tokens (issue 16). The scan is
  // a branch-free OR over the exponent bits, which the compiler vectorises.
  constexpr size_t kChunk = 16384;
  const char* src = static_cast<const char*>(out.empty() ? nullptr : data(t));
  for (size_t c0 = 0; c0 < out.size(); c0 += kChunk) {
    const size_t m = std::min(kChunk, out.size() - c0);
    convert_to_f32(t.dtype, src + c0 * dtype_size(t.dtype), out.data() + c0, m);
    uint32_t bad = 0;
    for (size_t j = 0; j < m; ++j) {
      uint32_t bits;
      std::memcpy(&bits, &out[c0 + j], 4);
      bad |= uint32_t((bits & 0x7f800000u) == 0x7f800000u);  // exponent all ones: Inf or NaN
    }
    if (bad) {
      if (c0 + m < out.size())  // the rest too, so the count is the tensor's
        convert_to_f32(t.dtype, src + (c0 + m) * dtype_size(t.dtype), out.data() + c0 + m, out.size() - c0 - m);
      size_t first = c0, count = 0;
      while (std::isfinite(out[first])) ++first;
      for (size_t j = first; j < out.size(); ++j) count += !std::isfinite(out[j]);
      FD_TENSOR_ERROR(path_, name, count << " non-finite value(s) (" << (std::isnan(out[first]) ? "NaN" : "Inf")
                                         << " first at element " << first << " of " << out.size()
                                         << "): a checkpoint with NaN or Inf weights gives garbage tokens");
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// SafetensorsWriter

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<TensorInfo> tensors,
                                     std::map<std::string, std::string> metadata)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp"), tensors_(std::move(tensors)) {
  ordered_json header = ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;  // first, as Python's safetensors does
  std::set<std::string_view> names;
  size_t offset = 0;
  for (auto& t : tensors_) {
    if (t.name == "__metadata__") FD_IO_TENSOR_ERROR(path_, t.name, "reserved name cannot be a tensor");
    if (!names.insert(t.name).second) FD_IO_TENSOR_ERROR(path_, t.name, "name given more than once");
    if (!checked_nbytes(t.shape, t.dtype, &t.nbytes))
      FD_IO_TENSOR_ERROR(path_, t.name, "invalid shape " << shape_to_string(t.shape) << " (negative dim or size overflow)");
    t.offset = offset;
    offset += t.nbytes;
    header[t.name] = {{"dtype", dtype_safetensors_name(t.dtype)}, {"shape", t.shape},
                      {"data_offsets", {t.offset, t.offset + t.nbytes}}};
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data then starts at 8 + text.size(), a multiple of 8

  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const std::string err = errno_text();
    FD_IO_FILE_ERROR(tmp_path_, "cannot create: " << err);
  }
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));
  try {
    write_all(len, 8, "header length");
    write_all(text.data(), text.size(), "header");
  } catch (...) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
    throw;
  }
}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&& o) noexcept
    : path_(std::move(o.path_)),
      tmp_path_(std::move(o.tmp_path_)),
      tensors_(std::move(o.tensors_)),
      next_(o.next_),
      fd_(std::exchange(o.fd_, -1)),
      finished_(std::exchange(o.finished_, true)) {}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_) ::unlink(tmp_path_.c_str());
}

void SafetensorsWriter::write_all(const void* bytes, size_t n, std::string_view what) {
  const auto* p = static_cast<const char*>(bytes);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const std::string err = w < 0 ? errno_text() : "wrote 0 bytes";
      FD_IO_FILE_ERROR(tmp_path_, "writing " << what << " failed: " << err);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void SafetensorsWriter::write(std::string_view name, const void* bytes, size_t nbytes) {
  if (finished_ || fd_ < 0) FD_IO_TENSOR_ERROR(path_, name, "write after finish()");
  if (next_ >= tensors_.size())
    FD_IO_TENSOR_ERROR(path_, name, "unexpected write: all " << tensors_.size() << " tensors were already written");
  const TensorInfo& t = tensors_[next_];
  if (name != t.name)
    FD_IO_TENSOR_ERROR(path_, name, "written out of order: expected tensor '" << t.name << "' next (#" << next_ << ")");
  if (nbytes != t.nbytes)
    FD_IO_TENSOR_ERROR(path_, name, "expected " << t.nbytes << " bytes for shape " << shape_to_string(t.shape)
                                             << " of " << dtype_safetensors_name(t.dtype) << ", got " << nbytes);
  write_all(bytes, nbytes, "tensor '" + t.name + "'");
  ++next_;
}

void SafetensorsWriter::finish() {
  if (finished_) FD_IO_FILE_ERROR(path_, "finish() called twice");
  if (next_ != tensors_.size())
    FD_IO_TENSOR_ERROR(path_, tensors_[next_].name, "finish() before all tensors were written: " << next_ << " of "
                                                   << tensors_.size() << " done, this one is next");
  // fsync before rename so that after a crash the final name never points at partial data.
  std::string err;
  if (::fsync(fd_) != 0) err = "fsync failed: " + errno_text();
  if (::close(std::exchange(fd_, -1)) != 0 && err.empty()) err = "close failed: " + errno_text();
  if (!err.empty()) FD_IO_FILE_ERROR(tmp_path_, err);
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    err = errno_text();
    FD_IO_FILE_ERROR(path_, "cannot rename '" << tmp_path_ << "' to it: " << err);
  }
  finished_ = true;
}

}  // namespace fd
