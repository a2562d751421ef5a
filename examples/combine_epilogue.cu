// A server's combine receive through its own device epilogue (<rocep/combine_epilogue.hpp>): the combined
// rows scaled per token and a bias added per column, then stored as bf16 by rocep, in one kernel. Compile it
// with nvcc (or hipcc for AMD) against an installed rocep:
//
//   nvcc -std=c++17 -arch=sm_90 -I<prefix>/include -c examples/combine_epilogue.cu
#include <rocep/combine_epilogue.hpp>

namespace {

// out[t][c] = combined[t][c] * scale[t] + bias[c]
struct ScaleAndBias {
  const float* scale;  // device memory, [tokens]
  const float* bias;   // device memory, [hidden]
  __device__ void operator()(int token, int column, float (&values)[8]) const {
    const float by = scale[token];
    for (int i = 0; i < 8; ++i) {
      values[i] = values[i] * by + bias[column + i];
    }
  }
};

}  // namespace

// Once, before the group's first dispatch: loads the receive kernel of this epilogue.
void prepare_scaled_combine() {
  rocep::prepare_combine_epilogue<ScaleAndBias>();
}

// The combine of the group's latest dispatch, the receive through ScaleAndBias (args: as for
// EpGroup::combine, without factor, token_factors or residual; stream: a cudaStream_t / hipStream_t).
void scaled_combine(rocep::EpGroup& group, const rocep::CombineArgs& args, const float* scale,
                    const float* bias, void* stream) {
  group.combine_send(args, stream);
  rocep::combine_recv(group, args, ScaleAndBias{scale, bias}, stream);
}
