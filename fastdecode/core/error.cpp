#include "fastdecode/core/error.h"

namespace fd::detail {

void throw_check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  std::ostringstream os;
  os << file << ":" << line << ": check `" << expr << "` failed";
  if (!msg.empty()) os << ": " << msg;
  throw Error(os.str());
}

}  // namespace fd::detail
