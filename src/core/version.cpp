// src/core/version.cpp: the library's run-time version string.
#include "multihead/version.hpp"

namespace multihead {

const char* version() { return MULTIHEAD_VERSION_STRING; }

}  // namespace multihead
