// `kdedup snapshot inspect|delete` against a real state dir: table and JSON
// output, read-only access next to a running owner, corruption reporting and
// exit codes.

#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <simdjson.h>

#include <filesystem>
#include <fstream>

#include "kdedup/state/snapshot_store.h"
#include "process.h"
#include "snapshot_format.h"  // to corrupt one chunk on purpose

namespace kdedup::state {
namespace {

constexpr filter::TickScale kScale(60'000, 1000);

using kdedup::testing::run_kdedup;
using kdedup::testing::TempDir;

std::unique_ptr<filter::SlidingFilter> exact_filter(std::uint64_t n) {
  filter::FilterConfig c;
  c.type = filter::FilterType::kExact;
  c.ticks_per_window = 1000;
  auto f = filter::make_filter(c);
  EXPECT_TRUE(f);
  for (std::uint64_t i = 0; i < n; ++i) (*f)->test_and_insert({i, i * 3}, i / 100);
  return std::move(*f);
}

class SnapshotCli : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreOptions o;
    o.chunk_size = 4096;
    auto s = SnapshotStore::open(dir_, o);
    ASSERT_TRUE(s) << s.error().message;
    store_ = std::move(*s);
    auto small = exact_filter(100);
    auto large = exact_filter(5000);  // ~120 KB state: 30 chunks
    ASSERT_TRUE(
        store_->write(capture_snapshot({"orders", 0}, *small, kScale, 100, 1'700'000'000'000, 7)));
    ASSERT_TRUE(
        store_->write(capture_snapshot({"orders", 1}, *large, kScale, 5000, 1'700'000'050'000, 7)));
    ASSERT_TRUE(
        store_->write(capture_snapshot({"clicks", 3}, *small, kScale, 42, 1'700'000'000'500, 7)));
  }
  TempDir tmp_;
  const std::string dir_ = tmp_.file("state");
  std::unique_ptr<SnapshotStore> store_;
};

TEST_F(SnapshotCli, InspectPrintsATableWhileTheOwnerHoldsTheLock) {
  auto r = run_kdedup({"snapshot", "inspect", "--state-dir", dir_});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("3 snapshot(s)"), std::string::npos) << r.out;
  // Sorted by topic then partition; next offsets and clocks as stored.
  const auto clicks = r.out.find("clicks");
  const auto orders0 = r.out.find("orders                       0");
  const auto orders1 = r.out.find("orders                       1");
  ASSERT_NE(clicks, std::string::npos) << r.out;
  ASSERT_NE(orders0, std::string::npos) << r.out;
  ASSERT_NE(orders1, std::string::npos) << r.out;
  EXPECT_LT(clicks, orders0);
  EXPECT_LT(orders0, orders1);
  EXPECT_NE(r.out.find("2023-11-14T22:14:10.000Z"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" 5000 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("exact"), std::string::npos) << r.out;
}

TEST_F(SnapshotCli, InspectJsonCarriesEveryField) {
  auto r = run_kdedup({"snapshot", "inspect", "--state-dir", dir_, "--json", "--verify"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  ASSERT_EQ(parser.parse(r.out).get(doc), simdjson::SUCCESS) << r.out;
  simdjson::dom::array snaps;
  ASSERT_EQ(doc["snapshots"].get(snaps), simdjson::SUCCESS);
  ASSERT_EQ(snaps.size(), 3u);
  auto second = snaps.at(2);  // orders/1
  EXPECT_EQ(std::string_view(second["topic"].get_string().value()), "orders");
  EXPECT_EQ(second["partition"].get_int64().value(), 1);
  EXPECT_EQ(second["next_offset"].get_int64().value(), 5000);
  EXPECT_EQ(second["clock_ms"].get_int64().value(), 1'700'000'050'000);
  EXPECT_EQ(std::string_view(second["status"].get_string().value()), "verified");
  EXPECT_EQ(std::string_view(second["filter"].get_string().value()), "exact");
  const auto logical = second["logical_bytes"].get_uint64().value();
  EXPECT_GT(logical, 5000u * 24);
  EXPECT_EQ(second["chunks"].get_uint64().value(), (logical + 4095) / 4096);
  EXPECT_GE(second["age_ms"].get_int64().value(), 0);
  const auto config = std::string(second["config_fingerprint"].get_string().value());
  EXPECT_EQ(config.size(), 16u);
  EXPECT_EQ(std::string_view(second["salt_check"].get_string().value()), "0000000000000007");
}

TEST_F(SnapshotCli, VerifyReportsACorruptChunkAndExitsNonZero) {
  std::string state = store_->read({"orders", 1}, std::nullopt)->state;
  store_.reset();
  {
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options{}, dir_, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    const auto key = format::chunk_key(
        {"orders", 1}, format::chunk_id(std::string_view(state).substr(3 * 4096, 4096)));
    std::string value;
    ASSERT_TRUE(db->Get({}, key, &value).ok());
    value[100] ^= 1;
    ASSERT_TRUE(db->Put({}, key, value).ok());
  }
  auto plain = run_kdedup({"snapshot", "inspect", "--state-dir", dir_});
  EXPECT_EQ(plain.exit_code, 0) << "without --verify only manifests are read";
  auto r = run_kdedup({"snapshot", "inspect", "--state-dir", dir_, "--verify"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("orders/1: snapshot of orders/1 is corrupt: chunk 3"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("corrupt"), std::string::npos);
}

// RocksDB's point-in-time recovery drops every write after a damaged
// write-ahead log record without an error; inspect must still find the
// partitions whose last snapshot went with them (the ledger says which).
TEST_F(SnapshotCli, VerifyFindsSnapshotsLostToADamagedWriteAheadLog) {
  auto more = exact_filter(300);
  ASSERT_TRUE(
      store_->write(capture_snapshot({"clicks", 4}, *more, kScale, 300, 1'700'000'000'900, 7)));
  ASSERT_TRUE(
      store_->write(capture_snapshot({"orders", 0}, *more, kScale, 300, 1'700'000'000'900, 7)));
  store_.reset();  // the writes live in the write-ahead log only
  std::filesystem::path wal;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    if (e.path().extension() == ".log") wal = e.path();
  }
  ASSERT_FALSE(wal.empty());
  std::string bytes;
  {
    std::ifstream in(wal, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  // Damage the write of clicks/4: it and the later orders/0 write are lost.
  const auto pos = bytes.rfind(format::manifest_key({"clicks", 4}));
  ASSERT_NE(pos, std::string::npos);
  bytes[pos + 2] ^= 0x01;
  std::ofstream(wal, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));

  auto r = run_kdedup({"snapshot", "inspect", "--state-dir", dir_, "--verify"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("clicks/4: snapshot of clicks/4 is corrupt: its last write"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("orders/0: snapshot of orders/0 is corrupt: its last write"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("write-ahead log"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("orders/1: "), std::string::npos) << "orders/1 was written before\n"
                                                         << r.out;
  auto json = run_kdedup({"snapshot", "inspect", "--state-dir", dir_, "--json"});
  EXPECT_EQ(json.exit_code, 1) << "found without --verify too: " << json.out;
  EXPECT_NE(json.out.find("\"topic\":\"clicks\",\"partition\":4,\"status\":\"corrupt\""),
            std::string::npos)
      << json.out;
}

TEST_F(SnapshotCli, DeleteNeedsTheOwnerStoppedThenRemovesOnePartition) {
  auto locked = run_kdedup(
      {"snapshot", "delete", "--state-dir", dir_, "--topic", "orders", "--partition", "1"});
  EXPECT_EQ(locked.exit_code, 1);
  EXPECT_NE(locked.err.find("another kdedup instance is using"), std::string::npos) << locked.err;
  store_.reset();
  auto r = run_kdedup(
      {"snapshot", "delete", "--state-dir", dir_, "--topic", "orders", "--partition", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("deleted snapshot of orders/1"), std::string::npos) << r.out;
  auto after = run_kdedup({"snapshot", "inspect", "--state-dir", dir_});
  EXPECT_NE(after.out.find("2 snapshot(s)"), std::string::npos) << after.out;
}

TEST(SnapshotCliErrors, MissingDirAndBadUsage) {
  TempDir tmp;
  auto r = run_kdedup({"snapshot", "inspect", "--state-dir", tmp.file("nope")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;
  auto empty = run_kdedup({"snapshot", "inspect", "--state-dir", tmp.path()});
  EXPECT_EQ(empty.exit_code, 1);
  EXPECT_NE(empty.err.find("holds no kdedup state"), std::string::npos) << empty.err;
  EXPECT_EQ(run_kdedup({"snapshot", "inspect"}).exit_code, 2);
  EXPECT_EQ(run_kdedup({"snapshot"}).exit_code, 2);
}

}  // namespace
}  // namespace kdedup::state
