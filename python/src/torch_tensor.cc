// torch tensors over memory the engine owns, one DLPack capsule each, handed straight to torch's
// C importer (torch._C._from_dlpack): a load returns hundreds of tensors, and nanobind's generic
// ndarray conversion (an ndarray object, then torch.utils.dlpack.from_dlpack in Python) cost about
// 10 us a tensor, a quarter of a warm model load.
#include <Python.h>

#include <memory>
#include <utility>
#include <vector>

#include "bindings.h"

namespace tzpy {
namespace {

// DLManagedTensor (dlpack.h), with what keeps the shape and the bytes alive behind it.
struct ManagedTensor {
  nb::dlpack::dltensor tensor;
  void* manager_ctx = nullptr;
  void (*deleter)(ManagedTensor*) = nullptr;
  std::vector<int64_t> shape;
  std::shared_ptr<void> owner;
};

constexpr const char* kUnused = "dltensor";  // a consumer renames the capsule once it took it

void delete_managed(ManagedTensor* m) { delete m; }

// A capsule torch never took still owns its tensor.
void delete_unused_capsule(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kUnused)) return;
  delete_managed(static_cast<ManagedTensor*>(PyCapsule_GetPointer(capsule, kUnused)));
}

// torch._C._from_dlpack, looked up once and kept for the life of the process (never released:
// releasing it at exit would run after the interpreter is gone).
PyObject* from_dlpack() {
  static PyObject* fn = [] {
    nb::object f = nb::module_::import_("torch._C").attr("_from_dlpack");
    return f.release().ptr();
  }();
  return fn;
}

}  // namespace

nb::object torch_tensor_over(void* data, const std::vector<size_t>& shape, nb::dlpack::dtype dtype,
                             std::shared_ptr<void> owner) {
  auto* m = new ManagedTensor;
  m->shape.assign(shape.begin(), shape.end());
  m->owner = std::move(owner);
  m->deleter = delete_managed;
  m->tensor.data = data;
  m->tensor.device = {static_cast<int32_t>(nb::device::cpu::value), 0};
  m->tensor.ndim = static_cast<int32_t>(m->shape.size());
  m->tensor.dtype = dtype;
  m->tensor.shape = m->shape.data();  // strides null: compact, row-major
  PyObject* capsule = PyCapsule_New(m, kUnused, delete_unused_capsule);
  if (!capsule) {
    delete m;
    throw nb::python_error();
  }
  nb::object c = nb::steal(capsule);
  PyObject* t = PyObject_CallOneArg(from_dlpack(), c.ptr());
  if (!t) throw nb::python_error();
  return nb::steal(t);
}

}  // namespace tzpy
