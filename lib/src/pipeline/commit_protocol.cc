// The commit signal both delivery modes share, and the choice of mode
// (commit_protocol.h).

#include "commit_protocol.h"

#include "assigned_partitions.h"
#include "kdedup/pipeline/snapshotter.h"

namespace kdedup::pipeline {

void CommitContext::on_committed(const PartitionId& id, std::int64_t offset) const {
  partitions.confirm(id, offset);
  if (snapshotter != nullptr) snapshotter->committed(id, offset);
}

std::unique_ptr<CommitProtocol> make_commit_protocol(const CommitContext& context) {
  // The only place that asks which delivery mode runs.
  if (context.config.delivery == config::Delivery::kTransactional) {
    return make_transactional_commits(context);
  }
  return make_idempotent_commits(context);
}

}  // namespace kdedup::pipeline
