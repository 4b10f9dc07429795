"""Loads from several threads at once: separate deserializers over one file on every local route,
and one lazy deserializer shared by threads, give every tensor's exact values."""

import random
import threading

import pytest
import torch

from conftest import save_state_dict
from tensorizer import TensorDeserializer


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    torch.manual_seed(0)
    sd = {f"t{i}": torch.randn(1000 + 37 * i, 64).to(torch.float16) for i in range(24)}
    path = tmp_path_factory.mktemp("concurrent") / "model.tensors"
    save_state_dict(path, sd)
    return str(path), sd


def run_threads(targets):
    """Runs each callable on its own thread; returns the exceptions they raised."""
    errors = []

    def guarded(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - every failure is reported by the test
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(fn,)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a loading thread hung"
    return errors


def test_deserializers_on_every_route_load_one_file_at_once(saved):
    path, sd = saved

    def load(kwargs):
        def run():
            for _ in range(3):
                with TensorDeserializer(path, **kwargs) as d:
                    assert set(d.keys()) == set(sd)
                    for name, value in sd.items():
                        assert torch.equal(d[name], value), (kwargs, name)

        return run

    routes = [{}, {"mmap": False}, {"verify_hash": True}, {"lazy_load": True}, {"num_readers": 1}]
    assert run_threads([load(kw) for kw in routes]) == []


def test_one_lazy_deserializer_shared_by_threads_gives_each_tensor_once(saved):
    """Threads released together ask for the same tensors in the same order, so that first loads
    race: each must get the exact values and every thread the one object the deserializer keeps."""
    path, sd = saved
    names = sorted(sd)
    with TensorDeserializer(path, lazy_load=True, verify_hash=True) as shared:
        start = threading.Barrier(4)
        got = [dict() for _ in range(4)]

        def reader(k):
            def run():
                start.wait()
                for name in names + random.Random(k).sample(names, len(names)):
                    tensor = shared[name]
                    assert torch.equal(tensor, sd[name]), name
                    got[k].setdefault(name, tensor)

            return run

        assert run_threads([reader(k) for k in range(4)]) == []
        for name in names:
            assert all(g[name] is shared[name] for g in got), name
