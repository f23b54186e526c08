#include "snapshot_ledger.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kdedup/common/bytes.h"

namespace kdedup::state::ledger {
namespace {

constexpr std::uint16_t kKind = 0x4C47;  // "LG"
constexpr std::uint16_t kVersion = 1;

std::string path_of(const std::string& dir) { return dir + "/" + kFileName; }

std::string errno_text() { return std::strerror(errno); }

/// Closes a file descriptor when the scope ends.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  /// Closes now and reports the error close() may carry (delayed write errors).
  bool close() {
    const int fd = fd_;
    fd_ = -1;
    return ::close(fd) == 0;
  }

 private:
  int fd_;
};

bool write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

}  // namespace

std::string encode(const Entries& entries) {
  std::string payload;
  ByteWriter w(payload);
  w.put<std::uint64_t>(entries.size());
  for (const auto& [slot, e] : entries) {
    w.put_string(slot.first);
    w.put<std::int32_t>(slot.second);
    w.put<std::uint64_t>(e.sequence);
    w.put<std::uint8_t>(static_cast<std::uint8_t>(e.loss));
    w.put<std::uint64_t>(e.recovered);
  }
  return seal_envelope(kKind, kVersion, payload);
}

Result<Entries> decode(std::string_view bytes) {
  auto env = open_envelope(bytes, "snapshot ledger");
  if (!env) return tl::unexpected(env.error());
  if (env->kind != kKind || env->version != kVersion) {
    return fail("snapshot ledger: unknown kind or version " + std::to_string(env->version));
  }
  ByteReader r(env->payload);
  auto count = r.get<std::uint64_t>("ledger.count");
  if (!count) return tl::unexpected(count.error());
  Entries out;
  for (std::uint64_t i = 0; i < *count; ++i) {
    auto topic = r.get_string("ledger.topic");
    auto partition = r.get<std::int32_t>("ledger.partition");
    auto sequence = r.get<std::uint64_t>("ledger.sequence");
    auto loss = r.get<std::uint8_t>("ledger.loss");
    auto recovered = r.get<std::uint64_t>("ledger.recovered");
    if (!topic) return tl::unexpected(topic.error());
    if (!partition) return tl::unexpected(partition.error());
    if (!sequence) return tl::unexpected(sequence.error());
    if (!loss) return tl::unexpected(loss.error());
    if (!recovered) return tl::unexpected(recovered.error());
    if (*loss > static_cast<std::uint8_t>(Loss::kLedgerDamaged)) {
      return fail("snapshot ledger: unknown loss code " + std::to_string(*loss));
    }
    out[{std::string(*topic), *partition}] = Entry{*sequence, static_cast<Loss>(*loss), *recovered};
  }
  if (auto end = r.expect_end("snapshot ledger"); !end) return tl::unexpected(end.error());
  return out;
}

Result<std::optional<Entries>> read(const std::string& dir) {
  const std::string path = path_of(dir);
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return std::optional<Entries>();
    return fail("cannot read " + path + ": " + errno_text());
  }
  std::string bytes;
  char buf[64 * 1024];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("cannot read " + path + ": " + errno_text());
    if (n == 0) break;
    bytes.append(buf, static_cast<std::size_t>(n));
  }
  auto entries = decode(bytes);
  if (!entries) return fail(path + " is damaged: " + entries.error().message);
  return std::optional<Entries>(std::move(*entries));
}

Status write(const std::string& dir, const Entries& entries, bool sync) {
  const std::string path = path_of(dir);
  const std::string tmp = path + ".tmp";
  const std::string bytes = encode(entries);
  {
    Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) return fail("cannot write " + tmp + ": " + errno_text());
    if (!write_all(fd.get(), bytes) || (sync && ::fsync(fd.get()) != 0) || !fd.close()) {
      return fail("cannot write " + tmp + ": " + errno_text());
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return fail("cannot replace " + path + ": " + errno_text());
  }
  if (sync) {
    Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (d.get() < 0 || ::fsync(d.get()) != 0) {
      return fail("cannot sync state dir " + dir + ": " + errno_text());
    }
  }
  return {};
}

std::string lost_message(const PartitionKey& key, const Entry& entry, const std::string& dir) {
  const std::string head = "snapshot of " + key.to_string() + " is corrupt: ";
  if (entry.loss == Loss::kLedgerDamaged) {
    return head + "the state dir's snapshot ledger (" + path_of(dir) +
           ") was found damaged, so a snapshot RocksDB lost could not be told from one it "
           "kept; it is not used and the partition is rebuilt from Kafka";
  }
  return head + "its last write (RocksDB sequence " + std::to_string(entry.sequence) +
         ") is not in the database, which RocksDB recovered only up to sequence " +
         std::to_string(entry.recovered) + ": the write-ahead log in " + dir +
         " is damaged (RocksDB's LOG there names the file); the older state it left is not "
         "used and the partition is rebuilt from Kafka";
}

}  // namespace kdedup::state::ledger
