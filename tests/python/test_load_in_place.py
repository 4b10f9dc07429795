"""load_into_module into a module whose tensors are already materialized on the target device
(docs: TensorDeserializer.load_into_module): with lazy_load=True the engine reads straight into
the module's own memory (GPU, the staging route on CPU, or CPU with mmap=False), so the module
keeps its Parameter objects and no second copy is allocated; meta tensors, mismatched shapes or
dtypes, and casts still get new tensors registered."""

import subprocess
import sys
import textwrap

import pytest
import torch

from tensorizer import TensorDeserializer, TensorSerializer

HAS_CUDA = torch.cuda.is_available()


def model(seed=0, device="cpu"):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.LayerNorm(48), torch.nn.Linear(48, 8))
    m.register_buffer("steps", torch.arange(5))
    return m.to(device)


@pytest.fixture(
    params=[
        pytest.param(("cpu", {"mmap": False}), id="cpu-copy"),
        pytest.param(("cpu", {"staged": True}), id="cpu-staged"),
        pytest.param(("cuda", {}), id="cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")),
    ]
)
def route(request, monkeypatch):
    device, opts = request.param[0], dict(request.param[1])
    if opts.pop("staged", False):
        monkeypatch.setenv("TENSORIZER_STAGED", "1")
    return device, opts


def test_a_materialized_module_is_loaded_in_place(tmp_path, route):
    device, opts = route
    source = model(seed=1)
    with TensorSerializer(str(tmp_path / "m.tensors")) as s:
        s.write_module(source)
    target = model(seed=2, device=device)
    before = {n: (t, t.data_ptr()) for n, t in list(target.named_parameters()) + list(target.named_buffers())}
    with TensorDeserializer(tmp_path / "m.tensors", device=device, lazy_load=True, **opts) as d:
        assert d.load_into_module(target) == len(before)
        assert set(d._loaded_via.values()) == {"in-place"}
    now = dict(list(target.named_parameters()) + list(target.named_buffers()))
    for name, (tensor, ptr) in before.items():
        assert now[name].data_ptr() == ptr, name
        if isinstance(tensor, torch.nn.Parameter):
            assert now[name] is tensor, name
        assert torch.equal(now[name].cpu(), source.state_dict()[name]), name


def test_mismatches_meta_tensors_and_casts_get_new_tensors(tmp_path, route):
    device, opts = route
    source = model(seed=1)
    with TensorSerializer(str(tmp_path / "m.tensors")) as s:
        s.write_module(source)
    target = model(seed=2, device=device)
    target[0].weight = torch.nn.Parameter(torch.zeros(48, 64, device=device, dtype=torch.float64))  # dtype differs
    target[1].weight = torch.nn.Parameter(torch.zeros(48, device="meta"))
    target[2].bias = torch.nn.Parameter(torch.zeros(4, device=device))  # shape differs
    with TensorDeserializer(tmp_path / "m.tensors", device=device, lazy_load=True, **opts) as d:
        d.load_into_module(target)
        via = {p[0]: v for p, v in d._loaded_via.items()}
    assert via["0.weight"] != "in-place" and via["1.weight"] != "in-place" and via["2.bias"] != "in-place"
    assert via["0.bias"] == "in-place"
    for name, tensor in source.state_dict().items():
        assert torch.equal(target.state_dict()[name].cpu(), tensor), name
    cast = model(seed=2, device=device)
    with TensorDeserializer(tmp_path / "m.tensors", device=device, lazy_load=True, dtype=torch.float16, **opts) as d:
        d.load_into_module(cast)
        assert "in-place" not in d._loaded_via.values()
    assert cast[0].weight.dtype == torch.float16


def test_tied_weights_are_loaded_into_once(tmp_path):
    source = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    source[1].weight = source[0].weight
    with TensorSerializer(str(tmp_path / "m.tensors")) as s:
        s.write_module(source)
    target = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    target[1].weight = target[0].weight
    with TensorDeserializer(tmp_path / "m.tensors", device="cpu", lazy_load=True, mmap=False) as d:
        d.load_into_module(target)
    assert torch.equal(target[0].weight, source[0].weight) and torch.equal(target[1].weight, source[0].weight)


PEAK = textwrap.dedent(
    """
    import resource, sys, torch
    from tensorizer import TensorDeserializer
    m = torch.nn.ModuleList(torch.nn.Linear(4096, 4096, bias=False) for _ in range(8))  # 512 MiB
    for p in m.parameters():
        p.data.fill_(0.5)  # every page touched: committed before the load
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with TensorDeserializer(sys.argv[1], device="cpu", lazy_load=True, mmap=False) as d:
        d.load_into_module(m)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert all(torch.equal(p, torch.full_like(p, 2.0)) for p in m.parameters())
    print((after - before) // 1024)
    """
)


def test_loading_in_place_allocates_no_second_copy(tmp_path):
    m = torch.nn.ModuleList(torch.nn.Linear(4096, 4096, bias=False) for _ in range(8))
    for p in m.parameters():
        p.data.fill_(2.0)
    with TensorSerializer(str(tmp_path / "m.tensors")) as s:
        s.write_module(m)
    del m
    run = subprocess.run([sys.executable, "-c", PEAK, str(tmp_path / "m.tensors")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    grown_mib = int(run.stdout.strip())
    assert grown_mib < 64, f"peak RSS grew by {grown_mib} MiB during a 512 MiB load in place"
