// Bytes flipped in RocksDB's write-ahead log: RocksDB's point-in-time
// recovery keeps the writes before the damaged record and silently drops the
// rest, so partitions whose last snapshot came after it read back older or
// not at all. kdedup must say so: `snapshot inspect --verify` exits 1 naming
// them, and `kdedup run` refuses them as corrupt (warning naming the
// partition, kdedup_snapshot_refusals_total{reason="corrupt"}), rebuilds them
// from Kafka and still emits exactly the oracle's output.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "harness.h"

namespace kdedup::testing {
namespace {

using namespace std::chrono_literals;

constexpr std::int64_t kWindowMs = 3'600'000;

/// The manifest key of a partition ('m' | u16 topic length | topic | u32
/// partition, big-endian; lib/src/state/snapshot_store.h).
std::string manifest_key(const std::string& topic, std::int32_t partition) {
  std::string key(1, 'm');
  key.push_back(static_cast<char>(topic.size() >> 8));
  key.push_back(static_cast<char>(topic.size() & 0xff));
  key += topic;
  for (int shift = 24; shift >= 0; shift -= 8) {
    key.push_back(static_cast<char>((static_cast<std::uint32_t>(partition) >> shift) & 0xff));
  }
  return key;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// Flips a byte inside the last snapshot write of the partition whose last
/// write is the second-earliest of `partitions` in the (single) write-ahead
/// log; returns the partitions whose last snapshot is then lost (that one and
/// every partition written last after it), or nothing when the log does not
/// hold them all.
std::vector<std::int32_t> damage_wal(const std::string& state_dir, const std::string& topic,
                                     int partitions) {
  std::vector<std::filesystem::path> wals;
  for (const auto& e : std::filesystem::directory_iterator(state_dir)) {
    if (e.path().extension() == ".log") wals.push_back(e.path());
  }
  if (wals.size() != 1) {
    ADD_FAILURE() << wals.size() << " write-ahead logs in " << state_dir << ", expected 1";
    return {};
  }
  std::string bytes = read_file(wals[0]);
  std::vector<std::pair<std::size_t, std::int32_t>> last;  // position of the last write, partition
  for (std::int32_t p = 0; p < partitions; ++p) {
    const auto pos = bytes.rfind(manifest_key(topic, p));
    if (pos == std::string::npos) {
      ADD_FAILURE() << "no snapshot of " << topic << "/" << p << " in " << wals[0];
      return {};
    }
    last.emplace_back(pos, p);
  }
  std::sort(last.begin(), last.end());
  // Inside the key itself: the same WAL fragment, so the record's checksum
  // fails and RocksDB drops it and everything after it.
  bytes[last[1].first + 3] ^= 0x20;
  std::ofstream(wals[0], std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  std::vector<std::int32_t> lost;
  for (std::size_t i = 1; i < last.size(); ++i) lost.push_back(last[i].second);
  std::sort(lost.begin(), lost.end());
  return lost;
}

TEST(RecoveryE2E, SnapshotsLostToADamagedWriteAheadLogAreRefusedAsCorrupt) {
  const auto t0 = std::chrono::steady_clock::now();
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:4", "out:4", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TempDir dir;
  RunSettings settings;
  settings.group = "damaged-wal";
  settings.state_dir = dir.file("state");
  settings.snapshot_interval = "1s";
  {
    Instance first("phase1", dir, (*broker)->bootstrap(), settings);
    auto batch =
        run_batch(**broker, first,
                  {.partitions = 4, .domain = 800, .per_second = 2000, .seed = 21, .limit = 2000});
    ASSERT_TRUE(batch) << batch.error().message;
  }
  // A graceful stop leaves the snapshots in the write-ahead log (RocksDB
  // flushes its memtable only when it is full).
  const auto lost = damage_wal(settings.state_dir, "in", 4);
  ASSERT_EQ(lost.size(), 3u);

  auto inspected = inspect_snapshots(settings.state_dir, true);
  EXPECT_EQ(inspected.exit_code, 1) << inspected.text;
  std::vector<std::int32_t> corrupt;
  for (const auto& snap : inspected.snapshots) {
    if (snap.status == "corrupt") corrupt.push_back(snap.partition);
  }
  EXPECT_EQ(corrupt, lost) << inspected.text;
  EXPECT_NE(inspected.text.find("write-ahead log"), std::string::npos) << inspected.text;

  Instance second("phase2", dir, (*broker)->bootstrap(), settings);
  ASSERT_TRUE(second.start());
  ASSERT_TRUE(second.wait_ready(60s)) << second.log_tail();
  Feeder feeder((*broker)->bootstrap(),
                {.partitions = 4, .domain = 800, .per_second = 2000, .seed = 22, .limit = 1500});
  EXPECT_TRUE(feeder.wait_done(60s));
  EXPECT_TRUE(feeder.stop()) << feeder.error();
  EXPECT_TRUE(wait_committed_to_end(**broker, settings.group, "in", 60s)) << second.log_tail();
  EXPECT_EQ(second.metric("kdedup_snapshot_refusals_total").value_or(-1), 3)
      << "every lost snapshot is a counted refusal (and nothing else is refused)\n"
      << second.log_tail();
  EXPECT_EQ(second.metric("kdedup_rebuilds_total").value_or(-1), 3) << second.log_tail();
  EXPECT_EQ(second.metric("kdedup_restores_total").value_or(-1), 1) << second.log_tail();
  for (std::int32_t p : lost) {
    const std::string where = "in[" + std::to_string(p) + "]";
    auto line = line_with_all(second.log(), {"warn", where, "corrupt", "write-ahead log"});
    EXPECT_TRUE(line) << "no warning naming " << where << "\n" << second.log_tail();
    if (p == lost.front()) std::cout << "refusal: " << line.value_or("(none)") << std::endl;
  }
  EXPECT_EQ(second.stop(), 0) << second.log_tail();

  auto report = verify_topics(**broker, "in", "out", kWindowMs);
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_TRUE(report->ok()) << report->to_string();
  EXPECT_EQ(report->input_records, 3500u);
  // The rebuilt partitions were snapshotted again: nothing is refused now.
  auto after = inspect_snapshots(settings.state_dir, true);
  EXPECT_EQ(after.exit_code, 0) << after.text;
  std::cout << "SnapshotsLostToADamagedWriteAheadLogAreRefusedAsCorrupt took " << seconds_since(t0)
            << " s" << std::endl;
}

}  // namespace
}  // namespace kdedup::testing
