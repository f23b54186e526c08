// `kdedup snapshot`: look at (and remove) the filter snapshots in a state dir.
//
//   kdedup snapshot inspect --state-dir DIR [--json] [--verify]
//   kdedup snapshot delete  --state-dir DIR --topic T --partition P
//
// `inspect` opens the RocksDB database read-only (no lock, no writes), so it
// works next to a running instance and needs only read permission. It exits
// 1 when a snapshot cannot be read (or, with --verify, fails verification).
// In confirmed mode it also shows the confirm store (DIR/confirm): per
// partition its entries, bytes on disk and the snapshot they belong to
// (--verify counts the entries exactly instead of estimating them).
// `delete` needs the instance stopped (it takes the database lock); the
// partition is then rebuilt from Kafka on its next assignment.

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <string>

#include <fmt/format.h>

#include "command.h"
#include "kdedup/state/snapshot_store.h"

namespace kdedup::app {
namespace {

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string utc(std::int64_t ms) {
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  if (!gmtime_r(&secs, &tm)) return std::to_string(ms);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03}Z", buf, ms % 1000 < 0 ? 0 : ms % 1000);
}

std::string age(std::int64_t ms) {
  if (ms < 0) return "future";
  if (ms < 120'000) return fmt::format("{}s", ms / 1000);
  if (ms < 7'200'000) return fmt::format("{}m", ms / 60'000);
  if (ms < 172'800'000) return fmt::format("{}h", ms / 3'600'000);
  return fmt::format("{}d", ms / 86'400'000);
}

std::string bytes(std::uint64_t n) {
  if (n < 10 * 1024) return fmt::format("{}B", n);
  if (n < 10 * 1024 * 1024) return fmt::format("{:.1f}KiB", n / 1024.0);
  if (n < 10ULL * 1024 * 1024 * 1024) return fmt::format("{:.1f}MiB", n / 1048576.0);
  return fmt::format("{:.1f}GiB", n / 1073741824.0);
}

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

/// The confirm store part of the report (confirmed mode), or "" / nothing.
struct ConfirmReport {
  std::string json;   ///< ,"confirm_store":{...}
  std::string table;  ///< lines for the text report
  bool ok = true;
};

ConfirmReport confirm_report(const state::ConfirmStore& confirm, bool count) {
  ConfirmReport r;
  auto listed = confirm.list(count);
  if (!listed) {
    r.ok = false;
    r.table = "confirm store: " + listed.error().message + "\n";
    r.json = ",\"confirm_store\":{\"dir\":" + json_string(confirm.dir()) +
             ",\"error\":" + json_string(listed.error().message) + "}";
    return r;
  }
  const std::uint64_t total = confirm.approximate_bytes();
  r.json = fmt::format(",\"confirm_store\":{{\"dir\":{},\"bytes\":{},\"partitions\":[",
                       json_string(confirm.dir()), total);
  r.table = fmt::format("confirm store {} ({} on disk and in memtables): {} partition(s)\n",
                        confirm.dir(), bytes(total), listed->size());
  if (!listed->empty()) {
    r.table += fmt::format("{:<24} {:>5} {:>14} {:>9} {:>13} {:>10} {:>8}\n", "TOPIC", "PART",
                           "ENTRIES", "ON_DISK", "SNAPSHOT_AT", "WINDOW_MS", "TICKS");
  }
  for (std::size_t i = 0; i < listed->size(); ++i) {
    const auto& p = (*listed)[i];
    const std::uint64_t entries = p.entries.value_or(p.approximate_entries);
    r.json += fmt::format(
        "{}{{\"topic\":{},\"partition\":{},\"entries\":{},\"entries_exact\":{},"
        "\"live_entries\":{},\"bytes\":{},\"snapshot_offset\":{},\"window_ms\":{},"
        "\"ticks_per_window\":{},\"horizon\":{}}}",
        i ? "," : "", json_string(p.key.topic), p.key.partition, entries,
        p.entries ? "true" : "false",
        p.live_entries ? std::to_string(*p.live_entries) : std::string("null"), p.approximate_bytes,
        p.snapshot_offset ? std::to_string(*p.snapshot_offset) : std::string("null"), p.window_ms,
        p.ticks_per_window, p.horizon);
    r.table +=
        fmt::format("{:<24} {:>5} {:>14} {:>9} {:>13} {:>10} {:>8}\n", p.key.topic, p.key.partition,
                    (p.entries ? "" : "~") + std::to_string(entries) +
                        (p.live_entries ? " (" + std::to_string(*p.live_entries) + " live)" : ""),
                    bytes(p.approximate_bytes),
                    p.snapshot_offset ? std::to_string(*p.snapshot_offset) : std::string("none"),
                    p.window_ms, p.ticks_per_window);
  }
  r.json += "]}";
  return r;
}

/// One row of the report: the manifest, and what verification found.
struct Row {
  state::PartitionKey key;
  std::optional<state::SnapshotInfo> info;
  std::string status = "ok";  // ok | verified | <LoadFailure>
  std::string error;
};

int inspect(const std::string& dir, bool json, bool verify) {
  auto store = state::SnapshotStore::open_read_only(dir);
  if (!store) {
    std::fprintf(stderr, "kdedup snapshot inspect: %s\n", store.error().message.c_str());
    return kExitFailure;
  }
  auto listed = (*store)->list();
  if (!listed) {
    std::fprintf(stderr, "kdedup snapshot inspect: %s\n", listed.error().message.c_str());
    return kExitFailure;
  }
  std::vector<Row> rows;
  bool all_ok = true;
  for (auto& entry : *listed) {
    Row row{entry.key, std::nullopt};
    if (!entry.info) {
      row.status = state::to_string(entry.info.error().reason);
      row.error = entry.info.error().message;
    } else {
      row.info = *entry.info;
      if (verify) {
        auto read = (*store)->read(entry.key, std::nullopt);
        row.status = read ? "verified" : state::to_string(read.error().reason);
        if (!read) row.error = read.error().message;
      }
    }
    all_ok = all_ok && row.error.empty();
    rows.push_back(std::move(row));
  }

  const std::int64_t now = now_ms();
  ConfirmReport confirm;
  if (const auto* c = (*store)->confirm(); c != nullptr) {
    confirm = confirm_report(*c, verify);
    all_ok = all_ok && confirm.ok;
  }
  if (json) {
    std::string out = fmt::format("{{\"state_dir\":{},\"compression\":{},\"snapshots\":[",
                                  json_string(dir), json_string((*store)->compression()));
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      if (i) out += ",";
      out += fmt::format("{{\"topic\":{},\"partition\":{},\"status\":{}", json_string(r.key.topic),
                         r.key.partition, json_string(r.status));
      if (!r.error.empty()) out += ",\"error\":" + json_string(r.error);
      if (r.info) {
        const auto& s = *r.info;
        out += fmt::format(
            ",\"next_offset\":{},\"clock_ms\":{},\"created_ms\":{},\"age_ms\":{},"
            "\"filter\":{},\"format_version\":{},\"logical_bytes\":{},\"disk_bytes\":{},"
            "\"chunk_size\":{},\"chunks\":{},\"distinct_chunks\":{},"
            "\"config_fingerprint\":\"{:016x}\",\"tick_scale_fingerprint\":\"{:016x}\","
            "\"salt_check\":\"{:016x}\"",
            s.next_offset, s.clock_ms, s.created_ms, now - s.created_ms,
            json_string(filter::to_string(s.filter_type)), s.format_version, s.logical_bytes,
            s.disk_bytes, s.chunk_size, s.chunk_count, s.distinct_chunks, s.fingerprint.config,
            s.fingerprint.tick_scale, s.fingerprint.salt_check);
      }
      out += "}";
    }
    out += "]" + confirm.json + "}\n";
    std::fputs(out.c_str(), stdout);
  } else {
    std::printf("state dir %s (read-only view, compression %s): %zu snapshot(s)\n", dir.c_str(),
                (*store)->compression(), rows.size());
    if (!rows.empty()) {
      std::string table = fmt::format(
          "{:<24} {:>5} {:>12} {:<24} {:>6} {:<6} {:>9} {:>9} {:>11} {:<16} {:<16} {}\n", "TOPIC",
          "PART", "NEXT_OFFSET", "CLOCK (UTC)", "AGE", "FILTER", "STATE", "ON_DISK", "CHUNKS",
          "CONFIG", "SALT", "STATUS");
      for (const Row& r : rows) {
        if (r.info) {
          const auto& s = *r.info;
          table += fmt::format(
              "{:<24} {:>5} {:>12} {:<24} {:>6} {:<6} {:>9} {:>9} {:>11} {:016x} {:016x} {}\n",
              r.key.topic, r.key.partition, s.next_offset, utc(s.clock_ms), age(now - s.created_ms),
              filter::to_string(s.filter_type), bytes(s.logical_bytes), bytes(s.disk_bytes),
              fmt::format("{}/{}", s.distinct_chunks, s.chunk_count), s.fingerprint.config,
              s.fingerprint.salt_check, r.status);
        } else {
          table += fmt::format("{:<24} {:>5} {}\n", r.key.topic, r.key.partition, r.status);
        }
      }
      std::fputs(table.c_str(), stdout);
    }
    for (const Row& r : rows) {
      if (!r.error.empty()) std::printf("%s: %s\n", r.key.to_string().c_str(), r.error.c_str());
    }
    std::fputs(confirm.table.c_str(), stdout);
  }
  return all_ok ? kExitOk : kExitFailure;
}

int erase(const std::string& dir, const std::string& topic, std::int32_t partition) {
  auto store = state::SnapshotStore::open_read_only(dir);  // fail early with the clearer errors
  if (!store) {
    std::fprintf(stderr, "kdedup snapshot delete: %s\n", store.error().message.c_str());
    return kExitFailure;
  }
  store->reset();
  auto writable = state::SnapshotStore::open(dir);
  if (!writable) {
    std::fprintf(stderr, "kdedup snapshot delete: %s\n", writable.error().message.c_str());
    return kExitFailure;
  }
  const state::PartitionKey key{topic, partition};
  const auto before = (*writable)->read(key, std::nullopt);
  const bool existed = before || before.error().reason != state::LoadFailure::kMissing;
  if (auto ok = (*writable)->erase(key); !ok) {
    std::fprintf(stderr, "kdedup snapshot delete: %s\n", ok.error().message.c_str());
    return kExitFailure;
  }
  std::printf("%s snapshot of %s\n", existed ? "deleted" : "no", key.to_string().c_str());
  return kExitOk;
}

int snapshot_main(int argc, char** argv) {
  CLI::App app{"Inspect or delete the filter snapshots kdedup keeps in its state dir.",
               "kdedup snapshot"};
  app.require_subcommand(1);
  std::string dir;
  bool json = false, verify = false;
  auto* inspect_cmd = app.add_subcommand(
      "inspect",
      "List the snapshot of every partition: next offset, clock, age, sizes, chunks, config "
      "fingerprint; in confirmed mode also the confirm store's entries and bytes per "
      "partition. Read-only; safe while kdedup runs. Exit 1 if a snapshot is unreadable.");
  inspect_cmd->add_option("--state-dir", dir, "kdedup state directory (state.dir)")->required();
  inspect_cmd->add_flag("--json", json, "One JSON object on stdout instead of a table");
  inspect_cmd->add_flag("--verify", verify,
                        "Also read every chunk and check all checksums, and count the confirm "
                        "store's entries exactly (reads all state)");
  std::string topic;
  std::int32_t partition = -1;
  auto* delete_cmd = app.add_subcommand(
      "delete",
      "Delete one partition's snapshot so it is rebuilt from Kafka. kdedup must be stopped.");
  delete_cmd->add_option("--state-dir", dir, "kdedup state directory (state.dir)")->required();
  delete_cmd->add_option("--topic", topic, "Input topic")->required();
  delete_cmd->add_option("--partition", partition, "Input partition")
      ->required()
      ->check(CLI::NonNegativeNumber);
  if (auto code = kdedup::app::parse_command_line(app, argc, argv)) return *code;
  if (inspect_cmd->parsed()) return inspect(dir, json, verify);
  return erase(dir, topic, partition);
}

const CommandRegistration kSnapshotCommand{
    "snapshot", "inspect or delete filter snapshots in a state dir (read-only inspect)",
    snapshot_main};

}  // namespace
}  // namespace kdedup::app
