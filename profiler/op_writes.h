// Which arguments an op may write in place: one test for the recorder (Op::writes, which tells
// the planner that a value an op read is gone once a later op wrote it) and the replayer (which
// never lets a re-run write a live tensor).
#pragma once

#include <ATen/core/function_schema.h>
#include <ATen/record_function.h>

#include <unordered_map>
#include <vector>

namespace memplan {

// Per argument of `schema`: 1 if the op may write it. Its schema's (a!) annotations, and the
// writes schemas do not declare, which torch's SchemaInfo knows: aten::batch_norm,
// native_batch_norm, instance_norm and their kin update running_mean / running_var in training
// mode with no annotation (a re-run must not update them a second time), rrelu_with_noise writes
// `noise`. Asked without argument values, so a training flag counts as true: at worst an
// eval-mode re-run clones two small buffers. Cost: one SchemaInfo (callers cache the result per
// operator).
std::vector<char> mutable_args(const c10::FunctionSchema& schema);

// mutable_args of a recorded op, cached by its name (RecordFunction's stable pointer); empty if it
// writes nothing (or has no schema).
class WritesByName {
 public:
  // Cost: a hash lookup; one SchemaInfo the first time a name is seen.
  const std::vector<char>& of(const at::RecordFunction& fn);

 private:
  std::unordered_map<const char*, std::vector<char>> cache_;
};

}  // namespace memplan
