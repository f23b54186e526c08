// Version and revision are compile definitions of this file only, so a new
// `git describe` at configure time recompiles one file.
#include "kdedup/metrics/metrics.h"

#ifndef KDEDUP_VERSION
#define KDEDUP_VERSION "unknown"
#endif
#ifndef KDEDUP_REVISION
#define KDEDUP_REVISION "unknown"
#endif

namespace kdedup::metrics {

const char* Metrics::version() noexcept { return KDEDUP_VERSION; }
const char* Metrics::revision() noexcept { return KDEDUP_REVISION; }

}  // namespace kdedup::metrics
