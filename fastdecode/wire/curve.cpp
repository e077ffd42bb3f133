#include "fastdecode/wire/curve.h"

#include <sys/stat.h>
#include <zmq.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fastdecode/core/error.h"

namespace fd {

namespace {

bool is_z85_key(const std::string& s) {
  static const std::string alphabet =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  return s.size() == 40 && std::all_of(s.begin(), s.end(), [](char c) { return alphabet.find(c) != std::string::npos; });
}

// The file's lines that are not blank or comments.
std::vector<std::string> key_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot read the CURVE key file");
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    line.erase(line.find_last_not_of(" \t\r") + 1);
    line.erase(0, line.find_first_not_of(" \t"));
    if (!line.empty() && line[0] != '#') out.push_back(line);
  }
  return out;
}

std::string field(const std::vector<std::string>& lines, const std::string& key, const std::string& path) {
  for (const auto& l : lines)
    if (l.rfind(key + " ", 0) == 0) {
      const std::string v = l.substr(key.size() + 1);
      if (!is_z85_key(v)) throw ConfigError(path + ": the " + key + " key is not 40 Z85 characters");
      return v;
    }
  throw ConfigError(path + ": no '" + key + " <Z85>' line (a file written by fd-keys)");
}

}  // namespace

bool curve_available() { return zmq_has("curve") != 0; }

CurveKeyPair curve_generate() {
  if (!curve_available()) FD_THROW("this libzmq has no CURVE support (it needs libsodium)");
  char pub[41] = {}, sec[41] = {};
  if (zmq_curve_keypair(pub, sec) != 0) FD_THROW("zmq_curve_keypair failed: " << zmq_strerror(zmq_errno()));
  return {pub, sec};
}

std::vector<std::string> write_curve_keys(const std::string& dir, const std::string& name, const CurveKeyPair& k) {
  namespace fs = std::filesystem;
  if (name.empty() || name.find('/') != std::string::npos) throw ConfigError("fd-keys: a key name without '/' is needed");
  fs::create_directories(dir);
  const std::string pub = (fs::path(dir) / (name + ".public")).string(), sec = (fs::path(dir) / (name + ".secret")).string();
  for (const auto& p : {pub, sec})
    if (fs::exists(p)) throw ConfigError(p + " exists: fd-keys does not overwrite keys");
  {
    std::ofstream o(pub);
    o << "# FastDecode CURVE public key '" << name << "' (fd-keys): give it to the other side\n" << k.public_z85 << "\n";
    if (!o) throw Error("cannot write " + pub);
  }
  // The secret: created 0600 before anything is written into it.
  const mode_t old = umask(077);
  std::ofstream o(sec);
  umask(old);
  o << "# FastDecode CURVE secret key '" << name << "' (fd-keys): keep it private\npublic " << k.public_z85 << "\nsecret "
    << k.secret_z85 << "\n";
  if (!o) throw Error("cannot write " + sec);
  ::chmod(sec.c_str(), 0600);
  return {pub, sec};
}

std::string read_curve_public(const std::string& path) {
  const auto lines = key_lines(path);
  for (const auto& l : lines)
    if (l.rfind("public ", 0) == 0) return field(lines, "public", path);
  if (lines.size() != 1 || !is_z85_key(lines[0]))
    throw ConfigError(path + ": not a CURVE public key file (one line of 40 Z85 characters, as fd-keys writes)");
  return lines[0];
}

CurveKeyPair read_curve_secret(const std::string& path) {
  const auto lines = key_lines(path);
  CurveKeyPair k{field(lines, "public", path), field(lines, "secret", path)};
  char derived[41] = {};
  if (zmq_curve_public(derived, k.secret_z85.c_str()) != 0 || k.public_z85 != derived)
    throw ConfigError(path + ": its public key does not belong to its secret key");
  return k;
}

std::vector<std::string> read_curve_public_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) throw ConfigError(dir + ": not a directory of client public keys (*.public)");
  std::vector<std::string> keys;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".public") keys.push_back(read_curve_public(e.path().string()));
  if (keys.empty()) throw ConfigError(dir + ": no *.public client keys (fd-keys NAME --dir " + dir + " makes one)");
  return keys;
}

}  // namespace fd
