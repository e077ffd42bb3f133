#include "fastdecode/rworker/service.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <mutex>
#include <unordered_set>

#include "fastdecode/core/clock.h"
#include "fastdecode/core/dtype.h"
#include "fd_fault_zero_head.h"  // planted fault (scripts/fault-check.sh; fastdecode/core/fault.h)
#include "fastdecode/rworker/intake.h"
#include "kernels/cpu/convert.h"

namespace fd {

using proto::ErrorCode;
using proto::Header;
using proto::Message;
using proto::MsgType;
using proto::ProtocolError;
using proto::WireDType;

namespace {
// An ATTEND's appends go to the worker's threads from this many sequences on (fewer: the team's wake-up costs more).
constexpr int kParallelAppendSeqs = 8;
// memcpy of n bytes; nothing for n = 0 (an empty vector's data() may be null, which memcpy may not be given).
void copy_bytes(void* dst, const void* src, size_t n) {
  if (n) std::memcpy(dst, src, n);
}
}  // namespace

RWorkerService::RWorkerService(RWorkerConfig cfg) : cfg_(std::move(cfg)) { memory_.limit = cfg_.memory_limit_bytes; }

size_t RWorkerService::quota() const {
  return cfg_.session_quota_bytes > 0 ? std::min(cfg_.session_quota_bytes, cfg_.memory_limit_bytes) : cfg_.memory_limit_bytes;
}

RWorkerService::Session& RWorkerService::session(const std::string& peer) {
  auto it = sessions_.find(peer);
  if (it == sessions_.end() || !it->second.store)
    throw ProtocolError(ErrorCode::NotConfigured, "no HELLO received from this client yet");
  return it->second;
}

void RWorkerService::end_session(const std::string& peer) {
  auto it = sessions_.find(peer);
  if (it == sessions_.end()) return;
  sessions_.erase(it);  // the store frees its blocks and gives its bytes back to memory_
  memory_.reserved -= kSessionBytes;
  ++sessions_ended_;
}

std::vector<zmq::message_t> RWorkerService::reply(const Header& req, MsgType type, std::vector<zmq::message_t> frames,
                                                  uint64_t compute_ns, int32_t status) const {
  const auto bytes = proto::encode_header(proto::reply_header(req, type, frames.size(), status, compute_ns));
  std::vector<zmq::message_t> out;
  out.emplace_back(bytes.data(), bytes.size());
  for (auto& f : frames) out.push_back(std::move(f));
  return out;
}

std::vector<zmq::message_t> RWorkerService::handle(const std::string& peer, const proto::Frame* parts, size_t n_parts) {
  ++requests_;
  Header req{};
  if (n_parts > 0 && parts[0].size == proto::kHeaderBytes) std::memcpy(&req, parts[0].data, proto::kHeaderBytes);
  try {
    const Message m = proto::decode(parts, n_parts, cfg_.limits);
    return dispatch(peer, m);
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

std::vector<zmq::message_t> RWorkerService::dispatch(const std::string& peer, const Message& m) {
  switch (m.h.msg_type()) {
    case MsgType::Hello: return on_hello(peer, m);
    case MsgType::AddSeq: return on_add(session(peer), m);
    case MsgType::AppendKV: return on_append(session(peer), m);
    case MsgType::Attend: return on_attend(session(peer), m);
    case MsgType::FreeSeq: return on_free(session(peer), m);
    case MsgType::Truncate: return on_truncate(session(peer), m);
    case MsgType::Close:
      end_session(peer);
      return reply(m.h, MsgType::Ok);
    case MsgType::Stats: {
      const std::string s = stats(peer).dump();
      std::vector<zmq::message_t> f;
      f.emplace_back(s.data(), s.size());
      return reply(m.h, MsgType::StatsReply, std::move(f));
    }
    case MsgType::Shutdown: return on_shutdown(m);
    default:
      throw ProtocolError(ErrorCode::Malformed, std::string(proto::msg_type_name(m.h.msg_type())) + " is not a request");
  }
}

std::vector<zmq::message_t> RWorkerService::on_shutdown(const Message& m) {
  // Constant-time compare: the time taken says nothing about how much of a guess was right.
  const std::string& t = cfg_.shutdown_token;
  uint8_t diff = t.size() == proto::kShutdownTokenBytes ? 0 : 1;
  for (size_t i = 0; i < proto::kShutdownTokenBytes; ++i)
    diff |= uint8_t(m.frames[0].data[i] ^ (i < t.size() ? uint8_t(t[i]) : 0));
  if (diff != 0)
    throw ProtocolError(ErrorCode::Forbidden, t.empty() ? "SHUTDOWN is not accepted over the wire by this worker (stop it with a signal)"
                                                        : "SHUTDOWN with a wrong token");
  shutdown_ = true;
  return reply(m.h, MsgType::Ok);
}

void RWorkerService::check_shape(const Session& s, const Header& h) const {
  const Header& shape = s.shape;
  if (h.n_heads != shape.n_heads || h.n_kv_heads != shape.n_kv_heads || h.head_dim != shape.head_dim || h.dtype != shape.dtype)
    throw ProtocolError(ErrorCode::ShapeMismatch, "heads/kv_heads/head_dim/dtype differ from the HELLO");
}

std::vector<uint64_t> RWorkerService::read_ids(const Session& s, const Message& m, bool must_exist) const {
  std::vector<uint64_t> ids(m.h.n_seq);
  std::unordered_set<uint64_t> seen;
  for (uint32_t i = 0; i < m.h.n_seq; ++i) {
    ids[i] = proto::read_u64(m.frames[0].data, i);
    if (!seen.insert(ids[i]).second)
      throw ProtocolError(ErrorCode::DuplicateSequence, "sequence " + std::to_string(ids[i]) + " appears twice");
    if (must_exist && !s.store->has(ids[i]))
      throw ProtocolError(ErrorCode::UnknownSequence, "unknown sequence " + std::to_string(ids[i]));
  }
  return ids;
}

std::vector<zmq::message_t> RWorkerService::on_hello(const std::string& peer, const Message& m) {
  const Header& h = m.h;
  if (h.layer == 0 || h.n_heads == 0 || h.n_kv_heads == 0 || h.head_dim == 0 || h.head_dim % 32 != 0 ||
      h.n_heads % h.n_kv_heads != 0)
    throw ProtocolError(ErrorCode::Malformed,
                        "HELLO needs layers > 0, heads divisible by kv_heads, head_dim a multiple of 32");
  if (h.layer > kMaxHelloLayers)
    throw ProtocolError(ErrorCode::Malformed, "HELLO with " + std::to_string(h.layer) + " layers: at most " +
                                                  std::to_string(kMaxHelloLayers));
  auto it = sessions_.find(peer);
  if (it == sessions_.end()) {  // a new session: its overhead counts against the memory limit, and their number
    if (sessions_.size() >= cfg_.max_sessions)
      throw ProtocolError(ErrorCode::Busy, "this worker holds its most sessions (" + std::to_string(cfg_.max_sessions) +
                                               "): a client must CLOSE or disconnect first");
    if (memory_.held() + kSessionBytes > memory_.limit)
      throw ProtocolError(ErrorCode::OutOfMemory, "no memory left for another session");
    memory_.reserved += kSessionBytes;
    it = sessions_.emplace(peer, Session{}).first;
    ++sessions_opened_;
  }
  Session& s = it->second;
  const Header& sh = s.shape;
  const bool same = s.store && h.layer == sh.layer && h.n_heads == sh.n_heads && h.n_kv_heads == sh.n_kv_heads &&
                    h.head_dim == sh.head_dim && h.dtype == sh.dtype;
  if (s.store && !same && s.store->num_sequences() > 0)
    throw ProtocolError(ErrorCode::ShapeMismatch, "HELLO with another shape while sequences are live");
  if (!same) {
    s.store.reset();  // its bytes go back first
    s.store = std::make_unique<KVStore>(cfg_.kv_dtype, int(h.layer), h.n_kv_heads, h.head_dim, quota(), &memory_);
    s.shape = h;
  }
  json info = {{"name", cfg_.name},
               {"protocol_version", proto::kVersion},
               {"kv_dtype", kv_dtype_name(cfg_.kv_dtype)},
               {"isa", isa_name(cfg_.isa)},
               {"query", query_quant_name(cfg_.query)},
               {"query_int8", query_is_q8(cfg_.query, cfg_.kv_dtype, cfg_.isa)},
               {"threads", cfg_.threads},
               {"memory_limit_bytes", cfg_.memory_limit_bytes},
               {"max_message_bytes", cfg_.limits.max_message_bytes},
               {"session_quota_bytes", quota()},
               {"memory_free_bytes", s.store->free_bytes()},
               {"block_tokens", kKVBlockTokens},
               {"kv_bytes_per_token_per_layer",
                double(kv_block_bytes(cfg_.kv_dtype, h.n_kv_heads, h.head_dim)) / kKVBlockTokens},
               // a sequence's newest (partial) block is fp16 until full: at most this much per layer on top
               {"kv_tail_block_bytes", kv_fp16_block_bytes(h.n_kv_heads, h.head_dim)},
               // what one sequence's bookkeeping takes of memory_limit_bytes before any KV
               {"sequence_bytes", KVStore::sequence_bytes(int(h.layer))}};
  const std::string text = info.dump();
  std::vector<zmq::message_t> f;
  f.emplace_back(text.data(), text.size());
  return reply(h, MsgType::HelloReply, std::move(f));
}

std::vector<zmq::message_t> RWorkerService::on_add(Session& s, const Message& m) {
  KVStore& store = *s.store;
  const auto ids = read_ids(s, m, false);
  for (uint64_t id : ids)
    if (store.has(id)) throw ProtocolError(ErrorCode::DuplicateSequence, "sequence " + std::to_string(id) + " exists");
  // Their bookkeeping counts against --memory-gb like their KV will: all or none of the request.
  const size_t need = ids.size() * store.sequence_bytes();
  if (!store.fits(need))
    throw ProtocolError(ErrorCode::OutOfMemory, std::to_string(ids.size()) + " sequences of " + std::to_string(store.n_layers()) +
                                                    " layers need " + std::to_string(need) + " bytes of bookkeeping; " +
                                                    std::to_string(store.free_bytes()) + " free");
  for (uint64_t id : ids) store.add(id);
  return reply(m.h, MsgType::Ok);
}

std::vector<zmq::message_t> RWorkerService::on_free(Session& s, const Message& m) {
  const auto ids = read_ids(s, m, true);
  for (uint64_t id : ids) s.store->free(id);
  return reply(m.h, MsgType::Ok);
}

std::vector<zmq::message_t> RWorkerService::on_truncate(Session& s, const Message& m) {
  const auto ids = read_ids(s, m, true);
  for (uint32_t i = 0; i < m.h.n_seq; ++i)  // all checks before any change
    if (!s.store->can_truncate(ids[i], proto::read_u32(m.frames[1].data, i)))
      throw ProtocolError(ErrorCode::Unsupported, "sequence " + std::to_string(ids[i]) + ": truncating to " +
                                                      std::to_string(proto::read_u32(m.frames[1].data, i)) +
                                                      " tokens would reopen a quantized block whose fp16 values are gone");
  for (uint32_t i = 0; i < m.h.n_seq; ++i) s.store->truncate(ids[i], proto::read_u32(m.frames[1].data, i));
  return reply(m.h, MsgType::Ok);
}

std::vector<zmq::message_t> RWorkerService::on_append(Session& s, const Message& m) {
  const Header& h = m.h;
  KVStore& store = *s.store;
  check_shape(s, h);
  if (h.layer >= uint32_t(store.n_layers())) throw ProtocolError(ErrorCode::BadLayer, "layer " + std::to_string(h.layer) + " out of range");
  const auto ids = read_ids(s, m, true);
  // All checks before any change: memory for every sequence's append.
  size_t extra = 0;
  for (uint32_t i = 0; i < h.n_seq; ++i) extra += store.extra_bytes(ids[i], int(h.layer), proto::read_u32(m.frames[1].data, i));
  if (!store.fits(extra))
    throw ProtocolError(ErrorCode::OutOfMemory, "appending needs " + std::to_string(extra) + " bytes, " +
                                                    std::to_string(store.free_bytes()) + " free");
  const size_t row = size_t(h.n_kv_heads) * h.head_dim;
  const size_t es = proto::wire_dtype_size(WireDType(h.dtype));
  // The sequences' first tokens in the frames, then their appends on the worker's threads at once (a prompt's
  // blocks are independent of the others'; the store's allocator takes a lock).
  std::vector<size_t> first(h.n_seq + 1, 0);
  for (uint32_t i = 0; i < h.n_seq; ++i) first[i + 1] = first[i] + proto::read_u32(m.frames[1].data, i);
  std::exception_ptr failed;
  std::mutex failed_mu;
#pragma omp parallel for num_threads(std::max(1, cfg_.threads)) schedule(dynamic, 1) if (h.n_seq > 1 && cfg_.threads > 1)
  for (int64_t si = 0; si < int64_t(h.n_seq); ++si) {
    try {
      append_one(store, ids[size_t(si)], int(h.layer), m, first[size_t(si)], first[size_t(si) + 1] - first[size_t(si)], row, es);
    } catch (...) {
      std::lock_guard<std::mutex> lock(failed_mu);
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
  return reply(h, MsgType::Ok);
}

// One sequence's n tokens of an APPEND_KV, from token `tok` of its frames.
void RWorkerService::append_one(KVStore& store, uint64_t id, int layer, const Message& m, size_t tok, size_t n, size_t row,
                                size_t es) {
  const uint8_t* k = m.frames[2].data + tok * row * es;
  const uint8_t* v = m.frames[3].data + tok * row * es;
  // fp16 is appended from the frames as they lie (copied bytewise); fp32 frames may be unaligned: copied into
  // aligned scratch first.
  if (es == 2) {
    store.append_f16(id, layer, k, v, int64_t(n));
    return;
  }
  std::vector<float> kk(n * row), vv(n * row);
  copy_bytes(kk.data(), k, n * row * 4);
  copy_bytes(vv.data(), v, n * row * 4);
  store.append_f32(id, layer, kk.data(), vv.data(), int64_t(n));
}

std::vector<zmq::message_t> RWorkerService::on_attend(Session& s, const Message& m) {
  const Header& h = m.h;
  KVStore& store = *s.store;
  check_shape(s, h);
  if (h.layer >= uint32_t(store.n_layers())) throw ProtocolError(ErrorCode::BadLayer, "layer " + std::to_string(h.layer) + " out of range");
  const int64_t t0 = now_ns();
  const auto ids = read_ids(s, m, true);
  size_t extra = 0;
  for (uint64_t id : ids) extra += store.extra_bytes(id, int(h.layer), 1);
  if (!store.fits(extra))
    throw ProtocolError(ErrorCode::OutOfMemory, "appending needs " + std::to_string(extra) + " bytes, " +
                                                    std::to_string(store.free_bytes()) + " free");
  // Where the request's time goes (STATS attend_parts_s): ids and the memory check, the append of this step's k / v,
  // the query's conversion, the views, the kernel, the output's conversion.
  int64_t t_prev = t0;
  const auto part = [&](AttendPart p) {
    const int64_t t = now_ns();
    parts_ns_[size_t(p)] += uint64_t(t - t_prev);
    t_prev = t;
  };
  part(AttendPart::Prepare);
  const size_t ns = h.n_seq, qrow = size_t(h.n_heads) * h.head_dim, kvrow = size_t(h.n_kv_heads) * h.head_dim;
  const WireDType wd = WireDType(h.dtype);
  // Append this step's k, v (one token per sequence), then attend over the whole cache.
  if (wd == WireDType::F16) {
    // The appends, then the query's conversion (F16C), each spread over the worker's threads when there is enough
    // to share (kernels/cpu/convert.h; issue 43: one thread's scalar conversions and appends cost up to a fifth of a
    // request's compute at short contexts).
    const int T = std::max(1, cfg_.threads);
    std::exception_ptr failed;
    std::mutex failed_mu;
#pragma omp parallel for num_threads(T) schedule(static) if (ns >= size_t(kParallelAppendSeqs) && T > 1)
    for (int64_t i = 0; i < int64_t(ns); ++i) {
      try {
        store.append_f16(ids[size_t(i)], int(h.layer), m.frames[2].data + size_t(i) * kvrow * 2,
                         m.frames[3].data + size_t(i) * kvrow * 2, 1);
      } catch (...) {
        std::lock_guard<std::mutex> lock(failed_mu);
        if (!failed) failed = std::current_exception();
      }
    }
    if (failed) std::rethrow_exception(failed);
    part(AttendPart::Append);
    q32_.resize(ns * qrow);
    convert_f16_to_f32(m.frames[1].data, q32_.data(), ns * qrow, cfg_.isa, T);
  } else {
    std::vector<float> kk(ns * kvrow), vv(ns * kvrow);
    copy_bytes(kk.data(), m.frames[2].data, kk.size() * 4);
    copy_bytes(vv.data(), m.frames[3].data, vv.size() * 4);
    for (size_t i = 0; i < ns; ++i) store.append_f32(ids[i], int(h.layer), &kk[i * kvrow], &vv[i * kvrow], 1);
    part(AttendPart::Append);
    q32_.resize(ns * qrow);
    copy_bytes(q32_.data(), m.frames[1].data, q32_.size() * 4);
  }
  part(AttendPart::Query);
  views_.resize(ns);
  for (size_t i = 0; i < ns; ++i) views_[i] = store.view(ids[i], int(h.layer));
  part(AttendPart::Prepare);
  o32_.resize(ns * qrow);
  DecodeAttentionParams p;
  p.dtype = store.dtype();
  p.n_seq = int(ns);
  p.n_heads = h.n_heads;
  p.n_kv_heads = h.n_kv_heads;
  p.head_dim = h.head_dim;
  p.scale = 1.0f / std::sqrt(float(h.head_dim));
  p.seqs = views_.data();
  p.q = q32_.data();
  p.o = o32_.data();
  p.query = cfg_.query;
  if (ns > 0) decode_attention(p, cfg_.isa, cfg_.threads, ws_);
  part(AttendPart::Kernel);
#ifdef FD_FAULT_ZERO_HEAD  // planted fault: query head 1's output is zeros
  if (h.n_heads > 1)
    for (size_t i = 0; i < ns; ++i) std::fill_n(o32_.data() + i * qrow + h.head_dim, h.head_dim, 0.0f);
#endif
  // o goes straight into the reply message's buffer.
  zmq::message_t o(ns * qrow * proto::wire_dtype_size(wd));
  if (wd == WireDType::F16) convert_f32_to_f16(o32_.data(), o.data(), o32_.size(), cfg_.isa, std::max(1, cfg_.threads));
  else copy_bytes(o.data(), o32_.data(), o32_.size() * 4);
  part(AttendPart::Output);
  const uint64_t dt = uint64_t(t_prev - t0);
  ++attends_;
  attend_seqs_ += ns;
  compute_ns_ += dt;
  std::vector<zmq::message_t> f;
  f.push_back(std::move(o));
  return reply(h, MsgType::AttendReply, std::move(f), dt);
}

json RWorkerService::stats(const std::string& peer) const {
  json s = {{"name", cfg_.name},
            {"requests", requests_},
            {"errors", errors_},
            {"attend_requests", attends_},
            {"attend_sequences", attend_seqs_},
            {"attend_compute_s", double(compute_ns_) / 1e9},
            {"attend_parts_s", {{"prepare", double(parts_ns_[size_t(AttendPart::Prepare)]) / 1e9},
                                {"append", double(parts_ns_[size_t(AttendPart::Append)]) / 1e9},
                                {"query", double(parts_ns_[size_t(AttendPart::Query)]) / 1e9},
                                {"kernel", double(parts_ns_[size_t(AttendPart::Kernel)]) / 1e9},
                                {"output", double(parts_ns_[size_t(AttendPart::Output)]) / 1e9}}},
            {"kv_dtype", kv_dtype_name(cfg_.kv_dtype)},
            {"isa", isa_name(cfg_.isa)},
            {"query", query_quant_name(cfg_.query)},
            {"query_int8", query_is_q8(cfg_.query, cfg_.kv_dtype, cfg_.isa)},
            {"threads", cfg_.threads},
            {"memory_limit_bytes", cfg_.memory_limit_bytes}};
  // Worker-wide: every session's sequences and memory (counts only: no id or value of another client's).
  size_t seqs = 0, kv = 0;
  int64_t tokens = 0;
  for (const auto& [p, ss] : sessions_)
    if (ss.store) seqs += ss.store->num_sequences(), tokens += ss.store->total_tokens(), kv += ss.store->bytes_used();
  s["sessions"] = sessions_.size();
  s["sessions_opened"] = sessions_opened_, s["sessions_ended"] = sessions_ended_;
  s["sequences"] = seqs;
  s["tokens"] = tokens;
  s["memory_used_bytes"] = memory_.used + memory_.reserved;  // KV blocks, the sequences' bookkeeping, the sessions
  s["memory_pooled_bytes"] = memory_.pooled;                 // freed blocks kept for reuse (within the limit too)
  s["kv_bytes"] = kv;
  if (router_)
    s["attend_loop_s"] = {{"requests", router_->attend_loop_requests},
                          {"wait", double(router_->attend_wait_ns) / 1e9},
                          {"receive", double(router_->attend_receive_ns) / 1e9},
                          {"handle", double(router_->attend_handle_ns) / 1e9},
                          {"send", double(router_->attend_send_ns) / 1e9}};
  if (router_)
    s["rings"] = {{"requests", router_->ring_requests}, {"replies", router_->ring_replies}, {"waiting_max", router_->ring_waiting_max}};
  if (router_)
    s["intake"] = {{"untracked_dropped", router_->untracked_dropped},
                   {"peer_faults", router_->peer_faults},
                   {"replies_lost", router_->replies_lost},
                   {"refused_too_large", router_->refused_too_large},
                   {"cut_intake", router_->cut_intake.load()},
                   {"cut_rss", router_->cut_rss.load()},
                   {"cut_connections", router_->cut_connections.load()},
                   {"max_held_bytes", router_->max_held_bytes.load()},
                   {"max_rss_bytes", router_->max_rss_bytes.load()},
                   {"budget_bytes", router_->budget_bytes},
                   {"rss_bound_bytes", router_->rss_bound_bytes},
                   {"base_rss_bytes", router_->base_rss_bytes}};
  auto it = sessions_.find(peer);
  s["configured"] = it != sessions_.end() && it->second.store != nullptr;
  if (s["configured"].get<bool>())
    s["session"] = {{"sequences", it->second.store->num_sequences()}, {"tokens", it->second.store->total_tokens()},
                    {"memory_used_bytes", it->second.store->bytes_total()}, {"quota_bytes", quota()}};
  return s;
}

}  // namespace fd
