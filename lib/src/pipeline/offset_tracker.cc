#include "kdedup/pipeline/offset_tracker.h"

#include <algorithm>

namespace kdedup::pipeline {

bool OffsetTracker::add(std::span<const Processed> records) {
  std::lock_guard lock(mu_);
  std::int64_t last = last_offset_;
  for (const auto& r : records) {
    if (r.offset <= last) return false;
    last = r.offset;
  }
  for (const auto& r : records) {
    last_offset_ = r.offset;
    in_flight_ += r.outputs;
    if (r.outputs == 0 && entries_.empty() && !frozen_) {
      committable_ = r.offset + 1;  // nothing before it is outstanding
    } else {
      entries_.push_back(Entry{r.offset, r.outputs, false});
    }
  }
  return true;
}

OffsetTracker::Entry* OffsetTracker::find(std::int64_t offset) {
  if (entries_.empty() || offset < entries_.front().offset) return nullptr;
  // Offsets are usually consecutive: the entry sits `offset - front` places
  // in. Gaps (compaction, transaction markers) fall back to a search.
  const auto guess = static_cast<std::uint64_t>(offset - entries_.front().offset);
  if (guess < entries_.size() && entries_[guess].offset == offset) return &entries_[guess];
  auto it = std::lower_bound(entries_.begin(), entries_.end(), offset,
                             [](const Entry& e, std::int64_t o) { return e.offset < o; });
  if (it == entries_.end() || it->offset != offset) return nullptr;
  return &*it;
}

void OffsetTracker::pop_completed() {
  while (!frozen_ && !entries_.empty() && entries_.front().pending == 0 &&
         !entries_.front().failed) {
    committable_ = entries_.front().offset + 1;
    entries_.pop_front();
  }
}

void OffsetTracker::delivered(std::int64_t offset) {
  std::lock_guard lock(mu_);
  Entry* e = find(offset);
  if (e == nullptr || e->pending == 0) return;  // unknown: never moves the position
  --e->pending;
  --in_flight_;
  pop_completed();
}

void OffsetTracker::failed(std::int64_t offset, std::string reason) {
  std::lock_guard lock(mu_);
  if (!failure_) failure_ = std::move(reason);
  Entry* e = find(offset);
  if (e == nullptr) {
    // Not registered (cannot happen when callers register before producing):
    // freeze the position where it is rather than guess.
    frozen_ = true;
    return;
  }
  if (e->pending > 0) {
    --e->pending;
    --in_flight_;
  }
  e->failed = true;
}

std::optional<std::int64_t> OffsetTracker::committable() const {
  std::lock_guard lock(mu_);
  return committable_;
}

std::uint64_t OffsetTracker::in_flight() const {
  std::lock_guard lock(mu_);
  return in_flight_;
}

std::size_t OffsetTracker::pending_records() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

std::optional<std::string> OffsetTracker::failure() const {
  std::lock_guard lock(mu_);
  return failure_;
}

}  // namespace kdedup::pipeline
