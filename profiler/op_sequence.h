// The forward ops a profiled step ran, as identities (op_hash.h): which ops of a later step match
// it. The replay checks every op against its plan's sequence (divergence), and a step whose first
// op several kinds of step start with is matched against each of theirs until one is left
// (Agent::narrow_kinds).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "profiler/profile.h"

namespace memplan {

class OpSequence {
 public:
  OpSequence() = default;
  explicit OpSequence(const std::vector<Op>& forward);

  enum class Match {
    Same,   // the profile's op at this position
    Drift,  // the same op with other sizes, after an op whose output shape follows from data (or
            // anywhere, with any_size)
    Other,  // another op, or another shape: the step left this sequence
  };
  // Op `op` of a step, by its identity and structure hashes (Recorder::op_hash /
  // op_structure_hash). `any_size`: the step is known to run these ops at other sizes (a longer
  // or shorter sequence replaying the plan of its family, StepKinds::Choice::family), so the
  // structure is enough everywhere. Cost: two compares.
  Match match(int64_t op, uint64_t hash, uint64_t structure, bool any_size = false) const {
    if (op < 0 || static_cast<size_t>(op) >= hashes_.size()) return Match::Other;
    if (hash == hashes_[op]) return Match::Same;
    if (structure == structures_[op] && (any_size || (first_data_dependent_ >= 0 && op > first_data_dependent_))) {
      return Match::Drift;
    }
    return Match::Other;
  }
  size_t size() const { return hashes_.size(); }
  // Whether a step of these ops would run as `larger`'s with stretches left out (a layer that
  // LayerDrop skipped): the same first op, then every op in order among `larger`'s. Greedy, as
  // the replay matches (Replayer::skip_to), so true exactly when such a replay follows it to the
  // end. Cost: one pass over both.
  bool within(const OpSequence& larger) const;
  // Op `op`'s input elements (all its tensor inputs), or -1 past the end: how large a step of
  // the same structure is, where its ops first differ (Agent::narrow_kinds).
  int64_t numel(int64_t op) const {
    return op >= 0 && static_cast<size_t>(op) < numels_.size() ? numels_[op] : -1;
  }
  // The first op whose output shape follows from data (data_dependent_shape), or -1.
  int64_t first_data_dependent() const { return first_data_dependent_; }
  const std::string& first_data_dependent_name() const { return first_data_dependent_name_; }

 private:
  std::vector<uint64_t> hashes_;      // per op: identity_of
  std::vector<uint64_t> structures_;  // per op: structure_of
  std::vector<int64_t> numels_;       // per op: input elements
  int64_t first_data_dependent_ = -1;
  std::string first_data_dependent_name_;
};

}  // namespace memplan
