// Epilogue hook: applied by the operation that completes a reduction, after
// the reduction's own finalisation (avg). The default is the identity; a
// fused element-wise epilogue (scale, activation, cast) specialises
// Epilogue<Tag> in the generated source.
#pragma once
#include "common.cuh"

namespace mk {
namespace dev {

struct NoEpilogue {
  template <typename C>
  MK_HD static C apply(C v) {
    return v;
  }
};

}  // namespace dev
}  // namespace mk
