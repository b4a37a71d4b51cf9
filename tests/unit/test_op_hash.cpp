#include "profiler/op_hash.h"
#include "profiler/op_sequence.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace memplan {
namespace {

Op make(const std::string& name, std::vector<TensorRef> inputs, const std::string& overload = "") {
  Op op;
  op.name = name;
  op.overload = overload;
  op.inputs = std::move(inputs);
  return op;
}

TEST(OpHash, TheStructureIgnoresSizesButNotRanksDtypesOrNames) {
  const Op a = make("aten::cross_entropy_loss", {{0, {16, 10}, "Float"}, {1, {16}, "Long"}});
  const Op b = make("aten::cross_entropy_loss", {{0, {21, 10}, "Float"}, {1, {21}, "Long"}});
  EXPECT_NE(identity_of(a), identity_of(b));
  EXPECT_EQ(structure_of(a), structure_of(b));
  EXPECT_NE(structure_of(a), structure_of(make("aten::cross_entropy_loss", {{0, {16, 10, 1}, "Float"}, {1, {16}, "Long"}})));
  EXPECT_NE(structure_of(a), structure_of(make("aten::cross_entropy_loss", {{0, {16, 10}, "Half"}, {1, {16}, "Long"}})));
  EXPECT_NE(structure_of(a), structure_of(make("aten::nll_loss", {{0, {16, 10}, "Float"}, {1, {16}, "Long"}})));
  EXPECT_NE(structure_of(a), identity_of(a));
}

TEST(OpHash, ARunningHashOfInputsEqualsTheOpHash) {
  // The replay feeds inputs one by one (add_input) and must get add_op's value.
  const Op a = make("aten::linear", {{0, {4, 8}, "Float"}, {1, {3, 8}, "Float"}}, "");
  OpHasher h, st;
  h.add("aten::linear");
  h.add("");
  st.add("aten::linear");
  st.add("");
  for (const TensorRef& t : a.inputs) {
    h.add_input(t.dtype.c_str(), t.shape.data(), t.shape.size());
    st.add_input_structure(t.dtype.c_str(), t.shape.size());
  }
  EXPECT_EQ(h.value(), identity_of(a));
  EXPECT_EQ(st.value(), structure_of(a));
}

TEST(OpHash, OpsWhoseOutputShapeFollowsFromData) {
  const TensorRef x{0, {4, 32, 10}, "Float"};
  EXPECT_TRUE(data_dependent_shape(make("aten::index", {x, {1, {4, 32}, "Bool"}}, "Tensor")));
  EXPECT_TRUE(data_dependent_shape(make("aten::index", {x, {1, {4, 32}, "Byte"}}, "Tensor")));
  EXPECT_FALSE(data_dependent_shape(make("aten::index", {x, {1, {7}, "Long"}}, "Tensor")));
  EXPECT_FALSE(data_dependent_shape(make("aten::index", {{0, {4}, "Bool"}, {1, {2}, "Long"}}, "Tensor")));
  EXPECT_TRUE(data_dependent_shape(make("aten::nonzero", {{0, {4, 32}, "Bool"}})));
  EXPECT_TRUE(data_dependent_shape(make("aten::masked_select", {x, {1, {4, 32, 10}, "Bool"}})));
  EXPECT_TRUE(data_dependent_shape(make("aten::where", {{0, {4, 32}, "Bool"}})));
  EXPECT_FALSE(data_dependent_shape(make("aten::where", {{0, {4, 32}, "Bool"}, x, x}, "self")));
  EXPECT_TRUE(data_dependent_shape(make("aten::repeat_interleave", {x, {1, {4}, "Long"}}, "self_Tensor")));
  EXPECT_FALSE(data_dependent_shape(make("aten::repeat_interleave", {x}, "self_int")));
  EXPECT_FALSE(data_dependent_shape(make("aten::linear", {x})));
}

TEST(OpSequence, MatchesOpsByIdentityAndAfterADataDependentShapeByStructure) {
  const TensorRef x{0, {4, 32, 10}, "Float"};
  const std::vector<Op> ops = {make("aten::linear", {x}), make("aten::index", {x, {1, {4, 32}, "Bool"}}, "Tensor"),
                               make("aten::relu", {{2, {77, 10}, "Float"}})};
  const OpSequence seq(ops);
  EXPECT_EQ(seq.size(), 3u);
  EXPECT_EQ(seq.first_data_dependent(), 1);
  EXPECT_EQ(seq.first_data_dependent_name(), "aten::index");
  const Op relu_other = make("aten::relu", {{2, {81, 10}, "Float"}});
  const Op linear_other = make("aten::linear", {{0, {4, 16, 10}, "Float"}});
  EXPECT_EQ(seq.match(0, identity_of(ops[0]), structure_of(ops[0])), OpSequence::Match::Same);
  EXPECT_EQ(seq.match(2, identity_of(ops[2]), structure_of(ops[2])), OpSequence::Match::Same);
  // Other sizes after the mask index: the same op (the count of rows kept follows from data).
  EXPECT_EQ(seq.match(2, identity_of(relu_other), structure_of(relu_other)), OpSequence::Match::Drift);
  // Before it, other sizes are another step (another sequence length).
  EXPECT_EQ(seq.match(0, identity_of(linear_other), structure_of(linear_other)), OpSequence::Match::Other);
  EXPECT_EQ(seq.match(2, identity_of(ops[0]), structure_of(ops[0])), OpSequence::Match::Other);
  EXPECT_EQ(seq.match(3, identity_of(ops[0]), structure_of(ops[0])), OpSequence::Match::Other);
  EXPECT_EQ(seq.match(-1, identity_of(ops[0]), structure_of(ops[0])), OpSequence::Match::Other);
  const OpSequence plain({ops[0], ops[2]});
  EXPECT_EQ(plain.first_data_dependent(), -1);
  EXPECT_EQ(plain.match(1, identity_of(relu_other), structure_of(relu_other)), OpSequence::Match::Other);
}

TEST(OpSequence, WithinALargerSequenceMeansItsOpsInOrderFromTheSameFirstOp) {
  const TensorRef x{0, {4, 32, 10}, "Float"};
  const Op embed = make("aten::embedding", {x}), norm = make("aten::layer_norm", {x}),
           lin = make("aten::linear", {x}), gelu = make("aten::gelu", {x}), head = make("aten::matmul", {x});
  // Three layers (norm, linear, gelu) between the embedding and the head.
  const OpSequence three({embed, norm, lin, gelu, norm, lin, gelu, norm, lin, gelu, norm, head});
  const OpSequence one({embed, norm, lin, gelu, norm, head});  // two layers left out
  const OpSequence none({embed, norm, head});
  EXPECT_TRUE(one.within(three));
  EXPECT_TRUE(none.within(three));
  EXPECT_TRUE(none.within(one));
  EXPECT_TRUE(three.within(three));
  EXPECT_FALSE(three.within(one));  // more ops: a larger step
  // An op the larger one never runs after that point, another first op, or nothing at all.
  EXPECT_FALSE(OpSequence({embed, norm, head, gelu}).within(three));
  EXPECT_FALSE(OpSequence({norm, head}).within(three));
  EXPECT_FALSE(OpSequence({embed, head, norm}).within(three));
  EXPECT_FALSE(OpSequence().within(three));
  // Other sizes are other ops.
  EXPECT_FALSE(OpSequence({embed, make("aten::layer_norm", {{0, {4, 16, 10}, "Float"}}), head}).within(three));
}

}  // namespace
}  // namespace memplan
