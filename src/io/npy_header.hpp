// src/io/npy_header.hpp: the header of a .npy file, a Python dict literal
// such as "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }".
// NumPy reads it with ast.literal_eval; we accept the subset any writer
// produces (see parse_npy_header).
#pragma once

#include <string>
#include <string_view>

#include "multihead/tensor.hpp"

namespace multihead::detail {

struct NpyHeader {
  std::string descr;  // e.g. "<f4"
  bool fortran_order = false;
  Shape shape;  // dimensions as written; may be negative
};

// Parses the dict literal. Keys 'descr', 'fortran_order' and 'shape' must
// each appear exactly once, in any order, and no other key may (NumPy's
// format.py rule). Throws Error(Format) starting with `name`.
NpyHeader parse_npy_header(std::string_view text, const std::string& name);

}  // namespace multihead::detail
