"""multihead: torch.nn.MultiheadAttention on the CPU, from NumPy arrays.

The C++ library `multihead` through pybind11 (the extension `_multihead`):

    import multihead
    mha = multihead.MultiheadAttention(embed_dim=64, num_heads=8)
    out, weights = mha(query, key, value)          # NumPy arrays in and out

- MultiheadAttention: torch.nn.MultiheadAttention's arguments, forward,
  state_dict() and load_state_dict(); training: forward_with_context(),
  backward(context, d_output) -> gradients, update_parameters(update).
- scaled_dot_product_attention: torch.nn.functional's (PyTorch 2.x);
  training: scaled_dot_product_attention_with_context(), then
  scaled_dot_product_attention_backward(context, d_output).
- GroupedQueryAttention: grouped-query attention (Llama's layout, RoPE),
  in MultiheadAttention's dialect; KVCache and forward(x, cache=...) for
  step-by-step decoding.
- rotary_embedding (both conventions, a position offset),
  sinusoidal_positions, alibi_slopes.
- load_weights / save_weights: safetensors files under PyTorch's names.
- Trainer (`multihead train`: a small encoder on a built-in task, progress
  callback, checkpoints), TrainedModel (evaluate with every layer's per-head
  weights, save/load), task_batch, task_names.
- explain (the HTML / text / bertviz report, as a string or a file) and
  inspect (what a safetensors or .npy file holds, as a dict).
- set_threads, simd_target_force, kernel_force, ...: process-wide switches
  (multihead/runtime.hpp); kept_storage, set_kept_storage_limit,
  release_kept_storage: the freed blocks kept for reuse (multihead/tensor.hpp).

C-contiguous float32/float64 arrays are read in place; other layouts and
dtypes are converted once. dtype="bfloat16" / "float16" (MultiheadAttention,
load_weights, scaled_dot_product_attention): 16-bit storage and compute, the
inputs uint16 bits (read in place), float32 (rounded to nearest even) or
float16 (float16 only); the output is the query's kind (docs/precision.md). Errors are ValueError (shapes, values: the
library's message names the tensor) or TypeError (dtypes; an argument of
the wrong type, count or name, in one line naming it: multihead/_arguments.py).
"""
from ._multihead import (  # noqa: F401
    ForwardContext,
    GroupedQueryAttention,
    GroupedQueryContext,
    KVCache,
    MultiheadAttention,
    TrainedModel,
    Trainer,
    __version__,
    _debug_last_call,
    alibi_slopes,
    blas_threads,
    explain,
    inspect,
    kernel_force,
    kernel_forced,
    load_weights,
    rotary_embedding,
    rotary_embedding_backward,
    save_weights,
    SdpaContext,
    scaled_dot_product_attention,
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_with_context,
    set_threads,
    kept_storage,
    set_kept_storage_limit,
    release_kept_storage,
    simd_target_current,
    simd_target_force,
    bf16_dot_force,
    bf16_dot_current,
    f16_gemm_force,
    f16_gemm_current,
    narrow_attention_force,
    narrow_attention_current,
    check_environment,
    simd_targets_available,
    sinusoidal_positions,
    task_batch,
    task_names,
    threads,
)

__all__ = [
    "MultiheadAttention",
    "ForwardContext",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_with_context",
    "scaled_dot_product_attention_backward",
    "SdpaContext",
    "GroupedQueryAttention",
    "GroupedQueryContext",
    "KVCache",
    "alibi_slopes",
    "rotary_embedding",
    "rotary_embedding_backward",
    "sinusoidal_positions",
    "Trainer",
    "TrainedModel",
    "task_batch",
    "task_names",
    "explain",
    "inspect",
    "load_weights",
    "save_weights",
    "set_threads",
    "threads",
    "kept_storage",
    "set_kept_storage_limit",
    "release_kept_storage",
    "blas_threads",
    "simd_targets_available",
    "simd_target_current",
    "simd_target_force",
    "bf16_dot_force",
    "bf16_dot_current",
    "f16_gemm_force",
    "f16_gemm_current",
    "narrow_attention_force",
    "narrow_attention_current",
    "kernel_force",
    "kernel_forced",
    "check_environment",
    "__version__",
]

# A mistyped MULTIHEAD_* variable fails here, in one ValueError naming it,
# as every command of the CLI fails: not in whichever call first reads it.
check_environment()

# pybind11's TypeError for an argument of the wrong type lists every
# signature and prints every argument (arrays in full): each public call
# says one line instead, naming the argument (multihead/_arguments.py).
from . import _arguments, _multihead  # noqa: E402

_arguments.wrap_module(globals(), __all__, _multihead)
