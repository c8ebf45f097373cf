// multihead/parameter_table.hpp: what one row of a module's parameter table
// says. Each module writes its table once (multihead_attention.hpp,
// grouped_query_attention.hpp) and everything that lists its parameters
// visits it through for_each_parameter: validation, state_dict,
// load_state_dict, update_parameters, loading a file, the backward's
// gradient shapes, the finiteness check and the Python bindings, as
// gemma.cpp's ForEachTensor feeds its loaders and its gradients.
//
//   for_each_parameter(config, fn)                 fn(const ParameterInfo&)
//   for_each_parameter(config, params, fn)         fn(info, Tensor<T>&)  (const or not)
//   for_each_parameter(config, params, other, fn)  fn(info, Tensor<A>&, Tensor<B>&)
//
// Every row is visited, present or not, in the module's state_dict order
// (PyTorch's for MultiheadAttention, Hugging Face's for the grouped-query
// module); callers that want what a configuration has test info.present.
#pragma once

#include "multihead/tensor.hpp"

namespace multihead {

struct ParameterInfo {
  const char* name;            // the state_dict name, e.g. "in_proj_weight", "o_proj.bias"
  Shape shape;                 // its shape under this configuration
  bool present;                // whether this configuration has the parameter
  const char* absent_because;  // why not, when !present ("" when present)
};

}  // namespace multihead
