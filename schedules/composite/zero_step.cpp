// Built-in composites (include/mk/composite.hpp): a step's collectives as one
// program, run as one kernel by mkCompositeRun. Copy one to start your own.
#include <mk/composite.hpp>

using namespace mk::dsl;

// ZeRO / FSDP: this step's gradients are reduce-scattered into this rank's
// shard while the parameters the next step needs are all-gathered. The two
// touch different buffers, so they run side by side in one kernel.
static void zero_step(Composite& c) {
  const int grads = c.buffer("grads");              // ranks x count
  const int grad_shard = c.buffer("grad_shard");    // count
  const int param_shard = c.buffer("param_shard");  // count
  const int params = c.buffer("params");            // ranks x count
  c.reduce_scatter(grads, grad_shard);
  c.all_gather(param_shard, params);
}
MK_COMPOSITE("composite.zero_step", zero_step,
             "reduce-scatter gradients and all-gather parameters side by side, one kernel");

// An all-reduce that keeps its reduced shard: reduce-scatter into `shard`,
// then all-gather `shard` into `out`. The all-gather reads what the
// reduce-scatter wrote, so it runs after it on the same thread blocks.
static void reduce_scatter_all_gather(Composite& c) {
  const int in = c.buffer("in");        // ranks x count
  const int shard = c.buffer("shard");  // count: this rank's reduced block
  const int out = c.buffer("out");      // ranks x count: every block reduced
  c.reduce_scatter(in, shard, "reducescatter.ring");
  c.all_gather(shard, out, "allgather.ring");
}
MK_COMPOSITE("composite.reduce_scatter_all_gather", reduce_scatter_all_gather,
             "reduce-scatter, then all-gather of the reduced shard (an all-reduce that keeps the shard)");
