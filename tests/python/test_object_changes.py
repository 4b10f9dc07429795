"""An object replaced during a load is an error or one whole version, never a mix.

A real HTTP server on loopback serves version 1 of a file for its first requests and version 2
(same layout, other values) after, the way a model re-uploaded mid-load looks to a reader. With an
ETag or Last-Modified every later request carries it as a precondition (If-Match,
If-Unmodified-Since) and the server answers 412; without either the load checks the stored CRC32s
and reads every tensor header again at the end. Last, an S3 object (moto) re-uploaded around a
load, when the servers of scripts/with-servers.sh are up.
"""

import email.utils
import http.server
import threading

import pytest
import torch

from conftest import save_state_dict
from tensorizer import TensorDeserializer
from tensorizer.serialization import HashMismatchError

NAMES = [f"t{i}" for i in range(16)]


def version_bytes(tmp_path, value):
    path = tmp_path / f"v{value}.tensors"
    save_state_dict(path, {n: torch.full((1 << 18,), float(value)) for n in NAMES})
    return path.read_bytes()


class SwitchingServer:
    """Serves `first` to the first `switch_after` requests, then `second`. `validators`: "etag",
    "date" or "none"; preconditions are honoured as a server must (412 when they fail)."""

    def __init__(self, first, second, validators, switch_after=4):
        self.requests = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                version = 1 if len(outer.requests) < switch_after else 2
                outer.requests.append(dict(self.headers))
                body = first if version == 1 else second
                etag = f'"v{version}"'
                date = email.utils.formatdate(1_700_000_000 + version, usegmt=True)
                if_match = self.headers.get("If-Match")
                since = self.headers.get("If-Unmodified-Since")
                if (if_match and if_match != etag) or (since and since != date and version == 2):
                    self.send_response(412)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                first_byte, last_byte = 0, len(body) - 1
                rng = self.headers.get("Range")
                if rng:
                    a, b = rng.split("=", 1)[1].split("-")
                    first_byte, last_byte = int(a), min(int(b or len(body) - 1), len(body) - 1)
                part = body[first_byte : last_byte + 1]
                self.send_response(206 if rng else 200)
                if rng:
                    self.send_header("Content-Range", f"bytes {first_byte}-{last_byte}/{len(body)}")
                self.send_header("Content-Length", str(len(part)))
                self.send_header("Accept-Ranges", "bytes")
                if validators == "etag":
                    self.send_header("ETag", etag)
                if validators == "date":
                    self.send_header("Last-Modified", date)
                self.end_headers()
                self.wfile.write(part)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/model.tensors"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(autouse=True)
def small_requests(monkeypatch):
    monkeypatch.setenv("TENSORIZER_READ_MIB", "1")  # 17 ranged GETs, so the switch lands mid-load


@pytest.fixture
def versions(tmp_path):
    one, two = version_bytes(tmp_path, 1), version_bytes(tmp_path, 2)
    assert len(one) == len(two)
    return one, two


@pytest.mark.parametrize("validators", ["etag", "date"])
def test_a_replaced_object_with_a_validator_fails_with_412(versions, validators):
    server = SwitchingServer(*versions, validators)
    try:
        with pytest.raises(OSError, match="the object changed during the load") as e:
            TensorDeserializer(server.url, num_readers=2)
        assert server.url in str(e.value)
        header = "If-Match" if validators == "etag" else "If-Unmodified-Since"
        assert all(header in r for r in server.requests[1:]), server.requests
    finally:
        server.close()


@pytest.mark.parametrize("staged", [False, True], ids=["host", "staged"])
@pytest.mark.parametrize("switch_after", [3, 6, 12])
def test_a_replaced_object_without_validators_fails_its_checks(versions, switch_after, staged, monkeypatch):
    """Also through the staging ring every CUDA load takes (on CPU: TENSORIZER_STAGED=1)."""
    if staged:
        monkeypatch.setenv("TENSORIZER_STAGED", "1")
    server = SwitchingServer(*versions, "none", switch_after=switch_after)
    try:
        with pytest.raises((OSError, HashMismatchError), match="the object changed during the load") as e:
            TensorDeserializer(server.url, num_readers=2)
        assert server.url in str(e.value)
    finally:
        server.close()


@pytest.mark.parametrize("validators", ["etag", "date", "none"])
def test_an_unchanged_object_loads_whole_either_way(versions, validators):
    server = SwitchingServer(versions[0], versions[0], validators, switch_after=10**9)
    try:
        d = TensorDeserializer(server.url, num_readers=2)
        assert sorted(d.keys()) == sorted(NAMES)
        assert all(torch.equal(d[n], torch.full((1 << 18,), 1.0)) for n in NAMES)
    finally:
        server.close()


def test_an_s3_object_replaced_mid_load_is_an_error_or_one_whole_version(monkeypatch):
    """moto keeps an ETag per version and honours If-Match. A re-upload (about 0.4 s here) starts
    shortly before each load (about 0.3 s), so that it completes before, during or after it; every
    outcome must be one whole version or the error."""
    import time
    import uuid

    from test_remote import server_env

    endpoint, bucket = server_env("TZ_TEST_S3_ENDPOINT", "TZ_TEST_S3_BUCKET")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    uri = f"s3://{bucket}/change-{uuid.uuid4().hex}.tensors"

    def upload(value):
        save_state_dict(uri, {n: torch.full((1 << 18,), float(value)) for n in NAMES})

    for lead in (0.05, 0.15, 0.25, 0.35):
        upload(1)
        replacer = threading.Thread(target=upload, args=(2,))
        replacer.start()
        time.sleep(lead)
        try:
            d = TensorDeserializer(uri, num_readers=2)
            values = {float(d[n].detach()[0]) for n in NAMES}
            assert len(values) == 1, (lead, values)
            (value,) = values
            assert all(torch.equal(d[n], torch.full((1 << 18,), value)) for n in NAMES)
        except OSError as e:
            assert "the object changed during the load" in str(e), str(e)
        finally:
            replacer.join()
