// src/core/parameters.hpp: what the modules do with their parameter tables
// (for_each_parameter, multihead/parameter_table.hpp), written once for
// MultiheadAttention and GroupedQueryAttention alike: check, list, load and
// update. Messages name the parameter, the expected and the actual value.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "core/check.hpp"
#include "multihead/error.hpp"
#include "multihead/parameter_table.hpp"
#include "multihead/tensor.hpp"

namespace multihead::detail {

// A new value of a module's parameters token: unique in the process, so a
// forward context never matches a module (or parameter values) it was not
// filled by. One counter for every module type.
inline uint64_t new_parameters_token() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

// A parameter the configuration has must be there at its shape; one it does
// not have must be absent (an empty tensor of no shape).
template <class T>
void expect_parameter(const ParameterInfo& info, const Tensor<T>& t) {
  if (info.present) {
    if (t.empty() && t.shape().empty())
      throw Error(Error::Kind::Missing,
                  std::string(info.name) + ": missing; expected shape " + shape_to_string(info.shape));
    expect_shape(info.name, t.shape(), info.shape);
  } else if (!t.shape().empty()) {
    throw Error(Error::Kind::Value, std::string(info.name) + ": unexpected tensor of shape " +
                                        shape_to_string(t.shape()) + " (" + info.absent_because + ")");
  }
}

template <class Config, class Params>
void check_parameters(const Config& config, const Params& p) {
  for_each_parameter(config, p, [](const ParameterInfo& info, const auto& t) { expect_parameter(info, t); });
}

// The parameters this configuration has, by name (state_dict()).
template <class T, class Config, class Params>
std::map<std::string, Tensor<T>> parameter_map(const Config& config, const Params& p) {
  std::map<std::string, Tensor<T>> d;
  for_each_parameter(config, p, [&](const ParameterInfo& info, const Tensor<T>& t) {
    if (info.present) d.emplace(info.name, t);
  });
  return d;
}

// "a, b, c": the names this configuration has, in table order.
template <class Config>
std::string present_names(const Config& config) {
  std::string list;
  for_each_parameter(config, [&](const ParameterInfo& info) {
    if (info.present) list += (list.empty() ? "" : ", ") + std::string(info.name);
  });
  return list;
}

// load_state_dict(strict = true): every row takes the tensor under its name
// (a copy that owns its values) or becomes absent; a name no row has is
// refused, naming `module`. check_parameters then names a missing, misshapen
// or unwanted one.
template <class T, class Config, class Params>
void parameters_from_map(const Config& config, Params& p, const std::map<std::string, Tensor<T>>& state_dict,
                         const char* module) {
  std::size_t known = 0;
  for_each_parameter(config, p, [&](const ParameterInfo& info, Tensor<T>& t) {
    const auto it = state_dict.find(info.name);
    t = it == state_dict.end() ? Tensor<T>() : Tensor<T>(it->second);
    known += it != state_dict.end();
  });
  if (known != state_dict.size())
    for (const auto& entry : state_dict) {
      const std::string& name = entry.first;  // not a structured binding: the lambda captures it
      bool found = false;
      for_each_parameter(config, [&](const ParameterInfo& info) { found = found || name == info.name; });
      if (!found)
        throw Error(Error::Kind::Format, name + ": unexpected tensor in a " + module +
                                             " state_dict (expected names: " + present_names(config) + ")");
    }
  check_parameters(config, p);
}

// update_parameters: update(name, tensor) for every parameter the
// configuration has, in state_dict()'s order (by name), each left owning
// its values (a view's buffer may go away); then the shapes are checked.
template <class T, class Config, class Params>
void update_present(const Config& config, Params& p,
                    const std::function<void(const std::string& name, Tensor<T>& parameter)>& update) {
  std::map<std::string, Tensor<T>*> by_name;
  for_each_parameter(config, p, [&](const ParameterInfo& info, Tensor<T>& t) {
    if (info.present) by_name.emplace(info.name, &t);
  });
  for (auto& [name, tensor] : by_name) {
    update(name, *tensor);
    if (tensor->is_view()) *tensor = Tensor<T>(*tensor);
  }
  check_parameters(config, p);
}

}  // namespace multihead::detail
