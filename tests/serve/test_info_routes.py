"""/v1/models/{id}, /tokenize, /detokenize and /version against the app (no engine needed)."""
from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from serve.api.app import ServerState, build_app
from serve.dummy_tokenizer import byte_tokenizer


@pytest.fixture(scope="module")
def client():
    tok = byte_tokenizer(300)
    state = ServerState(client=None, tokenizer=tok, model_name="tiny", max_model_len=128,
                        model_names={"tiny", "dummy:tiny-llama"})
    with TestClient(build_app(state), base_url="http://127.0.0.1") as c:
        yield c


def test_model_card(client):
    r = client.get("/v1/models/tiny")
    assert r.status_code == 200 and r.json()["id"] == "tiny" and r.json()["max_model_len"] == 128
    assert client.get("/v1/models/dummy:tiny-llama").status_code == 200
    r = client.get("/v1/models/gpt-4")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_tokenize_detokenize_round_trip(client):
    r = client.post("/tokenize", json={"prompt": "héllo", "add_special_tokens": False})
    assert r.status_code == 200
    ids = r.json()["tokens"]
    assert ids == [3 + b for b in "héllo".encode()] and r.json()["count"] == len(ids)
    assert client.post("/detokenize", json={"tokens": ids}).json() == {"prompt": "héllo"}
    chat = client.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 200
    assert client.post("/detokenize", json={"tokens": chat.json()["tokens"]}).json()["prompt"] \
        == "<|user|>\nhi\n<|assistant|>\n"


@pytest.mark.parametrize("path, body, param", [
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": "a", "messages": []}, "prompt"),
    ("/tokenize", {"messages": "hi"}, "messages"),
    ("/detokenize", {"tokens": [1, 300]}, "tokens"),
    ("/detokenize", {"tokens": ["a"]}, "tokens"),
])
def test_bad_input_is_a_400_naming_the_field(client, path, body, param):
    r = client.post(path, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_version(client):
    v = client.get("/version").json()
    assert v["version"] == "0.1.0" and v["torch"]
