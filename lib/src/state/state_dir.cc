// Opening the state module's RocksDB directories: preparation and the words
// of open errors (state_dir.h).

#include "state_dir.h"

#include <rocksdb/convenience.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <system_error>

namespace kdedup::state::dirs {
namespace fs = std::filesystem;

bool contains(const std::string& text, std::string_view needle) {
  return text.find(needle) != std::string::npos;
}

namespace {

/// Pid of the process holding the RocksDB lock of `dir`, or 0 if unknown.
/// RocksDB locks DIR/LOCK with fcntl(F_SETLK); F_GETLK reports the holder.
long lock_holder(const std::string& dir) {
  const int fd = ::open((dir + "/LOCK").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  struct flock probe {};
  probe.l_type = F_WRLCK;
  probe.l_whence = SEEK_SET;
  const int rc = ::fcntl(fd, F_GETLK, &probe);
  ::close(fd);
  return rc == 0 && probe.l_type != F_UNLCK ? static_cast<long>(probe.l_pid) : 0;
}

}  // namespace

std::string open_error(const rocksdb::Status& s, const std::string& dir, bool read_only,
                       const std::string& what) {
  const std::string text = s.ToString();
  if (s.IsIOError() && (contains(text, "lock") || contains(text, "LOCK"))) {
    const long pid = lock_holder(dir);
    return "another kdedup instance is using " + what + " " + dir +
           (pid > 0 ? " (process " + std::to_string(pid) + " holds " + dir + "/LOCK)"
                    : " (its LOCK is held, possibly by this process)") +
           "; stop it or give each instance its own state.dir";
  }
  if (s.IsNoSpace() || contains(text, "No space left")) {
    return "cannot open " + what + " " + dir + ": disk full; free space or enlarge the volume";
  }
  if (contains(text, "Permission denied") || contains(text, "Read-only file system")) {
    return what + " " + dir + " is not " + (read_only ? "readable" : "writable") +
           " by this user (" + text + "); fix its ownership/permissions or the volume mount";
  }
  if (s.IsCorruption()) {
    return what + " " + dir + " holds a corrupted RocksDB database (" + text +
           "); move the directory aside and restart: kdedup rebuilds filter state from Kafka";
  }
  if (read_only && s.IsInvalidArgument() && contains(text, "does not exist")) {
    return what + " " + dir + " holds no kdedup state (no RocksDB database in it)";
  }
  return "cannot open RocksDB database in " + what + " " + dir + ": " + text;
}

rocksdb::CompressionType pick_compression() {
  const auto supported = rocksdb::GetSupportedCompressions();
  for (auto c : {rocksdb::kZSTD, rocksdb::kLZ4Compression, rocksdb::kSnappyCompression}) {
    if (std::find(supported.begin(), supported.end(), c) != supported.end()) return c;
  }
  return rocksdb::kNoCompression;
}

const char* compression_name(rocksdb::CompressionType c) {
  switch (c) {
    case rocksdb::kZSTD:
      return "ZSTD";
    case rocksdb::kLZ4Compression:
      return "LZ4";
    case rocksdb::kSnappyCompression:
      return "Snappy";
    default:
      return "none";
  }
}

Status prepare(const std::string& dir, bool read_only, const std::string& what) {
  std::error_code ec;
  const fs::path path(dir);
  if (dir.empty()) return fail(what + " is empty; set state.dir");
  const auto st = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return fail("cannot access " + what + " " + dir + ": " + ec.message() +
                "; fix the permissions of the directory or its parents");
  }
  if (fs::exists(st)) {
    if (!fs::is_directory(st)) return fail(what + " " + dir + " exists but is not a directory");
  } else if (read_only) {
    return fail(what + " " + dir + " does not exist");
  } else {
    const fs::path parent = path.has_parent_path() ? path.parent_path() : fs::path(".");
    if (!fs::is_directory(parent, ec)) {
      return fail(what + " " + dir + " does not exist and neither does its parent " +
                  parent.string() + "; create it or point state.dir at a mounted volume");
    }
    if (!fs::create_directory(path, ec) && ec) {
      return fail("cannot create " + what + " " + dir + ": " + ec.message());
    }
  }
  const int mode = read_only ? (R_OK | X_OK) : (R_OK | W_OK | X_OK);
  if (::access(dir.c_str(), mode) != 0) {
    return fail(what + " " + dir + " is not " + (read_only ? "readable" : "writable") +
                " by this user (uid " + std::to_string(::geteuid()) + ": " +
                std::error_code(errno, std::generic_category()).message() +
                "); fix its ownership/permissions or the volume mount");
  }
  if (read_only && !fs::exists(path / "CURRENT", ec)) {
    return fail(what + " " + dir + " holds no kdedup state (no RocksDB database in it)");
  }
  return {};
}

}  // namespace kdedup::state::dirs
