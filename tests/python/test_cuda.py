"""CUDA targets (skipped on machines without a GPU): loads land on the requested device with
the right dtype, and CUDA tensors can be written."""

import pytest
import torch

from tensorizer import TensorDeserializer, TensorSerializer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_load_to_cuda(tmp_path):
    sd = {"w": torch.randn(64, 64), "i": torch.arange(10), "h": torch.randn(3).to(torch.bfloat16)}
    with TensorSerializer(str(tmp_path / "c.tensors")) as s:
        s.write_state_dict(sd)
    for device in ("cuda", "cuda:0", torch.device("cuda", 0), None):
        with TensorDeserializer(tmp_path / "c.tensors", device=device, verify_hash=True) as d:
            for k, v in sd.items():
                assert d[k].device.type == "cuda" and torch.equal(d[k].cpu(), v), (device, k)
    with TensorDeserializer(tmp_path / "c.tensors", device="cuda", dtype=torch.float16, lazy_load=True) as d:
        assert d["w"].dtype == torch.float16 and d["i"].dtype == torch.float16
        with pytest.raises(RuntimeError, match="CPU"):
            list(d.read_numpy_arrays())


def test_write_cuda_tensors(tmp_path):
    m = torch.nn.Linear(8, 4).cuda()
    with TensorSerializer(str(tmp_path / "m.tensors")) as s:
        s.write_module(m)
    with TensorDeserializer(tmp_path / "m.tensors", device="cpu") as d:
        assert torch.equal(d[".weight"], m.weight.cpu())
