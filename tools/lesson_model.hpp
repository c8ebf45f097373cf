// tools/lesson_model.hpp: the trained model that `multihead demo` and
// `multihead explain` read, the shipped one (models/lesson-heads.safetensors,
// compiled in by tools/CMakeLists.txt) or the --model file.
#pragma once

#include <string>

#include "multihead/lesson_tasks.hpp"
#include "multihead/trained_model.hpp"

namespace multihead::cli {

// The shipped model when `path` is empty, else the model or checkpoint at
// `path`. Throws multihead::Error (--model: …) for a model of another task
// or vocabulary than `task`'s.
TrainedModel load_lesson_model(const std::string& path, const LessonTask& task);

}  // namespace multihead::cli
