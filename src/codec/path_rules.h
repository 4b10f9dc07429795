// Path rules of docs/format.md §2.2, shared by the index parser and the writer. Pure: no I/O.
//
// A prefix tree that rejects the same path twice, a path that is both a tensor and a prefix of
// another, and string and integer keys mixed at one level.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "tensorizer/error.h"
#include "tensorizer/tensor_path.h"

namespace tensorizer::codec {

class PathRules {
 public:
  // Throws Error(code, label + reason) when `path` breaks a rule; otherwise records it.
  void add(const TensorPath& path, const std::string& label, ErrorCode code);
  // Would add() accept `path`? (Does not record it.)
  void check(const TensorPath& path, const std::string& label, ErrorCode code) const;

 private:
  struct Node {
    bool leaf = false;
    std::map<std::string, std::unique_ptr<Node>> str_children;
    std::map<uint64_t, std::unique_ptr<Node>> int_children;
  };
  Node root_;
};

}  // namespace tensorizer::codec
