// Path rules (see path_rules.h). Pure: no I/O.
#include "codec/path_rules.h"

#include "tensorizer/error.h"

namespace tensorizer::codec {
namespace {

template <typename NodeT>
NodeT* child_of(NodeT* node, const PathComponent& c) {
  if (const auto* i = std::get_if<uint64_t>(&c)) {
    auto it = node->int_children.find(*i);
    return it == node->int_children.end() ? nullptr : it->second.get();
  }
  auto it = node->str_children.find(std::get<std::string>(c));
  return it == node->str_children.end() ? nullptr : it->second.get();
}

}  // namespace

void PathRules::check(const TensorPath& path, const Label& label, ErrorCode code) const {
  const Node* node = &root_;
  for (const auto& c : path.components) {
    if (node->leaf) fail(code, label() + ": a prefix of this path is itself a tensor");
    bool is_int = std::holds_alternative<uint64_t>(c);
    if ((is_int && !node->str_children.empty()) || (!is_int && !node->int_children.empty()))
      fail(code, label() + ": mixes string and integer keys at one level");
    node = child_of(node, c);
    if (!node) return;
  }
  if (node->leaf) fail(code, label() + ": duplicate tensor name");
  fail(code, label() + ": this path is a prefix of another tensor's path");
}

void PathRules::add(const TensorPath& path, const Label& label, ErrorCode code) {
  check(path, label, code);
  Node* node = &root_;
  for (const auto& c : path.components) {
    std::unique_ptr<Node>& next = std::holds_alternative<uint64_t>(c)
                                      ? node->int_children[std::get<uint64_t>(c)]
                                      : node->str_children[std::get<std::string>(c)];
    if (!next) next = std::make_unique<Node>();
    node = next.get();
  }
  node->leaf = true;
}

}  // namespace tensorizer::codec
