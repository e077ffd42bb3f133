#include "fastdecode/rworker/service.h"

#include <cmath>
#include <cstring>
#include <unordered_set>

#include "fastdecode/core/clock.h"
#include "fastdecode/core/dtype.h"
#include "fastdecode/core/fault.h"

namespace fd {

using proto::ErrorCode;
using proto::Header;
using proto::Message;
using proto::MsgType;
using proto::ProtocolError;
using proto::WireDType;

RWorkerService::RWorkerService(RWorkerConfig cfg) : cfg_(std::move(cfg)) {}

std::vector<zmq::message_t> RWorkerService::reply(const Header& req, MsgType type, std::vector<zmq::message_t> frames,
                                                  uint64_t compute_ns, int32_t status) const {
  const auto bytes = proto::encode_header(proto::reply_header(req, type, frames.size(), status, compute_ns));
  std::vector<zmq::message_t> out;
  out.emplace_back(bytes.data(), bytes.size());
  for (auto& f : frames) out.push_back(std::move(f));
  return out;
}

std::vector<zmq::message_t> RWorkerService::handle(const proto::Frame* parts, size_t n_parts) {
  ++requests_;
  Header req{};
  if (n_parts > 0 && parts[0].size == proto::kHeaderBytes) std::memcpy(&req, parts[0].data, proto::kHeaderBytes);
  try {
    const Message m = proto::decode(parts, n_parts, cfg_.limits);
    return dispatch(m);
  } catch (const ProtocolError& e) {
    return error_reply(req, e.code(), e.what());
  } catch (const std::exception& e) {
    // Anything else (allocation failure, a bug) is reported, never fatal for the other clients.
    return error_reply(req, ErrorCode::Internal, std::string("internal error: ") + e.what());
  }
}

std::vector<zmq::message_t> RWorkerService::error_reply(const Header& req, ErrorCode code, const std::string& msg) {
  ++errors_;
  std::vector<zmq::message_t> frames;
  frames.emplace_back(msg.data(), msg.size());
  return reply(req, MsgType::Error, std::move(frames), 0, int32_t(code));
}

std::vector<zmq::message_t> RWorkerService::dispatch(const Message& m) {
  switch (m.h.msg_type()) {
    case MsgType::Hello: return on_hello(m);
    case MsgType::AddSeq: return on_add(m);
    case MsgType::AppendKV: return on_append(m);
    case MsgType::Attend: return on_attend(m);
    case MsgType::FreeSeq: return on_free(m);
    case MsgType::Stats: {
      const std::string s = stats().dump();
      std::vector<zmq::message_t> f;
      f.emplace_back(s.data(), s.size());
      return reply(m.h, MsgType::StatsReply, std::move(f));
    }
    case MsgType::Shutdown:
      shutdown_ = true;
      return reply(m.h, MsgType::Ok);
    default:
      throw ProtocolError(ErrorCode::Malformed, std::string(proto::msg_type_name(m.h.msg_type())) + " is not a request");
  }
}

void RWorkerService::check_shape(const Header& h) const {
  if (!store_) throw ProtocolError(ErrorCode::NotConfigured, "no HELLO received yet");
  if (h.n_heads != shape_.n_heads || h.n_kv_heads != shape_.n_kv_heads || h.head_dim != shape_.head_dim ||
      h.dtype != shape_.dtype)
    throw ProtocolError(ErrorCode::ShapeMismatch, "heads/kv_heads/head_dim/dtype differ from the HELLO");
}

std::vector<uint64_t> RWorkerService::read_ids(const Message& m, bool must_exist) const {
  std::vector<uint64_t> ids(m.h.n_seq);
  std::unordered_set<uint64_t> seen;
  for (uint32_t i = 0; i < m.h.n_seq; ++i) {
    ids[i] = proto::read_u64(m.frames[0].data, i);
    if (!seen.insert(ids[i]).second)
      throw ProtocolError(ErrorCode::DuplicateSequence, "sequence " + std::to_string(ids[i]) + " appears twice");
    if (must_exist && !store_->has(ids[i]))
      throw ProtocolError(ErrorCode::UnknownSequence, "unknown sequence " + std::to_string(ids[i]));
  }
  return ids;
}

std::vector<zmq::message_t> RWorkerService::on_hello(const Message& m) {
  const Header& h = m.h;
  if (h.layer == 0 || h.n_heads == 0 || h.n_kv_heads == 0 || h.head_dim == 0 || h.head_dim % 32 != 0 ||
      h.n_heads % h.n_kv_heads != 0)
    throw ProtocolError(ErrorCode::Malformed,
                        "HELLO needs layers > 0, heads divisible by kv_heads, head_dim a multiple of 32");
  if (h.layer > kMaxHelloLayers)
    throw ProtocolError(ErrorCode::Malformed, "HELLO with " + std::to_string(h.layer) + " layers: at most " +
                                                  std::to_string(kMaxHelloLayers));
  const bool same = store_ && h.layer == shape_.layer && h.n_heads == shape_.n_heads &&
                    h.n_kv_heads == shape_.n_kv_heads && h.head_dim == shape_.head_dim && h.dtype == shape_.dtype;
  if (store_ && !same && store_->num_sequences() > 0)
    throw ProtocolError(ErrorCode::ShapeMismatch, "HELLO with another shape while sequences are live");
  if (!same) {
    store_ = std::make_unique<KVStore>(cfg_.kv_dtype, int(h.layer), h.n_kv_heads, h.head_dim, cfg_.memory_limit_bytes);
    shape_ = h;
  }
  json info = {{"name", cfg_.name},
               {"protocol_version", proto::kVersion},
               {"kv_dtype", kv_dtype_name(cfg_.kv_dtype)},
               {"isa", isa_name(cfg_.isa)},
               {"threads", cfg_.threads},
               {"memory_limit_bytes", cfg_.memory_limit_bytes},
               {"block_tokens", kKVBlockTokens},
               {"kv_bytes_per_token_per_layer",
                double(kv_block_bytes(cfg_.kv_dtype, h.n_kv_heads, h.head_dim)) / kKVBlockTokens},
               // a sequence's newest (partial) block is fp16 until full: at most this much per layer on top
               {"kv_tail_block_bytes", kv_fp16_block_bytes(h.n_kv_heads, h.head_dim)},
               // what one sequence's bookkeeping takes of memory_limit_bytes before any KV
               {"sequence_bytes", KVStore::sequence_bytes(int(h.layer))}};
  const std::string s = info.dump();
  std::vector<zmq::message_t> f;
  f.emplace_back(s.data(), s.size());
  return reply(h, MsgType::HelloReply, std::move(f));
}

std::vector<zmq::message_t> RWorkerService::on_add(const Message& m) {
  if (!store_) throw ProtocolError(ErrorCode::NotConfigured, "no HELLO received yet");
  const auto ids = read_ids(m, false);
  for (uint64_t id : ids)
    if (store_->has(id)) throw ProtocolError(ErrorCode::DuplicateSequence, "sequence " + std::to_string(id) + " exists");
  // Their bookkeeping counts against --memory-gb like their KV will: all or none of the request.
  const size_t need = ids.size() * store_->sequence_bytes();
  if (store_->bytes_total() + need > store_->memory_limit())
    throw ProtocolError(ErrorCode::OutOfMemory, std::to_string(ids.size()) + " sequences of " +
                                                    std::to_string(store_->n_layers()) + " layers need " + std::to_string(need) +
                                                    " bytes of bookkeeping; " +
                                                    std::to_string(store_->memory_limit() - store_->bytes_total()) + " free");
  for (uint64_t id : ids) store_->add(id);
  return reply(m.h, MsgType::Ok);
}

std::vector<zmq::message_t> RWorkerService::on_free(const Message& m) {
  if (!store_) throw ProtocolError(ErrorCode::NotConfigured, "no HELLO received yet");
  const auto ids = read_ids(m, true);
  for (uint64_t id : ids) store_->free(id);
  return reply(m.h, MsgType::Ok);
}

std::vector<zmq::message_t> RWorkerService::on_append(const Message& m) {
  const Header& h = m.h;
  check_shape(h);
  if (h.layer >= uint32_t(store_->n_layers())) throw ProtocolError(ErrorCode::BadLayer, "layer " + std::to_string(h.layer) + " out of range");
  const auto ids = read_ids(m, true);
  // All checks before any change: memory for every sequence's append.
  size_t extra = 0;
  for (uint32_t i = 0; i < h.n_seq; ++i) extra += store_->extra_bytes(ids[i], int(h.layer), proto::read_u32(m.frames[1].data, i));
  if (store_->bytes_total() + extra > store_->memory_limit())
    throw ProtocolError(ErrorCode::OutOfMemory, "appending needs " + std::to_string(extra) + " bytes, " +
                                                    std::to_string(store_->memory_limit() - store_->bytes_total()) + " free");
  const size_t row = size_t(h.n_kv_heads) * h.head_dim;
  const size_t es = proto::wire_dtype_size(WireDType(h.dtype));
  size_t tok = 0;
  for (uint32_t i = 0; i < h.n_seq; ++i) {
    const uint32_t n = proto::read_u32(m.frames[1].data, i);
    const uint8_t* k = m.frames[2].data + tok * row * es;
    const uint8_t* v = m.frames[3].data + tok * row * es;
    // Frames may be unaligned: copy into aligned scratch first.
    if (es == 2) {
      std::vector<uint16_t> kk(n * row), vv(n * row);
      std::memcpy(kk.data(), k, n * row * 2);
      std::memcpy(vv.data(), v, n * row * 2);
      store_->append_f16(ids[i], int(h.layer), kk.data(), vv.data(), n);
    } else {
      std::vector<float> kk(n * row), vv(n * row);
      std::memcpy(kk.data(), k, n * row * 4);
      std::memcpy(vv.data(), v, n * row * 4);
      store_->append_f32(ids[i], int(h.layer), kk.data(), vv.data(), n);
    }
    tok += n;
  }
  return reply(h, MsgType::Ok);
}

std::vector<zmq::message_t> RWorkerService::on_attend(const Message& m) {
  const Header& h = m.h;
  check_shape(h);
  if (h.layer >= uint32_t(store_->n_layers())) throw ProtocolError(ErrorCode::BadLayer, "layer " + std::to_string(h.layer) + " out of range");
  const int64_t t0 = now_ns();
  const auto ids = read_ids(m, true);
  size_t extra = 0;
  for (uint64_t id : ids) extra += store_->extra_bytes(id, int(h.layer), 1);
  if (store_->bytes_total() + extra > store_->memory_limit())
    throw ProtocolError(ErrorCode::OutOfMemory, "appending needs " + std::to_string(extra) + " bytes, " +
                                                    std::to_string(store_->memory_limit() - store_->bytes_total()) + " free");
  const size_t ns = h.n_seq, qrow = size_t(h.n_heads) * h.head_dim, kvrow = size_t(h.n_kv_heads) * h.head_dim;
  const WireDType wd = WireDType(h.dtype);
  // Append this step's k, v (one token per sequence), then attend over the whole cache.
  if (wd == WireDType::F16) {
    std::vector<uint16_t> kk(ns * kvrow), vv(ns * kvrow);
    std::memcpy(kk.data(), m.frames[2].data, kk.size() * 2);
    std::memcpy(vv.data(), m.frames[3].data, vv.size() * 2);
    for (size_t i = 0; i < ns; ++i) store_->append_f16(ids[i], int(h.layer), &kk[i * kvrow], &vv[i * kvrow], 1);
    q32_.resize(ns * qrow);
    std::vector<uint16_t> qq(ns * qrow);
    std::memcpy(qq.data(), m.frames[1].data, qq.size() * 2);
    convert_to_f32(DType::F16, qq.data(), q32_.data(), qq.size());
  } else {
    std::vector<float> kk(ns * kvrow), vv(ns * kvrow);
    std::memcpy(kk.data(), m.frames[2].data, kk.size() * 4);
    std::memcpy(vv.data(), m.frames[3].data, vv.size() * 4);
    for (size_t i = 0; i < ns; ++i) store_->append_f32(ids[i], int(h.layer), &kk[i * kvrow], &vv[i * kvrow], 1);
    q32_.resize(ns * qrow);
    std::memcpy(q32_.data(), m.frames[1].data, q32_.size() * 4);
  }
  views_.resize(ns);
  for (size_t i = 0; i < ns; ++i) views_[i] = store_->view(ids[i], int(h.layer));
  o32_.resize(ns * qrow);
  DecodeAttentionParams p;
  p.dtype = store_->dtype();
  p.n_seq = int(ns);
  p.n_heads = h.n_heads;
  p.n_kv_heads = h.n_kv_heads;
  p.head_dim = h.head_dim;
  p.scale = 1.0f / std::sqrt(float(h.head_dim));
  p.seqs = views_.data();
  p.q = q32_.data();
  p.o = o32_.data();
  if (ns > 0) decode_attention(p, cfg_.isa, cfg_.threads, ws_);
#ifdef FD_FAULT_ZERO_HEAD  // planted fault: query head 1's output is zeros
  if (h.n_heads > 1)
    for (size_t i = 0; i < ns; ++i) std::fill_n(o32_.data() + i * qrow + h.head_dim, h.head_dim, 0.0f);
#endif
  // o goes straight into the reply message's buffer.
  zmq::message_t o(ns * qrow * proto::wire_dtype_size(wd));
  if (wd == WireDType::F16) convert_from_f32(DType::F16, o32_.data(), o.data(), o32_.size());
  else std::memcpy(o.data(), o32_.data(), o32_.size() * 4);
  const uint64_t dt = uint64_t(now_ns() - t0);
  ++attends_;
  attend_seqs_ += ns;
  compute_ns_ += dt;
  std::vector<zmq::message_t> f;
  f.push_back(std::move(o));
  return reply(h, MsgType::AttendReply, std::move(f), dt);
}

json RWorkerService::stats() const {
  json s = {{"name", cfg_.name},
            {"requests", requests_},
            {"errors", errors_},
            {"attend_requests", attends_},
            {"attend_sequences", attend_seqs_},
            {"attend_compute_s", double(compute_ns_) / 1e9},
            {"kv_dtype", kv_dtype_name(cfg_.kv_dtype)},
            {"isa", isa_name(cfg_.isa)},
            {"threads", cfg_.threads},
            {"memory_limit_bytes", cfg_.memory_limit_bytes}};
  s["configured"] = store_ != nullptr;
  s["sequences"] = store_ ? store_->num_sequences() : 0;
  s["tokens"] = store_ ? store_->total_tokens() : 0;
  s["memory_used_bytes"] = store_ ? store_->bytes_total() : 0;  // KV blocks and the sequences' bookkeeping
  s["kv_bytes"] = store_ ? store_->bytes_used() : 0;
  return s;
}

}  // namespace fd
