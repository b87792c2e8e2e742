"""The CPU LoRA engine, in-process on the tiny random Llama: adapters load onto one base and are
served under their own names with answers that match plain transformers `generate` with that
adapter, streaming and not; requests for two names never share a batch; unsupported fields and
unknown models are refused with the OpenAI error shape, naming the field."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from services.hoster.lora_engine import Engine, build_app
from services.hoster.phase_gate import PhaseGate
from tests.plugins.models import build_tiny_causal_lm, build_tiny_tokenizer

BASE = "SmolLM2-135M-Instruct"
MESSAGES = [{"role": "user", "content": "def add(a, b):"}]


def make_adapter(dest: Path, seed: int) -> Path:
    config = LoraConfig(
        r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = get_peft_model(build_tiny_causal_lm(), config)
    model.save_pretrained(dest)
    build_tiny_tokenizer().save_pretrained(dest)
    adapter_config = dest / "adapter_config.json"
    data = json.loads(adapter_config.read_text())
    data["base_model_name_or_path"] = BASE
    adapter_config.write_text(json.dumps(data))
    return dest


def reference(base_dir: Path, adapter: Path | None, max_new_tokens: int) -> str:
    """What transformers' own greedy generate answers, with the adapter applied or not."""
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    return str(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {name: make_adapter(root / name, seed) for name, seed in (("ckpt-a", 1), ("ckpt-b", 2))}


@pytest.fixture
async def engine(tiny_model_dir: Path) -> Engine:
    return Engine(base_dir=tiny_model_dir, base_name=BASE, max_batch=8)


def client(engine: Engine) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=build_app(engine))
    return httpx.AsyncClient(transport=transport, base_url="http://engine")


async def load_all(http: httpx.AsyncClient, adapters: dict[str, Path]) -> None:
    for name, path in adapters.items():
        loaded = await http.post("/models", json={"name": name, "path": str(path)})
        assert loaded.status_code == 200, loaded.text


async def ask(http: httpx.AsyncClient, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 12, "temperature": 0, **extra}
    return await http.post("/v1/chat/completions", json=body)


async def test_adapters_answer_as_transformers_generate_does(
    engine: Engine, adapters: dict[str, Path], tiny_model_dir: Path
) -> None:
    async with client(engine) as http:
        for name, path in adapters.items():
            loaded = await http.post("/models", json={"name": name, "path": str(path)})
            assert loaded.status_code == 200, loaded.text
            assert loaded.json() == {"name": name, "kind": "adapter"}
        listed = (await http.get("/v1/models")).json()["data"]
        assert {m["id"]: m["parent"] for m in listed} == {
            BASE: None,
            "ckpt-a": BASE,
            "ckpt-b": BASE,
        }

        # Interleaved: each answer is its own model's, whatever ran just before.
        for model in ("ckpt-b", BASE, "ckpt-a", "ckpt-b"):
            reply = await ask(http, model)
            assert reply.status_code == 200, reply.text
            body = reply.json()
            adapter = adapters.get(model)
            assert body["choices"][0]["message"]["content"] == reference(
                tiny_model_dir, adapter, 12
            )
            assert body["model"] == model
            assert body["usage"]["completion_tokens"] <= 12
            assert body["choices"][0]["finish_reason"] in ("stop", "length")


async def test_concurrent_requests_for_two_adapters_each_get_their_own(
    engine: Engine, adapters: dict[str, Path], tiny_model_dir: Path
) -> None:
    async with client(engine) as http:
        await load_all(http, adapters)
        models = ["ckpt-a", "ckpt-b", BASE] * 4
        replies = await asyncio.gather(*(ask(http, m) for m in models))
    want = {m: reference(tiny_model_dir, adapters.get(m), 12) for m in set(models)}
    assert len(set(want.values())) == 3  # the three really differ, so a mix-up would show
    for model, reply in zip(models, replies, strict=True):
        assert reply.json()["choices"][0]["message"]["content"] == want[model]


async def test_streaming_sends_the_same_text_in_chunks(
    engine: Engine, adapters: dict[str, Path]
) -> None:
    async with client(engine) as http:
        await http.post("/models", json={"name": "ckpt-a", "path": str(adapters["ckpt-a"])})
        whole = (await ask(http, "ckpt-a")).json()["choices"][0]["message"]["content"]
        body = {
            "model": "ckpt-a", "messages": MESSAGES, "max_tokens": 12, "stream": True,
            "stream_options": {"include_usage": True},
        }  # fmt: skip
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            lines = [line async for line in response.aiter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == whole
    assert chunks[-1]["usage"]["completion_tokens"] <= 12
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] in (
        "stop",
        "length",
    )


async def test_unloading_an_adapter_leaves_the_others_and_the_base(
    engine: Engine, adapters: dict[str, Path], tiny_model_dir: Path
) -> None:
    async with client(engine) as http:
        await load_all(http, adapters)
        await ask(http, "ckpt-a")  # ckpt-a is the active adapter when it goes
        assert (await http.delete("/models/ckpt-a")).status_code == 204
        gone = await ask(http, "ckpt-a")
        assert gone.status_code == 404
        assert gone.json()["error"]["code"] == "model_not_found"
        base = (await ask(http, BASE)).json()["choices"][0]["message"]["content"]
        assert base == reference(tiny_model_dir, None, 12)
        b = (await ask(http, "ckpt-b")).json()["choices"][0]["message"]["content"]
        assert b == reference(tiny_model_dir, adapters["ckpt-b"], 12)
        assert (await http.delete(f"/models/{BASE}")).status_code == 400


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"temperature": 0.7}, "temperature"),
        ({"n": 2}, "n"),
        ({"stop": ["\n"]}, "stop"),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
