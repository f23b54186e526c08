#pragma once
// Judging `kdedup filter` output against its input, shared by the suite's
// files: JSON-lines records {"id":N,"ts":MS} in, the lines kept out.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kdedup::testing {

/// `v` as the shortest text that reads back as it ("0.01", "1e-05").
std::string fmt_double(double v);

/// The lines of `text`, without their '\n' (a last line without one is left out).
std::vector<std::string> split_lines(const std::string& text);

/// What judge() found.
struct Verdict {
  std::size_t emitted = 0, false_negatives = 0, false_positives = 0, not_delivered = 0;
  std::size_t identities_dropped = 0, identities_new = 0;
  /// Records not delivered whose identity had none since its last delivery
  /// (or ever), and those of them dropped: the false-positive rate of
  /// identities that come back new many times (a falsely dropped identity
  /// sent again is not asked again).
  std::size_t first_queries = 0, first_query_false_positives = 0;
};

/// Judges `kdedup filter` output by seed 000 Definition 4: a record is a
/// duplicate iff its id was *delivered* (emitted) within the window, here at
/// ticks of window / `ticks` on the max-so-far clock, as kdedup filter maps
/// time. A record emitted although delivered within the window is a false
/// negative; one dropped although not delivered is a false positive (counted
/// against the records not delivered). Per identity: those with a false
/// positive among those with a record not delivered (a falsely dropped
/// identity sent again while the entry it matched is alive is dropped again:
/// one false match, two records), and per first query (Verdict). Fails the
/// test when the output is not the input's lines in order.
Verdict judge(const std::string& input, const std::string& output, std::int64_t window_ms,
              std::int64_t ticks);

}  // namespace kdedup::testing
