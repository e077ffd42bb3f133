// Where and when a result was made: git commit, host, CPU, GPU, date, command.
#pragma once
#include <string>

#include "fastdecode/core/json_util.h"

namespace fd {

// {git_commit, git_dirty, host, cpu_model, cpu_cores, gpus: [..], cuda_built, date_utc, command}
json collect_provenance(const std::string& command_line);
std::string utc_timestamp(const char* fmt = "%Y-%m-%dT%H:%M:%SZ");

}  // namespace fd
