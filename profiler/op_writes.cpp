#include "profiler/op_writes.h"

#include <torch/csrc/utils/schema_info.h>

#include <algorithm>

namespace memplan {

std::vector<char> mutable_args(const c10::FunctionSchema& schema) {
  torch::utils::SchemaInfo info(schema);
  std::vector<char> out(schema.arguments().size(), 0);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = info.is_mutable(c10::SchemaArgument(c10::SchemaArgType::input, i)) ? 1 : 0;
  }
  return out;
}

const std::vector<char>& WritesByName::of(const at::RecordFunction& fn) {
  const char* name = fn.name();
  auto it = cache_.find(name);
  if (it != cache_.end()) return it->second;
  std::vector<char> out;
  if (auto schema = fn.operator_schema()) out = mutable_args(*schema);
  if (std::find(out.begin(), out.end(), 1) == out.end()) out.clear();
  return cache_.emplace(name, std::move(out)).first->second;
}

}  // namespace memplan
