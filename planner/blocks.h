// Blocks: the forward cut at 1-separators (Rockmate): a cut after op i is a separator when at most
// one non-persistent value produced at or before i is read after i. Tiny neighbours are merged and
// the count is capped (the DP is cubic in it). Identical blocks get the same signature and share
// one ILP solve.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/graph.h"

namespace memplan::planner {

struct Block {
  int64_t first = 0, last = 0;   // forward ops [first, last]
  int64_t input = -1;            // the separator value entering the block, -1 if none
  int64_t input_bytes = 0;
  std::vector<int64_t> cand;     // evictable saved values it produces (not its output separator)
  int64_t anchor = 0;            // bwd node before which its recompute runs (prefix-min, see .cpp)
  std::string signature;         // canonical structure; equal => same ILP problem
  int shape_id = 0;              // index of the first block with this signature
};

struct BlockOptions {
  int min_ops = 4;        // merge atomic segments until a block has this many ops ...
  int max_blocks = 80;    // ... and at most this many blocks (DP is O(M L^3))
};

std::vector<Block> make_blocks(const Graph& g, const BlockOptions& opt);

}  // namespace memplan::planner
