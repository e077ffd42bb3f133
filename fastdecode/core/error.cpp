#include "fastdecode/core/error.h"

namespace fd {

std::string peer_text(const void* data, size_t n, size_t max) {
  const auto* p = static_cast<const unsigned char*>(data);
  const size_t keep = n < max ? n : max;
  std::string out;
  out.reserve(keep + 32);
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < keep; ++i) {
    const unsigned char c = p[i];
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(char(c));
    } else {
      out += "\\x";
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  if (keep < n) out += " ... (" + std::to_string(n) + " bytes in all)";
  return out;
}

}  // namespace fd

namespace fd::detail {

void throw_check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  std::ostringstream os;
  os << file << ":" << line << ": check `" << expr << "` failed";
  if (!msg.empty()) os << ": " << msg;
  throw Error(os.str());
}

}  // namespace fd::detail
