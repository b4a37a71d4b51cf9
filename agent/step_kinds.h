// Which kind of training step comes next, and when to stop trying.
//
// A script may run several different steps in turn: a GAN's discriminator and generator steps,
// two losses with a backward each, batches bucketed by sequence length, a smaller last batch per
// epoch. Each op sequence (a "kind", named by its signature, Profile::signature) gets its own
// profiles and its own plan, chosen from the step's first op. That op's identity (name, input
// shapes and dtypes) already tells apart the kinds that differ there (a batch of another length
// or size): only kinds that start with it are candidates. Among those the next kind is
// predicted from the ones before it (a GAN's two steps may start alike), and the other planned
// candidates are named too (Choice::others): the agent follows them all until the step's ops
// tell them apart (Agent::narrow_kinds). A first op no kind starts with is a new kind, recorded
// whole. A wrong guess is a divergence (the replay stops evicting and rebuilds on demand),
// never a wrong gradient.
//
// And a script whose step changes all the time (a new sequence length every batch) would be
// profiled and planned over and over, each plan costing about a second: after too many kinds or
// too many misses, give_up() says why, and the agent runs plain PyTorch from there on.
//
// Pure bookkeeping, no torch: unit-tested in tests/unit/test_step_kinds.cpp.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace memplan {

class StepKinds {
 public:
  static constexpr size_t kWindow = 64;     // steps of history the prediction looks at
  static constexpr size_t kMaxContext = 16; // longest history suffix matched
  static constexpr size_t kMaxKinds = 8;    // more families of op sequences: give up
  static constexpr size_t kMaxKindsAll = 32; // more different op sequences: give up
  // Up to this many kinds, each gets its own profile and plan. From there on, a step with no
  // planned kind of its own whose first op has the structure of a planned kind's, with no more
  // elements, replays the plan of the smallest such kind (Choice::family): a new sequence length
  // every batch (padding to each batch's longest) replays the plan of a longer one.
  static constexpr size_t kOwnPlans = 4;
  static constexpr size_t kMissWindow = 16; // give up at kMaxMisses wrong guesses in this many steps
  static constexpr size_t kMaxMisses = 4;

  // `warmup`: full records of a kind before it is planned (MEMPLAN_WARMUP).
  explicit StepKinds(int warmup) : warmup_(warmup < 1 ? 1 : warmup) {}

  // A step's first op: its identity hash (name, input shapes and dtypes; Recorder::
  // identity_hash), its structure hash (the same without sizes; 0: none, no family) and its
  // input elements (how large the step is, among steps of the same structure).
  struct FirstOp {
    FirstOp(uint64_t id = 0, uint64_t st = 0, int64_t n = 0) : identity(id), structure(st), numel(n) {}
    uint64_t identity;
    uint64_t structure;
    int64_t numel;
  };

  // What the next step does: record it whole (its kind has no plan yet, or nothing is known),
  // or replay the predicted kind's plan (`plan` >= 0, an index the caller gave in set_plan).
  struct Choice {
    bool profile = true;
    uint64_t kind = 0;  // 0: no kind known starts with this first op
    int plan = -1;
    // When replaying: the plans of the other kinds that start with this first op, in the order
    // they were made. Until the step's ops tell them apart, it may be one of those
    // (Agent::narrow_kinds).
    std::vector<int> others;
    // Replaying the plan of a kind of the same structure and at least this step's size, this
    // step's kind having no plan of its own (kOwnPlans): its ops are matched by structure, and
    // a step that runs the same ops counts as of that kind.
    bool family = false;
    // Recorded whole as a step larger than every planned kind of its structure (past kOwnPlans
    // kinds): planned at the end of this one record, so that the steps of its size and below
    // have a plan.
    bool plan_at_once = false;
  };
  // Cost: predict's, plus one pass over the kinds (at most kMaxKindsAll + 1).
  Choice next(const FirstOp& first) const;

