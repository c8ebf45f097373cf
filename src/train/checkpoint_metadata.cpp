// src/train/checkpoint_metadata.cpp: train/checkpoint_metadata.hpp.
#include "train/checkpoint_metadata.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace multihead::train {

std::string exact(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

void bad_file(const std::string& path, Error::Kind kind, const std::string& what) {
  throw Error(kind, "'" + path + "': " + what);
}

void write_model_config(const ModelConfig& c, std::map<std::string, std::string>& out) {
  out["vocabulary"] = std::to_string(c.vocabulary);
  out["sequence_length"] = std::to_string(c.sequence_length);
  out["d_model"] = std::to_string(c.d_model);
  out["heads"] = std::to_string(c.heads);
  out["layers"] = std::to_string(c.layers);
  out["ff"] = std::to_string(c.ff);
  out["dropout"] = exact(c.dropout);
  out["causal"] = c.causal ? "true" : "false";
}

void MetadataReader::fail(const std::string& what) const {
  bad_file(path_, Error::Kind::Format, noun_ + " metadata " + what);
}

const std::string& MetadataReader::text(const std::string& key) const {
  const auto it = file_.metadata.find(key);
  if (it == file_.metadata.end()) fail("lacks '" + key + "'");
  return it->second;
}

int64_t MetadataReader::integer(const std::string& key) const {
  const std::string& s = text(key);
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE)
    fail("'" + key + "': expected an integer, got '" + s + "'");
  return v;
}

uint64_t MetadataReader::unsigned_integer(const std::string& key) const {
  const std::string& s = text(key);
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || s[0] == '-' || end != s.c_str() + s.size() || errno == ERANGE)
    fail("'" + key + "': expected an unsigned integer, got '" + s + "'");
  return v;
}

double MetadataReader::number(const std::string& key) const {
  const std::string& s = text(key);
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE)
    fail("'" + key + "': expected a number, got '" + s + "'");
  return v;
}

bool MetadataReader::boolean(const std::string& key) const {
  const std::string& s = text(key);
  if (s != "true" && s != "false") fail("'" + key + "': expected true or false, got '" + s + "'");
  return s == "true";
}

ModelConfig MetadataReader::model_config() const {
  ModelConfig c;
  c.vocabulary = integer("vocabulary");
  c.sequence_length = integer("sequence_length");
  c.d_model = integer("d_model");
  c.heads = integer("heads");
  c.layers = integer("layers");
  c.ff = integer("ff");
  c.dropout = number("dropout");
  c.causal = boolean("causal");
  return c;
}

}  // namespace multihead::train
