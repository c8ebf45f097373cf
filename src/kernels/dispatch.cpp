// src/kernels/dispatch.cpp: choosing a kernel behind the one interface.
#include <atomic>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "kernels/kernel.hpp"
#include "kernels/kernel_force.hpp"
#include "multihead/error.hpp"

namespace multihead::detail {

// Defined beside its one reader; runtime.cpp's kernel_force() writes it.
std::atomic<AttentionKernel>& forced_kernel() {
  static std::atomic<AttentionKernel> kernel{AttentionKernel::Auto};
  return kernel;
}

namespace {

// kernel_force() (multihead/runtime.hpp), else MULTIHEAD_KERNEL, forces a
// kernel for the whole process, so one binary can check its fast path
// against its reference ("reference", "materialized", "flash", "auto").
// Read on every call: cheap, and tests may change it.
AttentionKernel kernel_from_environment(AttentionKernel requested) {
  const char* env = std::getenv("MULTIHEAD_KERNEL");
  if (env == nullptr || *env == '\0') return requested;
  try {
    return parse_attention_kernel(env);
  } catch (const Error& e) {
    throw Error(Error::Kind::Value, std::string("MULTIHEAD_KERNEL: ") + e.what());
  }
}

AttentionKernel forced_or(AttentionKernel requested) {
  const AttentionKernel forced = forced_kernel().load(std::memory_order_relaxed);
  if (forced != AttentionKernel::Auto) return forced;
  return kernel_from_environment(requested);
}

template <class T>
bool flash_can_serve(const AttentionArgs<T>& a) {
  if constexpr (!std::is_same_v<T, float>) {
    return false;
  } else {
    return a.weights == nullptr;
  }
}

}  // namespace

void check_kernel_environment() { (void)kernel_from_environment(AttentionKernel::Auto); }

template <class T>
AttentionKernel resolve_forward_kernel(AttentionKernel requested, bool stores_weights) {
  const AttentionKernel kernel = forced_or(requested);
  if (kernel != AttentionKernel::Auto) return kernel;
  return std::is_same_v<T, float> && !stores_weights ? AttentionKernel::Flash : AttentionKernel::Materialized;
}

template AttentionKernel resolve_forward_kernel<float>(AttentionKernel, bool);
template AttentionKernel resolve_forward_kernel<double>(AttentionKernel, bool);

template <class T>
bool decode_kernel_serves(const AttentionArgs<T>& a, AttentionKernel requested) {
  if constexpr (!std::is_same_v<T, float>) {
    (void)a, (void)requested;
    return false;
  } else {
    const ScoreModifiers<float>& m = a.modifiers;
    const int64_t group_rows = a.heads / a.kv_heads_or_heads() * a.q_len;  // query rows per K/V head
    return forced_or(requested) == AttentionKernel::Auto && group_rows <= kDecodeMaxRows && a.weights == nullptr &&
           a.dropout.p == 0.0 && m.attn_mask == nullptr && m.key_padding == nullptr;
  }
}

template bool decode_kernel_serves<float>(const AttentionArgs<float>&, AttentionKernel);
template bool decode_kernel_serves<double>(const AttentionArgs<double>&, AttentionKernel);

template <class T>
void run_attention_forward(const AttentionArgs<T>& args, AttentionKernel kernel) {
  if (args.narrow.dtype != ComputeDtype::F32 && kernel != AttentionKernel::Flash)
    throw Error(Error::Kind::Value, "kernel: the " + to_string(args.narrow.dtype) +
                                        " forward runs on the flash kernel only (16-bit storage); got kernel " +
                                        std::string(kernel == AttentionKernel::Reference ? "reference" : "materialized") +
                                        (args.weights != nullptr ? " (attention weights were asked for: use need_weights=false)" : ""));
  if (kernel == AttentionKernel::Flash && !flash_can_serve(args)) {
    // Forcing flash where it cannot run is a usage error, not a silent swap.
    // The dtype first: a float64 call cannot run flash whatever else it asks.
    if constexpr (!std::is_same_v<T, float>)
      throw Error(Error::Kind::Value,
                  "kernel: flash runs in float32 only; this call is float64 (use kernel=materialized)");
    if (args.weights != nullptr)
      throw Error(Error::Kind::Value,
                  "kernel: flash cannot return attention weights; use need_weights=false or "
                  "kernel=materialized");
  }
  switch (kernel) {
    case AttentionKernel::Reference:
      return attention_forward_reference(args);
    case AttentionKernel::Flash:
      if constexpr (std::is_same_v<T, float>) return attention_forward_flash(args);
      [[fallthrough]];
    default:
      return attention_forward_materialized(args);
  }
}

template void run_attention_forward<float>(const AttentionArgs<float>&, AttentionKernel);
template void run_attention_forward<double>(const AttentionArgs<double>&, AttentionKernel);

template <class T>
void attention_forward(const AttentionArgs<T>& args, AttentionKernel requested) {
  run_attention_forward(args, resolve_forward_kernel<T>(requested, args.weights != nullptr));
}

template void attention_forward<float>(const AttentionArgs<float>&, AttentionKernel);
template void attention_forward<double>(const AttentionArgs<double>&, AttentionKernel);

template <class T>
void run_attention_backward(const AttentionBackwardArgs<T>& args, AttentionKernel kernel) {
  if constexpr (!std::is_same_v<T, float>) {
    if (kernel == AttentionKernel::Flash)
      throw Error(Error::Kind::Value,
                  "kernel: flash runs in float32 only; this backward is float64 (use kernel=materialized)");
  }
  if (args.d_out_bf16 != nullptr && kernel != AttentionKernel::Flash)
    throw Error(Error::Kind::Value, "kernel: a backward on bf16 operands (d_out_bf16) runs on flash only");
  switch (kernel) {
    case AttentionKernel::Reference:
      return attention_backward_reference(args);
    case AttentionKernel::Flash:
      if constexpr (std::is_same_v<T, float>) return attention_backward_flash(args);
      [[fallthrough]];
    default:
      return attention_backward_materialized(args);
  }
}

template void run_attention_backward<float>(const AttentionBackwardArgs<float>&, AttentionKernel);
template void run_attention_backward<double>(const AttentionBackwardArgs<double>&, AttentionKernel);

// The backward's kernel is resolved as the forward's (the forward stored no
// weights: it saved the lse), so Auto is flash for float, materialized else.
template <class T>
void attention_backward(const AttentionBackwardArgs<T>& args, AttentionKernel requested) {
  run_attention_backward(args, resolve_forward_kernel<T>(requested, false));
}

template void attention_backward<float>(const AttentionBackwardArgs<float>&, AttentionKernel);
template void attention_backward<double>(const AttentionBackwardArgs<double>&, AttentionKernel);

}  // namespace multihead::detail
