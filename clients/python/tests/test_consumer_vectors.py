"""The consumer helper's key and fingerprint against clients/conformance/consumer-key-v1.json,
which every SDK reads: a message one SDK consumed is a duplicate to the others only if all agree."""

import json

import pytest

from conftest import CONFORMANCE
from idemd.fingerprint import fingerprint_v1
from idemd.messages import Message, MissingKeyError, _Processor

FILE = json.loads((CONFORMANCE / "consumer-key-v1.json").read_text(encoding="utf-8"))


def processor(endpoint: str, *, by_position: bool) -> _Processor:
    return _Processor(endpoint, key_header=None if by_position else FILE["key_header"],
                      key_by_position=by_position, dead_letter=lambda message, reason: None,
                      lease=None, max_wait=0.0, ttl=None)


@pytest.mark.parametrize("vector", FILE["vectors"], ids=[v["name"] for v in FILE["vectors"]])
def test_consumer_key_vectors(vector: dict) -> None:
    assert FILE["version"] == 1
    message = Message(bytes.fromhex(vector["value_hex"]),
                      [(name, value.encode("utf-8")) for name, value in vector["headers"]],
                      vector["topic"], vector["partition"], vector["offset"])
    by_header = processor(vector["endpoint"], by_position=False)
    if vector["key_from_header"] is None:
        with pytest.raises(MissingKeyError):
            by_header.key_of(message)
    else:
        assert by_header.key_of(message) == vector["key_from_header"]
    assert processor(vector["endpoint"], by_position=True).key_of(message) == vector["key_from_position"]
    request = by_header._request(message)
    assert fingerprint_v1(request.method, request.path, request.body).hex() == vector["fingerprint_hex"]
