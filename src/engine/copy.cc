// copy_object: streams one object from any Source to any Sink (tensorizer cp, to_redis).
//
// The object is cut into chunks (16 MiB, or the source's preferred read size) run on the worker
// pool, each worker with its own clone of the source and one chunk buffer, writing at the same
// offsets into the sink (which takes concurrent writes of disjoint ranges). Memory: workers x
// chunk, whatever the object size. The calling thread is worker 0 and reports progress between its
// chunks. The sink is committed only when every byte arrived; on any error it is aborted. A sink
// that stores parts (Redis) is told them from the source's own index (object_parts).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

#include "common/worker_pool.h"
#include "tensorizer/error.h"
#include "tensorizer/format.h"
#include "tensorizer/reader.h"
#include "tensorizer/safetensors.h"
#include "tensorizer/transport.h"

namespace tensorizer {

uint64_t copy_object(const std::string& src, const std::string& dst,
                     const TransportOptions& options, int workers,
                     const std::function<void(uint64_t, uint64_t)>& progress) {
  std::unique_ptr<Source> source = open_source(src, options);
  const uint64_t chunk =
      source->preferred_read_bytes() ? source->preferred_read_bytes() : 16ull << 20;
  const uint64_t size = source->size();
  std::unique_ptr<Sink> sink = open_sink(dst, options);
  try {
    sink->reserve(size);
    const uint64_t chunks = (size + chunk - 1) / chunk;
    workers = static_cast<int>(
        std::max<uint64_t>(1, std::min<uint64_t>(readers_for(*source, workers), chunks)));
    const size_t buffer_bytes = static_cast<size_t>(std::min(chunk, std::max<uint64_t>(size, 1)));
    std::vector<std::unique_ptr<Source>> clones;
    std::vector<std::unique_ptr<char[]>> buffers(static_cast<size_t>(workers));
    for (int i = 1; i < workers; ++i) clones.push_back(source->clone());
    std::atomic<uint64_t> done{0};
    auto last_report = std::chrono::steady_clock::now();
    parallel_for_workers(static_cast<size_t>(chunks), workers, [&](size_t i, int w) {
      Source& s = w == 0 ? *source : *clones[static_cast<size_t>(w) - 1];
      std::unique_ptr<char[]>& buf = buffers[static_cast<size_t>(w)];
      if (!buf) buf.reset(new char[buffer_bytes]);
      const uint64_t off = i * chunk, len = std::min(chunk, size - off);
      s.read_at(off, buf.get(), static_cast<size_t>(len));
      sink->write_at(off, buf.get(), static_cast<size_t>(len));
      done += len;
      const auto now = std::chrono::steady_clock::now();
      if (w == 0 && progress && now - last_report >= std::chrono::milliseconds(250)) {
        last_report = now;
        progress(done.load(), size);
      }
    });
    if (sink->wants_parts()) {
      ReaderOptions inspect;
      inspect.without_key = true;  // the parts are in the clear index, encrypted or not
      std::unique_ptr<Reader> index = Reader::open(source->clone(), inspect);
      if (index->format() == FileFormat::kSafetensors) {
        std::vector<NamedRange> tensors;
        for (const IndexEntry& e : index->entries())
          tensors.push_back({e.name, e.data_offset, e.data_length});
        sink->set_parts(safetensors_parts(kSafetensorsLengthSize + index->header().index_size,
                                          std::move(tensors)));
      } else {
        sink->set_parts(object_parts(index->header(), index->entries()));
      }
    }
    sink->commit();
    if (progress) progress(size, size);
  } catch (...) {
    sink->abort();
    throw;
  }
  return size;
}

}  // namespace tensorizer
