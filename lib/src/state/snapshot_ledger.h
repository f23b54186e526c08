#pragma once
// Internal: the snapshot ledger, a small file beside the RocksDB database that
// records, per partition, the RocksDB sequence number of its last snapshot
// write. Only the store reads and writes it.
//
// Why it exists: RocksDB recovers its write-ahead log "point in time": at the
// first damaged record it stops and silently drops every later write (only
// its LOG says so). Stricter recovery modes cannot be used, because they also
// refuse the torn last record a crash leaves behind. What point-in-time
// recovery keeps is a prefix of the writes, so a partition whose last
// snapshot was written at a sequence number above the database's recovered
// last sequence lost that snapshot (it reads back older, or not at all). The
// ledger is written after each RocksDB write, so it never records a write the
// database does not hold unless the database lost it.
//
// File: DIR/kdedup-ledger, a checksummed envelope (kdedup/common/bytes.h),
// replaced atomically (temporary file, fsync, rename, fsync of the dir).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "kdedup/common/result.h"
#include "kdedup/state/snapshot.h"

namespace kdedup::state::ledger {

inline constexpr const char* kFileName = "kdedup-ledger";

/// Why a partition's last snapshot is known to be lost.
enum class Loss : std::uint8_t {
  kNone = 0,
  /// RocksDB recovered only up to `recovered`, before the partition's write.
  kWriteAheadLog = 1,
  /// The ledger itself was damaged: nothing stored can be vouched for.
  kLedgerDamaged = 2,
};

struct Entry {
  std::uint64_t sequence = 0;   ///< RocksDB sequence after the last snapshot write
  Loss loss = Loss::kNone;      ///< set once found lost; stays until written again
  std::uint64_t recovered = 0;  ///< the database's last sequence when the loss was found
};

/// Entries by (topic, partition), sorted.
using Entries = std::map<std::pair<std::string, std::int32_t>, Entry>;

[[nodiscard]] inline std::pair<std::string, std::int32_t> slot(const PartitionKey& key) {
  return {key.topic, key.partition};
}

[[nodiscard]] std::string encode(const Entries& entries);
[[nodiscard]] Result<Entries> decode(std::string_view bytes);

/// Reads DIR/kdedup-ledger: nullopt when there is none (a new state dir, or
/// one written by a kdedup without a ledger), an error when it is damaged.
[[nodiscard]] Result<std::optional<Entries>> read(const std::string& dir);

/// Replaces DIR/kdedup-ledger atomically; `sync` fsyncs the file and the dir.
[[nodiscard]] Status write(const std::string& dir, const Entries& entries, bool sync);

/// The complete sentence a refused read of `key` reports.
[[nodiscard]] std::string lost_message(const PartitionKey& key, const Entry& entry,
                                       const std::string& dir);

}  // namespace kdedup::state::ledger
