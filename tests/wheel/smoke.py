"""Smoke test of an installed wheel (run by scripts/test-wheel.sh inside a throwaway venv, with the
servers of scripts/with-servers.sh): the libraries it loads come from the wheel or the base
system, and it saves, loads, verifies (CLI) and loads over HTTP, S3 and Redis."""

import os
import pathlib
import subprocess
import sys
import tempfile
import time
import uuid

import torch

start = time.monotonic()
import tensorizer  # noqa: E402
from tensorizer import TensorDeserializer, TensorSerializer, _C, stream_io  # noqa: E402

# Libraries a manylinux wheel may take from the base system (the policy's list, the ones we use).
BASE_SYSTEM = (
    "libc.so",
    "libm.so",
    "libstdc++.so",
    "libgcc_s.so",
    "libpthread.so",
    "libdl.so",
    "librt.so",
    "ld-linux",
    "libresolv.so",
    "libz.so",
    "linux-vdso",
)


def check_libraries(binary: str, wheel_libs: pathlib.Path) -> None:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        name, _, where = line.strip().partition(" => ")
        assert "not found" not in line, f"{binary}: {line.strip()}"
        path = where.split(" (")[0] if where else name.split(" (")[0]
        inside = os.path.realpath(path).startswith(os.path.realpath(wheel_libs) + os.sep)
        assert inside or os.path.basename(path).startswith(BASE_SYSTEM), f"{binary} loads {path} from outside the wheel"


package = pathlib.Path(tensorizer.__file__).parent
assert "site-packages" in str(package), package  # the wheel, not a source tree
cli = os.path.join(os.path.dirname(sys.executable), "tensorizer")  # the venv's, whatever PATH says
assert os.access(cli, os.X_OK), f"{cli} is missing"
wheel_libs = package.parent / "tensorizer.libs"
check_libraries(_C.__file__, wheel_libs)
# libcurl is not the extension's: it comes with the module the extension loads it through.
needed = subprocess.run(["readelf", "-d", _C.__file__], capture_output=True, text=True, check=True).stdout
assert "libcurl" not in needed, f"{_C.__file__} links libcurl"
check_libraries(str(package / "libtensorizer_curl.so"), wheel_libs)
check_libraries(str(package.parent / "tensorizer.scripts" / "tensorizer"), wheel_libs)

version = subprocess.run([cli, "--version"], capture_output=True, text=True, check=True).stdout.strip()
assert version == tensorizer.__version__, (version, tensorizer.__version__)

sd = {"w": torch.arange(1 << 16, dtype=torch.float32).reshape(256, 256), "b": torch.ones(7, dtype=torch.bfloat16)}
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "m.tensors")
    s = TensorSerializer(path)
    s.write_state_dict(sd)
    s.close()
    with TensorDeserializer(path, verify_hash=True) as d:
        assert all(torch.equal(d[k], v) for k, v in sd.items())
    first_load_s = time.monotonic() - start
    subprocess.run([cli, "verify", path], check=True, capture_output=True)

    http = os.environ["TZ_TEST_HTTP_URL"] + "/fixtures/dtypes.tensors"
    with TensorDeserializer(http) as d:
        assert len(d) > 0
    s3 = dict(
        s3_access_key_id="testing",
        s3_secret_access_key="testing",
        s3_endpoint=os.environ["TZ_TEST_S3_ENDPOINT"],
        force_http=True,
    )
    uri = f"s3://{os.environ['TZ_TEST_S3_BUCKET']}/wheel-{uuid.uuid4().hex}.tensors"
    with stream_io.open_stream(uri, "wb", **s3) as f:
        s = TensorSerializer(f)
        s.write_state_dict(sd)
        s.close()
    with TensorDeserializer(stream_io.open_stream(uri, **s3)) as d:
        assert all(torch.equal(d[k], v) for k, v in sd.items())
    redis = f"{os.environ['TZ_TEST_REDIS_URL']}/wheel-{uuid.uuid4().hex}"
    s = TensorSerializer(redis)
    s.write_state_dict(sd)
    s.close()
    with TensorDeserializer(redis) as d:
        assert all(torch.equal(d[k], v) for k, v in sd.items())

print(
    f"wheel smoke test passed: tensorizer {version}; import to first verified load {first_load_s:.2f} s",
    file=sys.stderr,
)
