"""vLLM's tensorizer flow, call for call (docs/vllm-contract.md): serialize a model the way
`serialize_vllm_model` does, test it with `is_vllm_tensorized`, load it into a meta-device model
the way `deserialize_tensorizer_model` does, and load a LoRA-style adapter by path; with a random
key in a keyfile, with `%02d` per-rank files for 2 ranks, over a local file, HTTP and S3.

The module tests the contract, not our reading of it: it imports nothing of this project, and
`test_the_reference_passes_this_module_too` runs it again under the reference tensorizer
(.venv-ref) as a subprocess, where every test must pass as well."""

import json
import os
import re
import subprocess
import sys
import uuid

import pytest
import torch

import tensorizer
from tensorizer import DecryptionParams, EncryptionParams, TensorDeserializer, TensorSerializer
from tensorizer.stream_io import open_stream
from tensorizer.utils import convert_bytes, get_mem_usage, no_init_or_tensor  # noqa: F401 (vLLM imports it)

UNDER_REFERENCE = os.environ.get("TZ_VLLM_FLOW_UNDER_REFERENCE") == "1"
MARKER = "vllm_tensorized_marker"


# -- where files live -------------------------------------------------------------------------


def _server_env(*names):
    missing = [n for n in names if not os.environ.get(n)]
    if missing:
        msg = f"{', '.join(missing)} not set: run under scripts/with-servers.sh (make test does)"
        if os.environ.get("TZ_REQUIRE_SERVERS") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return [os.environ[n] for n in names]


class Place:
    """A directory URI the flow writes to and reads from, with vLLM's `stream_kwargs`."""

    def __init__(self, kind, tmp_path):
        self.kind = kind
        # vLLM passes its config's values, None when unset: None means the default chain.
        self.stream_kwargs = {"s3_access_key_id": None, "s3_secret_access_key": None, "s3_endpoint": None}
        name = f"vllm-{uuid.uuid4().hex}"
        if kind == "local":
            self.write_dir = self.read_dir = str(tmp_path / name)
            os.makedirs(self.write_dir)
        elif kind == "http":  # nginx serves what the test writes into its root
            url, root = _server_env("TZ_TEST_HTTP_URL", "TZ_TEST_HTTP_ROOT")
            self.write_dir, self.read_dir = os.path.join(root, name), f"{url}/{name}"
            os.makedirs(self.write_dir)
        else:
            endpoint, bucket = _server_env("TZ_TEST_S3_ENDPOINT", "TZ_TEST_S3_BUCKET")
            self.write_dir = self.read_dir = f"s3://{bucket}/{name}"
            self.stream_kwargs = {
                "s3_access_key_id": "testing",
                "s3_secret_access_key": "testing",
                "s3_endpoint": endpoint,
                "force_http": True,
            }

    def write_uri(self, name):
        return f"{self.write_dir}/{name}"

    def read_uri(self, name):
        return f"{self.read_dir}/{name}"


@pytest.fixture(params=["local", "http", "s3"])
def place(request, tmp_path):
    return Place(request.param, tmp_path)


# -- vLLM's functions, as its source calls tensorizer ------------------------------------------


def tiny_gpt2(seed, device=None):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=97, n_positions=16)
    torch.manual_seed(seed)
    if device is None:
        return GPT2LMHeadModel(config).eval()
    with torch.device(device):
        return GPT2LMHeadModel(config).eval()


def serialize_vllm_model(model, uri, stream_kwargs, encryption_key=None, serialization_kwargs=None):
    model.register_parameter(MARKER, torch.nn.Parameter(torch.tensor((1,), device="meta"), requires_grad=False))
    encryption_params = EncryptionParams(key=encryption_key) if encryption_key is not None else None
    with open_stream(uri, mode="wb+", **stream_kwargs) as stream:
        serializer = TensorSerializer(stream, encryption=encryption_params, **(serialization_kwargs or {}))
        serializer.write_module(model)
        serializer.close()
    del model.vllm_tensorized_marker


