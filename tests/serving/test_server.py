"""vLLM's OpenAI-compatible server (``vllm serve``) on ``neuron``, started and stopped by this module
on a free loopback port: /v1/models, /health, /metrics, /v1/completions and /v1/chat/completions
(chat template, streaming over SSE) answer; greedy outputs equal Transformers' ``generate`` on CPU;
32 concurrent requests of mixed lengths each equal their single-request output; prefix-cache hits
show in /metrics; bad input gets OpenAI-style 4xx errors and the server keeps serving; a client that
disconnects mid-stream has its request aborted and its KV blocks freed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from _dist import free_port, remove_leaked, shm_entries
from _serving import build_model, hf_greedy, requires_serve_env, serve_env

pytestmark = requires_serve_env

MODEL = "tiny"
MAX_MODEL_LEN = 256
START_TIMEOUT = 400  # seconds; importing vLLM in two processes on a loaded 2-core host


class Server:
    def __init__(self, model_dir, log_path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model_dir = model_dir
        self.log = open(log_path, "w")
        cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model_dir),
               "--host", "127.0.0.1", "--port", str(self.port), "--served-model-name", MODEL,
               "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "32",
               "--kv-cache-memory-bytes", str(8 << 20), "--block-size", "16"]
        # its own session, so teardown reaches the engine-core process too
        self.proc = subprocess.Popen(cmd, env=serve_env(), stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def wait_ready(self):
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"vllm serve exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(1)
        raise AssertionError(f"vllm serve not ready after {START_TIMEOUT} s:\n{self.tail()}")

    def tail(self, n=60):
        self.log.flush()
        with open(self.log.name) as f:
            return "".join(f.readlines()[-n:])

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        # the engine core is in the same session: make sure nothing of it survives
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.5)
        else:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()

    def post(self, path, body, **kw):
        return requests.post(self.url + path, json=body, timeout=120, **kw)

    def metric(self, name, **labels):
        """The sum of the samples of ``name`` whose labels include ``labels``."""
        text = requests.get(self.url + "/metrics", timeout=30).text
        total, found = 0.0, False
        for m in re.finditer(rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$", text, re.M):
            got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            if all(got.get(k) == v for k, v in labels.items()):
                total += float(m.group(2))
                found = True
        assert found, f"{name}{labels} not in /metrics"
        return total


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serving_server")
    model_dir = build_model(tmp, "llama")
    before = shm_entries()
    srv = Server(model_dir, tmp / "server.log")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()
        leaked = remove_leaked(before)
        assert leaked == [], f"shared-memory segments left behind: {leaked}"


@pytest.fixture(scope="module")
def tok(server):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(server.model_dir)


def _complete(server, prompt, max_tokens, **extra):
    r = server.post("/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                                        "temperature": 0, "ignore_eos": True, "return_token_ids": True, **extra})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["prompt_token_ids"], choice["token_ids"], choice["text"]


def test_models_health_and_metrics_answer(server):
    assert requests.get(server.url + "/health", timeout=30).status_code == 200
    models = requests.get(server.url + "/v1/models", timeout=30).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["max_model_len"] == MAX_MODEL_LEN
    assert server.metric("vllm:num_requests_running") == 0


def test_completion_equals_transformers(server, tok):
    prompt_ids, ids, text = _complete(server, "1 2 3 4 hello 5", 10)
    assert prompt_ids == tok("1 2 3 4 hello 5")["input_ids"]
    assert ids == hf_greedy(server.model_dir, [prompt_ids], [10])[0]
    assert text == tok.decode(ids) or text == " " + tok.decode(ids)


def test_chat_completion_streams_over_sse(server, tok):
    messages = [{"role": "system", "content": "count"}, {"role": "user", "content": "7 8 9"}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    whole = server.post("/v1/chat/completions", body)
    assert whole.status_code == 200, whole.text
    content = whole.json()["choices"][0]["message"]["content"]

    r = server.post("/v1/chat/completions", {**body, "stream": True}, stream=True)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [line[len("data: "):] for line in r.iter_lines(decode_unicode=True) if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert streamed == content

    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "keys") else prompt
    expected = hf_greedy(server.model_dir, [list(prompt)], [6])[0]
    assert content.split() == tok.decode(expected).split()


def test_concurrent_requests_equal_their_single_request_outputs(server):
    prompts = [[(11 * i + 5 * j) % 190 + 17 for j in range(3 + (7 * i) % 45)] for i in range(32)]
    max_tokens = [1 + (5 * i) % 24 for i in range(32)]
    single = [_complete(server, prompts[i], max_tokens[i])[1] for i in (0, 1, 2)]
    with ThreadPoolExecutor(32) as pool:
        outs = list(pool.map(lambda i: _complete(server, prompts[i], max_tokens[i])[1], range(32)))
    assert outs[:3] == single
    assert outs == hf_greedy(server.model_dir, prompts, max_tokens)


def test_prefix_cache_hits_show_in_metrics(server):
    prompt = [(3 * j) % 190 + 17 for j in range(64)]
    hits = server.metric("vllm:prefix_cache_hits_total")
    first = _complete(server, prompt, 4)[1]
    second = _complete(server, prompt, 4)[1]
    assert first == second
    # the second prompt finds its first three full 16-token blocks cached
    assert server.metric("vllm:prefix_cache_hits_total") - hits >= 48


@pytest.mark.parametrize("case", ["prompt_too_long", "negative_temperature", "unknown_model", "malformed_json"])
def test_bad_input_gets_an_openai_error_and_the_server_keeps_serving(server, case):
    body = {"model": MODEL, "prompt": "1 2 3", "max_tokens": 4}
    if case == "prompt_too_long":
        r = server.post("/v1/completions", {**body, "prompt": " ".join(str(i % 190) for i in range(MAX_MODEL_LEN + 5))})
        status = 400
    elif case == "negative_temperature":
        r = server.post("/v1/completions", {**body, "temperature": -1})
        status = 400
    elif case == "unknown_model":
        r = server.post("/v1/completions", {**body, "model": "no-such-model"})
        status = 404
    else:
        r = requests.post(server.url + "/v1/completions", data='{"model": "tiny", "prompt": ',
                          headers={"Content-Type": "application/json"}, timeout=30)
        status = 400
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["message"] and err["type"]
    assert _complete(server, "1 2 3", 3)[1] == hf_greedy(server.model_dir, [[18, 19, 20]], [3])[0]


def test_client_disconnect_mid_stream_aborts_and_frees_blocks(server):
    max_tokens = MAX_MODEL_LEN - 8
    finished = server.metric("vllm:request_success_total")
    generated = server.metric("vllm:generation_tokens_total")
    body = {"model": MODEL, "prompt": "1 2 3 4", "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    r = server.post("/v1/completions", body, stream=True)
    got = 0
    for line in r.iter_lines(decode_unicode=True):  # read until two tokens have arrived, then hang up
        if line.startswith("data: "):
            got += 1
            if got == 2:
                break
    r.close()
    deadline = time.monotonic() + 60
    while server.metric("vllm:num_requests_running") != 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert server.metric("vllm:num_requests_running") == 0
    assert server.metric("vllm:kv_cache_usage_perc") == 0  # its blocks are free again
    # aborted, not finished: no request completed and far fewer tokens than asked were generated
    assert server.metric("vllm:request_success_total") == finished
    assert server.metric("vllm:generation_tokens_total") - generated < max_tokens
