"""edge.model.engine_cache without a network: the key is the canonical sha256 of what an artifact must record, a
folder cache reads a file or says it has none, and a URL cache that could be swapped in transit or would send a
password in the clear is refused in one line, before any connection, the password never shown."""

import pytest

from edge.errors import EdgeError
from edge.model.engine_cache import identity, read_file


def test_the_key_is_the_same_for_the_same_expectations_in_any_order_and_differs_for_any_other():
    expected = {"sha256": "ab" * 32, "precision": "int8", "system": {"tensorrt": "10.3.0", "sm_count": 16}}
    key = identity(expected)
    assert len(key) == 64 and key == identity(dict(reversed(list(expected.items()))))
    assert identity(dict(expected, precision="fp16")) != key
    assert identity(dict(expected, system={"tensorrt": "10.3.0", "sm_count": 8})) != key


def test_a_folder_cache_copies_the_file_it_has_and_says_when_it_has_none(tmp_path):
    (tmp_path / "cache" / "k1").mkdir(parents=True)
    (tmp_path / "cache" / "k1" / "rollout.json").write_bytes(b"{}")
    dest = str(tmp_path / "got.json")
    assert read_file(str(tmp_path / "cache"), "k1", "rollout.json", dest) is True
    assert open(dest, "rb").read() == b"{}"
    assert read_file(str(tmp_path / "cache"), "k2", "rollout.json", str(tmp_path / "none.json")) is False
    assert not (tmp_path / "none.json").exists()


@pytest.mark.parametrize("cache,says", [
    ("http://cache.local/engines", "plain http:// lets anything on the path swap the artifact"),
    ("http://ci:S3cretPass@cache.local/engines", "a user:password over plain http would travel in the clear"),
    ("ftp://cache.local/engines", "expected a folder or an https://host[:port]/path URL"),
    ("https://ci:S3cretPass@cache.local:port/engines", "not a well-formed URL"),
])
def test_a_url_cache_that_is_not_safe_is_refused_in_one_line_without_its_password(cache, says):
    with pytest.raises(EdgeError) as err:
        read_file(cache, "k1", "rollout.json", "/nonexistent/dest")
    assert says in str(err.value) and "S3cretPass" not in str(err.value) and "\n" not in str(err.value)