def is_vllm_tensorized(uri, stream_kwargs, deserialization_kwargs):
    deserializer = TensorDeserializer(open_stream(uri, **stream_kwargs), **deserialization_kwargs, lazy_load=True)
    return ".vllm_tensorized_marker" in deserializer  # never closed, as vLLM leaves it


def deserialize_tensorizer_model(model, uri, stream_kwargs, deserialization_kwargs, dtype):
    with (
        open_stream(uri, mode="rb", **stream_kwargs) as stream,
        TensorDeserializer(stream, dtype=dtype, device="cpu", **deserialization_kwargs) as deserializer,
    ):
        deserializer.load_into_module(model)
    total = deserializer.total_tensor_bytes
    deserializer.close()  # after the with: must be harmless
    assert isinstance(convert_bytes(total), str) and isinstance(get_mem_usage(), str)
    return total


def deserialization_kwargs_for(keyfile, stream_kwargs, **user):
    kwargs = {"verify_hash": None, "encryption": None, "num_readers": None, **user}
    if keyfile is not None:
        with open_stream(keyfile, **stream_kwargs) as f:
            kwargs["encryption"] = DecryptionParams.from_key(f.read())
    return kwargs


def logits(model):
    ids = torch.arange(12).reshape(2, 6) % 97
    with torch.no_grad():
        return model(ids).logits


def expect_loaded_like(loaded, original):
    state = loaded.state_dict()
    assert not [k for k, v in state.items() if v.is_meta], "tensors left on the meta device"
    assert MARKER in dict(loaded.named_parameters())  # a real, registered parameter on the root
    del loaded.vllm_tensorized_marker
    for name, tensor in original.state_dict().items():
        assert torch.equal(state[name], tensor), name
    assert torch.equal(logits(loaded), logits(original))


# -- the flows ----------------------------------------------------------------------------------


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
def test_serialize_check_and_load_into_a_meta_model(place, encrypted):
    keyfile = None
    if encrypted:  # tensorize_vllm_model: a random key written through open_stream
        keyfile = place.write_uri("model.key")
        with open_stream(keyfile, mode="wb+", **place.stream_kwargs) as f:
            f.write(EncryptionParams.random().key)
        with open_stream(keyfile, mode="rb", **place.stream_kwargs) as f:
            key = f.read()
    original = tiny_gpt2(seed=1)
    serialize_vllm_model(
        original,
        place.write_uri("model.tensors"),
        place.stream_kwargs,
        encryption_key=key if encrypted else None,
        serialization_kwargs={"limit_cpu_concurrency": 2},
    )
    with open_stream(place.write_uri("config.json"), mode="wb+", **place.stream_kwargs) as f:
        f.write(json.dumps({"model_type": "gpt2"}).encode())

    uri = place.read_uri("model.tensors")
    kwargs = deserialization_kwargs_for(keyfile and place.read_uri("model.key"), place.stream_kwargs)
    assert is_vllm_tensorized(uri, place.stream_kwargs, kwargs)
    assert is_vllm_tensorized(uri, place.stream_kwargs, kwargs)  # vLLM asks twice per load
    with open_stream(uri, **place.stream_kwargs):  # download_model's existence check
        pass

    model = tiny_gpt2(seed=2, device="meta")
    model.register_parameter(MARKER, torch.nn.Parameter(torch.tensor((1,), device="meta"), requires_grad=False))
    total = deserialize_tensorizer_model(model, uri, place.stream_kwargs, kwargs, dtype=torch.float32)
    assert total >= sum(t.numel() * t.element_size() for t in original.state_dict().values())
    expect_loaded_like(model, original)


