// fd-keys: makes a CURVE key pair for the S-worker <-> R-worker link (docs/SECURITY.md): DIR/NAME.public and
// DIR/NAME.secret (mode 0600). The R-worker takes its own secret (--curve-secret) and a directory of the clients'
// .public files (--curve-clients); the S-worker takes the worker's .public and its own .secret
// (engine.rworkers.curve).
#include <cstdio>

#include "fastdecode/core/cli_main.h"
#include "fastdecode/wire/curve.h"

int main(int argc, char** argv) {
  CLI::App app{"fd-keys: make a ZeroMQ CURVE key pair (NAME.public, NAME.secret) for R-workers and S-workers", "fd-keys"};
  std::string name, dir = ".";
  app.add_option("name", name, "Key name, e.g. rworker or sworker")->required();
  app.add_option("--dir", dir, "Directory to write the two files into (created)")->capture_default_str();
  return fd::guarded_main(app, argc, argv, [&]() {
    if (!fd::curve_available()) throw fd::Error("this libzmq has no CURVE support (it needs libsodium)");
    const auto paths = fd::write_curve_keys(dir, name, fd::curve_generate());
    std::printf("%s\n%s\n", paths[0].c_str(), paths[1].c_str());
    return 0;
  });
}
