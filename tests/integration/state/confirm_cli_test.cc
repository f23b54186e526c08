// `kdedup snapshot inspect` on a state dir in confirmed mode: the confirm
// store's partitions, entries (estimated, exact with --verify), bytes and
// the snapshot they belong to, in the table and in JSON, next to the owner.

#include <gtest/gtest.h>
#include <simdjson.h>

#include "kdedup/state/snapshot_store.h"
#include "process.h"

namespace kdedup::state {
namespace {

using kdedup::testing::run_kdedup;
using kdedup::testing::TempDir;

constexpr filter::TickScale kConfirmScale(60'000, 192);

TEST(ConfirmCli, InspectShowsTheConfirmStorePerPartition) {
  TempDir tmp;
  const std::string dir = tmp.file("state");
  StoreOptions o;
  o.confirm = ConfirmOptions{};
  auto store = SnapshotStore::open(dir, o);
  ASSERT_TRUE(store) << store.error().message;
  filter::FilterConfig c;
  c.type = filter::FilterType::kTimer;
  c.ticks_per_window = 192;
  auto f = filter::make_filter(c);
  ASSERT_TRUE(f);
  // orders/2: 3,000 deliveries, 2,000 of them below the snapshot at offset
  // 2,000; orders/5: deliveries but no snapshot yet (nothing bound).
  auto p2 = (*store)->confirm()->attach({"orders", 2}, kConfirmScale, std::nullopt);
  auto p5 = (*store)->confirm()->attach({"orders", 5}, kConfirmScale, std::nullopt);
  ASSERT_TRUE(p2);
  ASSERT_TRUE(p5);
  std::vector<ConfirmWrite> w;
  for (std::int64_t i = 0; i < 3000; ++i) {
    w.push_back(
        {{static_cast<std::uint64_t>(i) * 7919 + 1, 3}, static_cast<filter::Tick>(i / 30), i});
  }
  ASSERT_TRUE((*p2)->record(w));
  ASSERT_TRUE((*p5)->record(std::span(w).first(10)));
  ASSERT_TRUE((*store)->write(
      capture_snapshot({"orders", 2}, **f, kConfirmScale, 2000, kConfirmScale.start_ms(66), 9)));

  // The owner still holds the database: inspect reads it read-only.
  auto table = run_kdedup({"snapshot", "inspect", "--state-dir", dir, "--verify"});
  ASSERT_EQ(table.exit_code, 0) << table.err << table.out;
  EXPECT_NE(table.out.find("confirm store " + dir + "/confirm"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("2 partition(s)"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("2000 (2000 live)"), std::string::npos) << table.out;

  auto json = run_kdedup({"snapshot", "inspect", "--state-dir", dir, "--json", "--verify"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  ASSERT_EQ(parser.parse(json.out).get(doc), simdjson::SUCCESS) << json.out;
  simdjson::dom::array parts;
  ASSERT_EQ(doc["confirm_store"]["partitions"].get(parts), simdjson::SUCCESS) << json.out;
  ASSERT_EQ(parts.size(), 2u);
  std::int64_t partition = -1, snapshot = -1;
  std::uint64_t entries = 0;
  bool exact = false;
  ASSERT_EQ(parts.at(0)["partition"].get(partition), simdjson::SUCCESS);
  ASSERT_EQ(parts.at(0)["entries"].get(entries), simdjson::SUCCESS);
  ASSERT_EQ(parts.at(0)["entries_exact"].get(exact), simdjson::SUCCESS);
  ASSERT_EQ(parts.at(0)["snapshot_offset"].get(snapshot), simdjson::SUCCESS);
  EXPECT_EQ(partition, 2);
  EXPECT_EQ(entries, 2000u) << "only the deliveries below the snapshot are on disk";
  EXPECT_TRUE(exact);
  EXPECT_EQ(snapshot, 2000);
  // orders/5 has nothing on disk and no snapshot its entries belong to.
  EXPECT_TRUE(parts.at(1)["snapshot_offset"].is_null());
  std::uint64_t entries5 = 1;
  ASSERT_EQ(parts.at(1)["entries"].get(entries5), simdjson::SUCCESS);
  EXPECT_EQ(entries5, 0u);
}

}  // namespace
}  // namespace kdedup::state