def test_per_rank_files_for_two_ranks_with_one_keyfile(place):
    """`model-%02d.tensors`: rank r writes and reads only `uri % r`; one keyfile for both."""
    template = place.write_uri("model-%02d.tensors")
    assert re.search(r"%0\dd", template)
    key = EncryptionParams.random().key
    with open_stream(place.write_uri("model.key"), mode="wb+", **place.stream_kwargs) as f:
        f.write(key)
    originals = [tiny_gpt2(seed=10 + rank) for rank in range(2)]
    for rank, model in enumerate(originals):
        serialize_vllm_model(model, template % rank, place.stream_kwargs, encryption_key=key)
    kwargs = deserialization_kwargs_for(place.read_uri("model.key"), place.stream_kwargs, num_readers=2)
    for rank in range(2):
        uri = place.read_uri("model-%02d.tensors") % rank
        assert is_vllm_tensorized(uri, place.stream_kwargs, kwargs)
        model = tiny_gpt2(seed=0, device="meta")
        model.register_parameter(MARKER, torch.nn.Parameter(torch.tensor((1,), device="meta"), requires_grad=False))
        deserialize_tensorizer_model(model, uri, place.stream_kwargs, kwargs, dtype=torch.float32)
        expect_loaded_like(model, originals[rank])


def test_a_marker_check_left_open_holds_no_threads_and_maps_nothing(tmp_path):
    """is_vllm_tensorized runs twice per load and never closes its deserializer."""
    path = str(tmp_path / "model.tensors")
    serialize_vllm_model(tiny_gpt2(seed=5), path, {})
    kwargs = deserialization_kwargs_for(None, {}, num_readers=4)
    threads = set(os.listdir("/proc/self/task"))
    checks = [is_vllm_tensorized(path, {}, kwargs) for _ in range(20)]
    assert all(checks)
    # No thread started by the checks is left (threads of earlier work may have ended meanwhile).
    assert set(os.listdir("/proc/self/task")) <= threads
    with open("/proc/self/maps") as maps:
        assert path not in maps.read()


def test_a_file_written_without_the_marker_is_not_vllm_tensorized(place):
    """Files written with write_state_dict (HF-serialized) go through the CPU iterator."""
    sd = tiny_gpt2(seed=3).state_dict()
    with open_stream(place.write_uri("model.tensors"), mode="wb+", **place.stream_kwargs) as f:
        serializer = TensorSerializer(f)
        serializer.write_state_dict(sd)
        serializer.close()
    uri = place.read_uri("model.tensors")
    kwargs = deserialization_kwargs_for(None, place.stream_kwargs)
    assert not is_vllm_tensorized(uri, place.stream_kwargs, kwargs)
    # tensorizer_weights_iterator: a stream never closed, the state fed to load_weights.
    with TensorDeserializer(open_stream(uri, **place.stream_kwargs), **kwargs, device="cpu") as state:
        weights = dict(state.items())
    assert sorted(weights) == sorted(sd)
    assert all(torch.equal(weights[k], v) for k, v in sd.items())


def test_dtype_casts_every_non_bool_tensor(tmp_path):
    """vLLM passes dtype=model_config.dtype: integer and float tensors alike come back cast."""
    sd = {
        "w": torch.randn(4, 4),
        "q": torch.tensor([-3, 7], dtype=torch.int8),
        "ids": torch.arange(5),
        "mask": torch.tensor([True, False]),
    }
    path = str(tmp_path / "m.tensors")
    serializer = TensorSerializer(path)
    serializer.write_state_dict(sd)
    serializer.close()
    with TensorDeserializer(path, dtype=torch.float16, device="cpu") as d:
        assert {k: d[k].dtype for k in sd} == {
            "w": torch.float16,
            "q": torch.float16,
            "ids": torch.float16,
            "mask": torch.bool,
        }
        assert d["q"].tolist() == [-3.0, 7.0] and d["ids"].tolist() == [0, 1, 2, 3, 4]
        assert torch.equal(d["w"], sd["w"].half())
        assert [d[k].requires_grad for k in ("w", "q", "ids", "mask")] == [True, False, False, False]