async def test_what_the_engine_cannot_honour_is_refused_by_name(
    engine: Engine, extra: dict[str, Any], param: str
) -> None:
    async with client(engine) as http:
        reply = await ask(http, BASE, **extra)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == param
    assert param in reply.json()["error"]["message"]


async def test_a_wrong_adapter_or_path_is_refused(
    engine: Engine, adapters: dict[str, Path], tmp_path: Path
) -> None:
    other = make_adapter(tmp_path / "other", 3)
    config = json.loads((other / "adapter_config.json").read_text())
    (other / "adapter_config.json").write_text(
        json.dumps(config | {"base_model_name_or_path": "x"})
    )
    async with client(engine) as http:
        wrong_base = await http.post("/models", json={"name": "o", "path": str(other)})
        missing = await http.post("/models", json={"name": "m", "path": str(tmp_path / "none")})
        await http.post("/models", json={"name": "a", "path": str(adapters["ckpt-a"])})
        taken = await http.post("/models", json={"name": "a", "path": str(adapters["ckpt-b"])})
        again = await http.post("/models", json={"name": "a", "path": str(adapters["ckpt-a"])})
    assert wrong_base.status_code == 400
    assert "trained on 'x'" in wrong_base.json()["error"]["message"]
    assert missing.status_code == 400
    assert missing.json()["error"]["param"] == "path"
    assert taken.status_code == 409
    assert again.status_code == 200  # the same load twice is the same model


async def test_the_gate_runs_one_name_at_a_time_first_come_first_served() -> None:
    switched: list[str] = []
    gate = PhaseGate(switched.append)
    running: set[str] = set()
    overlaps: list[set[str]] = []

    async def request(name: str, hold_s: float) -> None:
        async with gate.use(name):
            running.add(name)
            overlaps.append(set(running))
            await asyncio.sleep(hold_s)
            running.discard(name)

    first = asyncio.create_task(request("a", 0.05))
    await asyncio.sleep(0)
    later = [asyncio.create_task(request(n, 0.01)) for n in ("b", "a", "b")]
    await asyncio.gather(first, *later)
    assert all(len(names) == 1 for names in overlaps)
    # b waited ahead of the second a, so a did not keep the engine: a, b, a, b.
    assert switched == ["a", "b", "a", "b"]


async def test_a_whole_model_loads_beside_the_base_and_answers_as_itself(
    engine: Engine, adapters: dict[str, Path], tmp_path: Path
) -> None:
    # A full fine-tune's checkpoint is a model of its own: here a different random Llama.
    other = tmp_path / "full"
    build_tiny_causal_lm(seed=7).save_pretrained(other)
    build_tiny_tokenizer().save_pretrained(other)
    async with client(engine) as http:
        loaded = await http.post("/models", json={"name": "full", "path": str(other)})
        assert loaded.json() == {"name": "full", "kind": "full"}
        await http.post("/models", json={"name": "ckpt-a", "path": str(adapters["ckpt-a"])})
        replies = await asyncio.gather(*(ask(http, m) for m in ("full", "ckpt-a", "full")))
        assert (await http.delete("/models/full")).status_code == 204
        assert (await ask(http, "full")).status_code == 404
    texts = [r.json()["choices"][0]["message"]["content"] for r in replies]
    assert texts[0] == texts[2] == reference(other, None, 12)
    assert texts[1] == reference(engine.base_dir, adapters["ckpt-a"], 12)


async def test_a_deployments_engine_answers_its_loaded_names_only_and_counts_their_calls(
    engine: Engine, adapters: dict[str, Path]
) -> None:
    engine.hide_base = True  # --hide-base: the engine a tenant's versions of the base share
    async with client(engine) as http:
        await load_all(http, adapters)
        listed = (await http.get("/v1/models")).json()["data"]
        assert [m["id"] for m in listed] == ["ckpt-a", "ckpt-b"]
        base = await ask(http, BASE)
        assert (base.status_code, base.json()["error"]["code"]) == (404, "model_not_found")
        before = (await http.get("/stats")).json()["models"]
        assert {name: s["requests"] for name, s in before.items()} == {"ckpt-a": 0, "ckpt-b": 0}
        await asyncio.sleep(0.05)
        assert (await ask(http, "ckpt-a")).status_code == 200
        after = (await http.get("/stats")).json()["models"]
    assert (after["ckpt-a"]["requests"], after["ckpt-a"]["in_flight"]) == (1, 0)
    assert after["ckpt-b"]["requests"] == 0
    # Seconds since the last call ended, or since the load for one never called.
    assert after["ckpt-a"]["idle_s"] < after["ckpt-b"]["idle_s"]
    assert after["ckpt-b"]["idle_s"] >= before["ckpt-b"]["idle_s"] + 0.05
