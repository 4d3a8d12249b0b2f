"""CPU tests of cudamem_torch's interface check (no torch needed). Run by
torch-alloc/tests/python_module.rs under `cargo test`:

    python3 -m unittest discover -s python -p 'test_*.py'
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cudamem_torch  # noqa: E402

# A made-up header in the shape of PyTorch's: comments, templates with commas,
# overloads, a destructor, a base-class override and default bodies.
HEADER = """
namespace x {
struct Other { virtual void notMine(int a) = 0; };
class CUDAAllocator : public DeviceAllocator {
 public:
  virtual ~CUDAAllocator() = default;
  virtual void* raw_alloc(size_t nbytes) = 0;
  // virtual void commentedOut(int a) = 0;
  /* virtual void alsoCommented(); */
  virtual void beginAllocateToPool(
      c10::DeviceIndex device,
      MempoolId_t mempool_id,
      std::function<bool(cudaStream_t)> filter) = 0;
  virtual void recordAnnotation(
      const std::vector<std::pair<std::string, std::string>>& /*md*/) {}
  virtual void setUseOnOOM(c10::DeviceIndex device, MempoolId_t mempool_id, bool use_on_oom) {
    TORCH_CHECK(false, name(), " does not yet support setUseOnOOM.");
  }
  virtual void popCompileContext() {}
  void recordStream(const DataPtr& ptr, c10::Stream stream) override { recordStream(ptr, 1); }
  virtual std::string name() = 0;
};
}
"""

SOURCE = """
class Allocator final : public cca::CUDAAllocator {
  void* raw_alloc(size_t nbytes) override { return nullptr; }
  void beginAllocateToPool(c10::DeviceIndex d, MempoolId_t id,
                           std::function<bool(cudaStream_t)> filter) override {}
#if defined(CUDAMEM_HAS_setUseOnOOM) && CUDAMEM_HAS_setUseOnOOM == 3
  void setUseOnOOM(c10::DeviceIndex d, MempoolId_t id, bool on) override {}
#endif
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>&) override {}
  void popCompileContext() override {}
  std::string name() const final { return "x"; }
  // void commentedOut(int a) override {}
  void plain(int a) { call(a); }
};
"""


class InterfaceCheck(unittest.TestCase):
    def test_the_header_lists_its_own_virtuals_with_their_parameter_counts(self):
        self.assertEqual(
            cudamem_torch.header_virtuals(HEADER),
            {
                "raw_alloc": 1,
                "beginAllocateToPool": 3,
                "recordAnnotation": 1,
                "setUseOnOOM": 3,
                "popCompileContext": 0,
                "name": 0,
            },
        )

    def test_the_source_lists_what_it_overrides(self):
        self.assertEqual(
            cudamem_torch.source_overrides(SOURCE),
            {"raw_alloc", "beginAllocateToPool", "setUseOnOOM", "recordAnnotation",
             "popCompileContext", "name"},
        )

    def test_a_complete_backend_gets_a_define_per_virtual(self):
        defines = cudamem_torch.interface_defines(HEADER, SOURCE)
        self.assertIn("-DCUDAMEM_HAS_setUseOnOOM=3", defines)
        self.assertIn("-DCUDAMEM_HAS_popCompileContext=0", defines)
        self.assertEqual(len(defines), 6)

    def test_a_virtual_without_override_is_refused_by_name(self):
        header = HEADER.replace(
            "virtual std::string name() = 0;",
            "virtual std::string name() = 0;\n  virtual void setNoSplit(int d, MempoolId_t id) {}",
        )
        with self.assertRaises(cudamem_torch.InterfaceMismatch) as caught:
            cudamem_torch.interface_defines(header, SOURCE, "test.h")
        self.assertEqual(caught.exception.missing, ["setNoSplit"])
        self.assertIn("setNoSplit", str(caught.exception))
        self.assertIn("keeps PyTorch's allocator", str(caught.exception))

    def test_a_header_without_the_class_is_an_error(self):
        with self.assertRaises(ValueError):
            cudamem_torch.header_virtuals("class Other {};")

    def test_the_real_backend_overrides_every_virtual_it_guards(self):
        here = os.path.dirname(os.path.abspath(__file__))
        path = os.path.join(os.path.dirname(here), "torch-alloc", "cpp", "cudamem_allocator.cpp")
        with open(path) as f:
            overrides = cudamem_torch.source_overrides(f.read())
        for name in ("setUseOnOOM", "setNoSplit", "ensureExistsAndIncrefPool", "releasePool",
                     "getPoolUseCount", "createOrIncrefPool", "beginAllocateToPool",
                     "getCheckpointState", "setCheckpointPoolState", "shareIpcHandle",
                     "attachAllocatorTraceTracker", "enablePeerAccess", "memcpyAsync"):
            self.assertIn(name, overrides)


if __name__ == "__main__":
    unittest.main()
