// agent/storage_copy.h: a slice copied with its whole storage, laid out as it was.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "agent/storage_copy.h"

using memplan::copy_with_storage;

TEST(StorageCopy, ASliceIsCopiedWithItsStorageAndViewedAlike) {
  at::Tensor m = at::arange(24, at::kFloat).view({4, 6});
  at::Tensor slice = m.slice(/*dim=*/1, 1, 3);  // columns 1 and 2: neither dense nor at offset 0
  at::Tensor copy = copy_with_storage(slice);
  ASSERT_TRUE(copy.defined());
  EXPECT_EQ(copy.sizes(), slice.sizes());
  EXPECT_EQ(copy.strides(), slice.strides());
  EXPECT_EQ(copy.storage_offset(), slice.storage_offset());
  EXPECT_EQ(copy.scalar_type(), slice.scalar_type());
  EXPECT_TRUE(at::equal(copy, slice));
  EXPECT_NE(copy.storage().unsafeGetStorageImpl(), m.storage().unsafeGetStorageImpl());
  EXPECT_EQ(copy.storage().nbytes(), m.storage().nbytes());
  // Written in place, the copy's storage read whole is `m` with that slice written; `m` unchanged.
  copy.fill_(-1);
  at::Tensor whole = at::empty({0}, m.options()).set_(copy.storage(), 0, m.sizes(), m.strides());
  at::Tensor expected = m.clone();
  expected.slice(1, 1, 3).fill_(-1);
  EXPECT_TRUE(at::equal(whole, expected));
  EXPECT_TRUE(at::equal(m, at::arange(24, at::kFloat).view({4, 6})));
}

TEST(StorageCopy, ARowRangeAtAnOffsetIsCopiedWithItsStorage) {
  at::Tensor m = at::arange(12, at::kInt).view({6, 2});
  at::Tensor rows = m.slice(0, 2, 4);  // dense, but a part of the storage
  at::Tensor copy = copy_with_storage(rows);
  ASSERT_TRUE(copy.defined());
  EXPECT_EQ(copy.storage_offset(), 4);
  EXPECT_EQ(copy.storage().nbytes(), m.storage().nbytes());
  EXPECT_TRUE(at::equal(copy, rows));
}

TEST(StorageCopy, NoneWhereAPlainCloneIsTheSame) {
  at::Tensor dense = at::ones({3, 5});
  EXPECT_FALSE(copy_with_storage(dense).defined());
  EXPECT_FALSE(copy_with_storage(dense.t()).defined());  // transposed, still all of its storage
  EXPECT_FALSE(copy_with_storage(at::Tensor()).defined());
}

TEST(StorageCopy, TheCopyRequiresNoGradAndLeavesTheOriginalAlone) {
  at::Tensor w = at::ones({4, 4}).requires_grad_(true);
  at::Tensor slice = w.detach().slice(1, 0, 2);
  at::Tensor copy = copy_with_storage(slice);
  ASSERT_TRUE(copy.defined());
  EXPECT_FALSE(copy.requires_grad());
  copy.zero_();
  EXPECT_TRUE(at::equal(w.detach(), at::ones({4, 4})));
}