def test_a_lora_adapter_by_path(place, monkeypatch):
    """tensorize_lora_adapter, then PEFTHelper.from_local_dir and LoRAModel.from_local_checkpoint
    (a str path or URI, not a stream; values moved with .to(device=, dtype=))."""
    g = torch.Generator().manual_seed(4)
    tensors = {
        f"base_model.model.h.{i}.attn.c_attn.lora_{ab}.weight": torch.randn(8, 32, generator=g)
        for i in range(2)
        for ab in "AB"
    }
    config = {"r": 8, "lora_alpha": 16, "target_modules": ["c_attn"]}
    with open_stream(place.write_uri("adapter_config.json"), mode="wb+", **place.stream_kwargs) as f:
        f.write(json.dumps(config).encode())
    with open_stream(place.write_uri("adapter_model.tensors"), mode="wb+", **place.stream_kwargs) as f:
        serializer = TensorSerializer(f)
        serializer.write_state_dict(tensors)
        serializer.close()

    with open_stream(place.read_uri("adapter_config.json"), mode="rb", **place.stream_kwargs) as f:
        assert json.load(f) == config
    if place.kind == "s3":  # a path opened by tensorizer itself finds credentials in the environment
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        monkeypatch.setenv("AWS_ENDPOINT_URL", place.stream_kwargs["s3_endpoint"])
    for dtype in (None, torch.bfloat16):
        d = TensorDeserializer(place.read_uri("adapter_model.tensors"), dtype=dtype, device="cpu", num_readers=None)
        assert sorted(d.keys()) == sorted(tensors)
        for name, value in d.items():
            moved = value.to(device="cpu", dtype=dtype)
            assert torch.equal(moved, tensors[name].to(dtype or torch.float32)), name


# -- what vLLM's own tests check ------------------------------------------------------------------


def test_stream_kwargs_and_bad_values(tmp_path):
    path = str(tmp_path / "m.tensors")
    serializer = TensorSerializer(path)
    serializer.write_state_dict({"w": torch.ones(3)})
    serializer.close()
    with pytest.raises(ValueError):
        TensorDeserializer(open_stream(path, mode="foo"), lazy_load=True)
    with pytest.raises(TypeError):
        TensorDeserializer(path, num_readers="bar")
    d = TensorDeserializer(path, verify_hash=None, num_readers=None, encryption=None)
    assert torch.equal(d["w"].cpu(), torch.ones(3))


def test_serialization_holds_the_classes_tensorizer_exports_and_init_is_patchable(tmp_path, monkeypatch):
    assert tensorizer.serialization.TensorSerializer is TensorSerializer
    assert tensorizer.serialization.TensorDeserializer is TensorDeserializer
    seen = {}
    original_init = tensorizer.serialization.TensorSerializer.__init__

    def spy(self, *args, **kwargs):
        seen.update(kwargs)
        original_init(self, *args, **kwargs)

    monkeypatch.setattr(tensorizer.serialization.TensorSerializer, "__init__", spy)
    serializer = TensorSerializer(str(tmp_path / "m.tensors"), limit_cpu_concurrency=4)
    serializer.write_state_dict({"w": torch.ones(2)})
    serializer.close()
    assert seen == {"limit_cpu_concurrency": 4}


# -- the same module under the reference ----------------------------------------------------------


def test_the_reference_passes_this_module_too():
    ref_python = os.path.join(os.path.dirname(__file__), "..", "..", ".venv-ref", "bin", "python")
    if not os.path.exists(ref_python):
        if os.environ.get("TZ_REQUIRE_REFERENCE") == "1":
            pytest.fail("no .venv-ref: run scripts/reference-venv.sh")
        pytest.skip("no .venv-ref (scripts/reference-venv.sh creates it)")
    run = subprocess.run(
        [ref_python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest", "-rs", __file__],
        env={**os.environ, "TZ_VLLM_FLOW_UNDER_REFERENCE": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and " failed" not in run.stdout and "skipped" not in run.stdout, run.stdout[-3000:]


if UNDER_REFERENCE:  # the reference's package, from the venv, never this project's
    assert os.path.realpath(tensorizer.__file__).startswith(os.path.realpath(sys.prefix)), tensorizer.__file__
    del test_the_reference_passes_this_module_too
