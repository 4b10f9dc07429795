// Path rules of docs/format.md §2.2, shared by the index parser and the writer. Pure: no I/O.
//
// A prefix tree that rejects the same path twice, a path that is both a tensor and a prefix of
// another, and string and integer keys mixed at one level.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "tensorizer/error.h"
#include "tensorizer/tensor_path.h"

namespace tensorizer::codec {

class PathRules {
 public:
  // What an error calls the path, made only when there is an error (an index parse adds hundreds).
  using Label = std::function<std::string()>;
  // Throws Error(code, label() + reason) when `path` breaks a rule; otherwise records it.
  void add(const TensorPath& path, const Label& label, ErrorCode code);
  // Would add() accept `path`? (Does not record it.)
  void check(const TensorPath& path, const Label& label, ErrorCode code) const;

 private:
  struct Node {
    bool leaf = false;
    std::map<std::string, std::unique_ptr<Node>> str_children;
    std::map<uint64_t, std::unique_ptr<Node>> int_children;
  };
  Node root_;
};

}  // namespace tensorizer::codec
