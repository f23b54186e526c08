// Expiry of confirm store entries by compaction (confirm_expiry.h).

#include "confirm_expiry.h"

#include "confirm_format.h"

namespace kdedup::state::confirm {

std::shared_ptr<PartitionExpiry> ExpiryRegistry::partition(std::uint32_t id,
                                                           std::uint32_t ticks_per_window) {
  std::lock_guard lock(mu_);
  auto& slot = table_[id];
  if (!slot) {
    slot = std::make_shared<PartitionExpiry>();
    slot->ticks_per_window = ticks_per_window;
  }
  return slot;
}

void ExpiryRegistry::set_horizon(std::uint32_t id, filter::Tick tick) {
  std::shared_ptr<PartitionExpiry> p;
  {
    std::lock_guard lock(mu_);
    auto it = table_.find(id);
    if (it == table_.end()) return;
    p = it->second;
  }
  std::uint64_t now = p->horizon.load(std::memory_order_relaxed);
  while (now < tick && !p->horizon.compare_exchange_weak(now, tick, std::memory_order_relaxed)) {
  }
}

void ExpiryRegistry::reset(std::uint32_t id, std::uint32_t ticks_per_window) {
  auto fresh = std::make_shared<PartitionExpiry>();
  fresh->ticks_per_window = ticks_per_window;
  std::lock_guard lock(mu_);
  // A compaction holding the old state keeps its (older, larger) horizon for
  // the deleted entries only: the new entries are written after the delete.
  table_[id] = std::move(fresh);
}

ExpiryRegistry::Table ExpiryRegistry::copy() const {
  std::lock_guard lock(mu_);
  return table_;
}

namespace {

class ExpiryFilter final : public rocksdb::CompactionFilter {
 public:
  ExpiryFilter(ExpiryRegistry::Table table, std::shared_ptr<std::atomic<std::uint64_t>> dropped)
      : table_(std::move(table)), dropped_(std::move(dropped)) {}
  ~ExpiryFilter() override { dropped_->fetch_add(count_, std::memory_order_relaxed); }

  bool Filter(int /*level*/, const rocksdb::Slice& key, const rocksdb::Slice& value,
              std::string* /*new_value*/, bool* /*value_changed*/) const override {
    const auto id = entry_id(key.ToStringView());
    if (!id) return false;
    const auto tick = decode_tick(value.ToStringView());
    if (!tick) return false;
    if (*id != last_id_ || last_ == nullptr) {
      auto it = table_.find(*id);
      last_id_ = *id;
      last_ = it == table_.end() ? nullptr : it->second.get();
    }
    if (last_ == nullptr) return false;  // a partition this process knows nothing of
    const std::uint64_t horizon = last_->horizon.load(std::memory_order_relaxed);
    // The rule of every filter (sliding_filter.h): alive iff now - t <= W.
    const bool expired = horizon > *tick && horizon - *tick > last_->ticks_per_window;
    if (expired) ++count_;
    return expired;
  }
  const char* Name() const override { return "kdedup.ConfirmExpiry"; }

 private:
  ExpiryRegistry::Table table_;
  std::shared_ptr<std::atomic<std::uint64_t>> dropped_;
  // Entries come in key order: one partition's run at a time.
  mutable std::uint32_t last_id_ = 0;
  mutable const PartitionExpiry* last_ = nullptr;
  mutable std::uint64_t count_ = 0;
};

}  // namespace

std::unique_ptr<rocksdb::CompactionFilter> ExpiryFilterFactory::CreateCompactionFilter(
    const rocksdb::CompactionFilter::Context& /*context*/) {
  return std::make_unique<ExpiryFilter>(registry_->copy(), dropped_);
}

}  // namespace kdedup::state::confirm
