#pragma once
// Internal: what both RocksDB databases of the state module (SnapshotStore,
// ConfirmStore) need to open a directory: its preparation, the wording of
// open errors, and the compression to use.

#include <rocksdb/options.h>
#include <rocksdb/status.h>

#include <string>

#include "kdedup/common/result.h"

namespace kdedup::state::dirs {

/// Creates `dir` when its parent exists (read-write) and checks it is a
/// usable directory; read-only: it must exist and hold a database. `what`
/// names the directory in messages ("state dir", "confirm store").
[[nodiscard]] Status prepare(const std::string& dir, bool read_only,
                             const std::string& what = "state dir");

/// Turns a failed DB::Open into a message naming the directory and the fix.
[[nodiscard]] std::string open_error(const rocksdb::Status& s, const std::string& dir,
                                     bool read_only, const std::string& what = "state dir");

/// RocksDB's preferred compression among those this build supports.
[[nodiscard]] rocksdb::CompressionType pick_compression();
[[nodiscard]] const char* compression_name(rocksdb::CompressionType c);

/// True when `text` contains `needle`.
[[nodiscard]] bool contains(const std::string& text, std::string_view needle);

}  // namespace kdedup::state::dirs
