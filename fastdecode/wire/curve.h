// ZeroMQ CURVE keys for the S-worker <-> R-worker link (docs/SECURITY.md): key pairs made by libzmq (libsodium),
// kept in two small text files per party, made by fd-keys:
//   NAME.public   "# FastDecode CURVE public key" then the Z85 public key (40 characters)
//   NAME.secret   mode 0600: "public <Z85>" and "secret <Z85>" lines
// An R-worker started with --curve-secret FILE --curve-clients DIR encrypts every connection and admits only the
// clients whose public key is one of DIR/*.public; the S-worker's engine.rworkers.curve names the worker's public
// key and its own secret file.
#pragma once
#include <string>
#include <vector>

namespace fd {

struct CurveKeyPair {
  std::string public_z85, secret_z85;
};

bool curve_available();  // this libzmq was built with CURVE (libsodium)
CurveKeyPair curve_generate();
// Writes DIR/NAME.public and DIR/NAME.secret (0600); refuses to overwrite either. Returns the two paths.
std::vector<std::string> write_curve_keys(const std::string& dir, const std::string& name, const CurveKeyPair& k);
// A .public file's key, or a .secret file's public line. fd::ConfigError naming the file on anything else.
std::string read_curve_public(const std::string& path);
// A .secret file's pair (its public key checked against its secret). fd::ConfigError naming the file.
CurveKeyPair read_curve_secret(const std::string& path);
// Every DIR/*.public key (at least one, or fd::ConfigError).
std::vector<std::string> read_curve_public_dir(const std::string& dir);

}  // namespace fd
