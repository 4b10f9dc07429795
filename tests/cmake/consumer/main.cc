// Loads every tensor of a .tensors file into host memory with its hashes checked, through the
// installed library only; prints how many tensors and bytes.
#include <tensorizer/error.h>
#include <tensorizer/host_load.h>
#include <tensorizer/reader.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  try {
    auto reader = tensorizer::Reader::open(argv[1]);
    std::vector<size_t> all(reader->entries().size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    tensorizer::LoadOptions options;
    options.verify_hash = true;
    uint64_t bytes = 0;
    for (const auto& t : tensorizer::load_to_host(*reader, all, options)) bytes += t.size;
    std::printf("loaded %zu tensors, %llu bytes\n", all.size(),
                static_cast<unsigned long long>(bytes));
  } catch (const tensorizer::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
