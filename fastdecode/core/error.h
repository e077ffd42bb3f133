// Error type and the FD_CHECK macro family: library code throws fd::Error, only main() exits.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace fd {

// Every failure the library reports. The message is meant for a user: it names the file, the key or
// the tensor involved and what was expected.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A configuration error (bad key, type or range). Programs exit with code 2 on it, before any work.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// Bytes a peer sent (an error text, a name, an endpoint), made fit for a log line or an error message: at most
// `max` bytes kept, then " ... (N bytes in all)"; bytes outside printable ASCII written as \xNN. Whatever a peer
// sends is cut by this before it is logged or put in an error (docs/SECURITY.md, "Log volume").
std::string peer_text(const void* data, size_t n, size_t max = 256);
inline std::string peer_text(const std::string& s, size_t max = 256) { return peer_text(s.data(), s.size(), max); }

namespace detail {
[[noreturn]] void throw_check_failed(const char* expr, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace fd

// FD_CHECK(cond, stream-expr): throws fd::Error("file:line: check `cond` failed: <message>").
#define FD_CHECK(cond, msg)                                                          \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::ostringstream fd_check_os_;                                               \
      fd_check_os_ << msg;                                                           \
      ::fd::detail::throw_check_failed(#cond, __FILE__, __LINE__, fd_check_os_.str()); \
    }                                                                                \
  } while (0)

// FD_THROW(stream-expr): throws fd::Error with the message alone (for errors meant for users).
#define FD_THROW(msg) FD_THROW_AS(::fd::Error, msg)
// FD_THROW_BAD_INPUT(stream-expr): fd::ConfigError, bad input (programs exit 2 before any work).
#define FD_THROW_BAD_INPUT(msg) FD_THROW_AS(::fd::ConfigError, msg)
#define FD_THROW_AS(type, msg)           \
  do {                                   \
    std::ostringstream fd_throw_os_;     \
    fd_throw_os_ << msg;                 \
    throw type(fd_throw_os_.str());      \
  } while (0)
