"""What `import tensorizer` loads, and what it leaves for first use.

libcurl is loaded on first remote use (src/transport/libcurl.h): a fresh process that imports
tensorizer and loads a local file has no libcurl mapped; its first HTTP load maps it, through
libtensorizer_curl.so next to the extension; without that module, a remote load raises an error
naming it while local loads still work. `tensorizer.torch_compat`, `tensorizer.safetensors` and
`tensorizer.utils` are imported on first use (a local load needs none of them), and reachable as
the reference's attributes and names."""

import os
import shutil
import subprocess
import sys

import tensorizer

from conftest import FIXTURES_ROOT
from test_remote import server_env

FIXTURE = FIXTURES_ROOT / "tensorizer-2.11.1" / "dtypes.tensors"

# Run in a fresh process: prints "import", "local" and "remote" with whether libcurl is mapped then.
SCRIPT = """
import sys
import tensorizer
from tensorizer import TensorDeserializer

def libcurl_mapped():
    with open("/proc/self/maps") as maps:
        return any(line.split()[-1].rsplit("/", 1)[-1].startswith("libcurl") for line in maps)

print("import", libcurl_mapped())
with TensorDeserializer(sys.argv[1], device="cpu") as d:
    print("local", len(d), libcurl_mapped())
try:
    with TensorDeserializer(sys.argv[2], device="cpu") as d:
        print("remote", len(d), libcurl_mapped())
except Exception as e:
    print("remote error", type(e).__name__, e)
"""


def run(url, env=None):
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(FIXTURE), url], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_libcurl_is_mapped_only_once_a_load_goes_over_http():
    (url,) = server_env("TZ_TEST_HTTP_URL")
    lines = run(f"{url}/fixtures/dtypes.tensors")
    n = len(tensorizer.TensorDeserializer(FIXTURE, device="cpu"))
    assert lines == ["import False", f"local {n} False", f"remote {n} True"]


def test_a_missing_libcurl_module_fails_remote_loads_by_name_and_leaves_local_loads(tmp_path):
    package = os.path.dirname(tensorizer.__file__)
    copy = tmp_path / "tensorizer"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("libtensorizer_curl.so", "__pycache__"))
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    # Nothing listens on port 9: the error must come from loading libcurl, before any connection.
    lines = run("http://127.0.0.1:9/model.tensors", env)
    n = len(tensorizer.TensorDeserializer(FIXTURE, device="cpu"))
    assert lines[:2] == ["import False", f"local {n} False"], lines
    assert lines[2].startswith("remote error OSError"), lines
    assert f"{copy}/libtensorizer_curl.so" in lines[2] and "reinstall tensorizer" in lines[2], lines


def test_submodules_are_imported_on_first_use():
    script = """
import sys
import tensorizer
lazy = ("tensorizer.torch_compat", "tensorizer.safetensors", "tensorizer.utils")
n = len(tensorizer.TensorDeserializer(sys.argv[1]))
print(n > 0, [m in sys.modules for m in lazy])
print({"torch_compat", "safetensors", "utils"} <= set(dir(tensorizer)))
print(callable(tensorizer.torch_compat.tensorizer_saving), [m in sys.modules for m in lazy])
from tensorizer.utils import convert_bytes, get_mem_usage, no_init_or_tensor
print(convert_bytes(1500), tensorizer.utils is sys.modules["tensorizer.utils"])
from tensorizer import safetensors
print(safetensors is tensorizer.safetensors is sys.modules["tensorizer.safetensors"])
ns = {}
exec("from tensorizer import *", ns)
print(ns["torch_compat"] is tensorizer.torch_compat, ns["utils"] is tensorizer.utils,
      ns["TensorDeserializer"] is tensorizer.TensorDeserializer)
try:
    tensorizer.no_such_name
except AttributeError as e:
    print(e)
"""
    out = subprocess.run([sys.executable, "-c", script, FIXTURE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "True [False, False, False]",
        "True",
        "True [True, False, False]",
        "1.5 KB True",
        "True",
        "True True True",
        "module 'tensorizer' has no attribute 'no_such_name'",
    ]


def test_objects_a_daemon_thread_still_reaches_at_exit_are_not_reported_as_leaks(tmp_path):
    # A server's daemon thread keeps its handler class alive, and through the class's functions the
    # module's globals, among them a serializer and a reader: they are alive when the extension is
    # torn down, which nanobind would report as leaked instances on stderr.
    script = """
import sys, threading
import torch
from tensorizer import TensorDeserializer, TensorSerializer

class Handler:
    def run(self):
        threading.Event().wait()

serializer = TensorSerializer(sys.argv[1])
serializer.write_state_dict({"a": torch.arange(5.0)})
serializer.close()
reader = TensorDeserializer(sys.argv[1], lazy_load=True)
threading.Thread(target=Handler().run, daemon=True).start()
print(reader["a"].tolist())
"""
    out = subprocess.run(
        [sys.executable, "-c", script, tmp_path / "m.tensors"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "[0.0, 1.0, 2.0, 3.0, 4.0]\n"
    assert out.stderr == ""