  // The step chosen as `c` ended, and ran op sequence `signature` from first op `first`;
  // `diverged`: its replay left the plan's profile. True when that kind has no plan and is due
  // one: it has been recorded whole `warmup` times, or it is the last of the run's first
  // `warmup` steps (the warm-up: a script's first step often runs setup ops the later ones do
  // not). The caller plans it and calls set_plan.
  // `gapped`: its replay ran the plan's ops with stretches left out (Replayer::skip_to: a layer
  // LayerDrop skipped): not a miss, and a step of the kind it replayed (see set_cover).
  bool finish(const Choice& c, uint64_t signature, const FirstOp& first, bool diverged, bool gapped = false);
  void set_plan(uint64_t kind, int plan);
  // Kind `kind`'s ops are among kind `by`'s, in order, from the same first op (OpSequence::
  // within): its steps replay `by`'s plan, leaving out the ops they do not run, and it gets no
  // plan of its own. A model that skips a random few of its layers (LayerDrop) would otherwise
  // be a new kind nearly every step, each profiled and planned, until memplan gave up. (A model
  // that stops running a layer for good replays the larger plan too: within its budget, with
  // more recomputation than a plan of its own might need.)
  // False, and nothing set, for a kind never_cover named.
  bool set_cover(uint64_t kind, uint64_t by);
  bool covered(uint64_t kind) const { return cover_.count(kind) > 0; }
  // The kind whose plan `kind`'s steps replay (set_cover), or 0.
  uint64_t cover_of(uint64_t kind) const {
    auto it = cover_.find(kind);
    return it == cover_.end() ? 0 : it->second;
  }
  // The kinds `by` covered replay plans of their own again (or are recorded and planned): its
  // plan has no actions now, so no replayer to follow their steps past the ops they leave out.
  void uncover_by(uint64_t by) {
    for (auto it = cover_.begin(); it != cover_.end();) it = it->second == by ? cover_.erase(it) : std::next(it);
  }
  // Kind `kind` replayed a covering plan with gaps and had to refuse some of its evictions
  // (Agent::end_step): it is planned on its own from now on, never covered.
  void never_cover(uint64_t kind) {
    cover_.erase(kind);
    uncoverable_.insert(kind);
  }
  bool coverable(uint64_t kind) const { return uncoverable_.count(kind) == 0; }

  // Why to stop planning and run plain from here on; nullopt while the steps settle.
  std::optional<std::string> give_up() const;
  // The kinds of the last min(n, history) steps, oldest first.
  std::vector<uint64_t> recent(size_t n) const;
  // The plan index set for `kind`, or -1.
  int plan_of(uint64_t kind) const;

  // The kind that follows the history: what followed the latest earlier occurrence of the
  // longest history suffix seen before (up to kMaxContext steps); with none, the last kind.
  // Cost: O(kWindow * kMaxContext) compares, once per step.
  std::optional<uint64_t> predict() const;
  // The same prediction among the kinds whose first op is `first_op` (then any such kind known
  // from before the history's window); nullopt when no kind starts so. Same cost.
  std::optional<uint64_t> predict(uint64_t first_op) const;
  size_t kinds() const { return kinds_.size(); }
  int64_t misses() const { return misses_total_; }

 private:
  struct Kind {
    int profiled = 0;  // whole records so far
    int plan = -1;
    FirstOp first;  // its first op
  };
  // Kinds of distinct first-op structures (a kind with none counts alone).
  size_t families() const;
  int warmup_;
  std::deque<uint64_t> history_;
  std::deque<char> missed_;  // per step of the last kMissWindow: a replay guessed wrong
  std::unordered_map<uint64_t, Kind> kinds_;
  int64_t misses_total_ = 0;
  std::unordered_map<uint64_t, uint64_t> cover_;  // kind -> the kind whose plan it replays
  std::unordered_set<uint64_t> uncoverable_;       // never_cover
  int recorded_ = 0;         // steps recorded whole, all kinds
  bool any_plan_ = false;
};

}  // namespace memplan
