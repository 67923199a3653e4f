// Where each TensorFlow resource variable's value lives now, asked without a TensorFlow op call.
//
// disc.tf freezes a function's variables into its program and must notice a later write. Writes
// to a variable whose buffer another tensor shares (the watch holds one read of each) give it a
// new buffer, so the buffer's address tells whether it was written. Reading the variables, or
// even one op over all their handles, costs an eager dispatch at every call (50-500 us between
// the program's calls, measured). So the op DiscWatchVariables runs once: it looks the variables
// up, keeps them (a watch id), and disc_variable_buffers() -- plain C, called through ctypes --
// then reads their current buffers under each variable's lock in a few microseconds. A variable
// in copy-on-read mode (its reads are copies, its sparse writes in place) reports -1: its address
// says nothing about it.
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace {

using Variables = std::vector<tensorflow::core::RefCountPtr<tensorflow::Var>>;

std::mutex watches_mu;
std::unordered_map<int64_t, std::unique_ptr<Variables>> watches;
int64_t next_watch = 1;

class DiscWatchVariables : public tensorflow::OpKernel {
 public:
  explicit DiscWatchVariables(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(tensorflow::OpKernelContext* ctx) override {
    const auto handles = ctx->input(0).flat<tensorflow::ResourceHandle>();
    auto vars = std::make_unique<Variables>(handles.size());
    for (int64_t i = 0; i < handles.size(); ++i) {
      OP_REQUIRES_OK(ctx, tensorflow::LookupResource(ctx, handles(i), &(*vars)[i]));
    }
    tensorflow::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({}), &out));
    std::lock_guard<std::mutex> lock(watches_mu);
    out->scalar<int64_t>()() = next_watch;
    watches.emplace(next_watch++, std::move(vars));
  }
};

}  // namespace

REGISTER_OP("DiscWatchVariables")
    .Input("handles: resource")
    .Output("watch: int64")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("DiscWatchVariables").Device(tensorflow::DEVICE_CPU), DiscWatchVariables);

extern "C" {

// Writes the n watched variables' buffer addresses (-1: copy-on-read) to out; 0, or -1 for an
// unknown watch or a wrong n.
int disc_variable_buffers(int64_t watch, int64_t* out, int64_t n) {
  Variables* vars = nullptr;
  {
    std::lock_guard<std::mutex> lock(watches_mu);
    auto it = watches.find(watch);
    if (it == watches.end()) return -1;
    vars = it->second.get();
  }
  if (static_cast<int64_t>(vars->size()) != n) return -1;
  for (int64_t i = 0; i < n; ++i) {
    tensorflow::Var* var = (*vars)[i].get();
    tensorflow::tf_shared_lock lock(*var->mu());
    out[i] = var->copy_on_read_mode.load() ? -1 : static_cast<int64_t>(reinterpret_cast<intptr_t>(var->tensor()->data()));
  }
  return 0;
}

// Lets the watch's variables go (they live on while watched).
void disc_variable_release(int64_t watch) {
  std::lock_guard<std::mutex> lock(watches_mu);
  watches.erase(watch);
}

}  // extern "C"
