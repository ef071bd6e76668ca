"""tt_serve.demo: the demo checkpoint is what HF transformers writes and loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from tt_serve import demo
from tt_serve.tokenizer import Tokenizer

SAMPLES = [
    "Hello, world! The quick brown fox.",
    "你好，世界！ 日本語 русский 👨\u200d👩\u200d👧 🇯🇵",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory, qwen_tokenizer_dir: Path) -> Path:
    target = tmp_path_factory.mktemp("demo") / "model"
    return demo.write_demo_model(target, tokenizer_from=qwen_tokenizer_dir)


def _hf_config() -> Any:
    from transformers import Qwen3_5TextConfig

    fields = {k: v for k, v in demo.DEMO_CONFIG.items() if k not in ("architectures", "model_type")}
    return Qwen3_5TextConfig(**fields)


def test_tensor_names_and_shapes_match_hf() -> None:
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = transformers.Qwen3_5ForCausalLM(_hf_config())
    hf = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert model.lm_head.weight is model.model.embed_tokens.weight
    del hf["lm_head.weight"]  # tied: save_pretrained omits it
    assert demo.demo_tensor_shapes() == hf


@pytest.mark.slow
def test_written_files(demo_dir: Path) -> None:
    config = json.loads((demo_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3_5_text"
    assert config["eos_token_id"] == 248046 and config["vocab_size"] >= 248077
    with safe_open(str(demo_dir / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        embed = f.get_tensor("model.embed_tokens.weight")
        a_log = f.get_tensor("model.layers.0.linear_attn.A_log")
        dt_bias = f.get_tensor("model.layers.1.linear_attn.dt_bias")
    assert names == set(demo.demo_tensor_shapes())
    assert embed.dtype == torch.bfloat16
    # Context-sensitive init (tied embeddings at N(0, 0.2)), not HF's std-0.02 default. Bounds
    # from sampling statistics, not from a machine: the std of 63.6M samples is within 2e-5 of
    # 0.2 and bf16 rounding moves it by < 1e-3 relative, so 0.005 is far outside the noise.
    assert abs(embed.float().std().item() - 0.2) < 0.005
    # A_log = log U(0.01, 1): bf16 rounds log(0.01) = -4.6052 up to -4.5938, so 1e-2 only absorbs
    # the fp32 rounding of the log (1e-6).
    assert (a_log <= 0).all() and (a_log >= torch.log(torch.tensor(0.01)) - 1e-2).all()
    # dt_bias ~ N(-2, 0.5): the mean of its 4 values is within 6 standard errors (0.25) of -2.
    assert -3.5 < dt_bias.float().mean().item() < -0.5
    assert not list(demo_dir.parent.glob(".*tmp*"))


@pytest.mark.slow
def test_tokenizer_files_load(demo_dir: Path) -> None:
    tok = Tokenizer.from_dir(demo_dir)
    assert tok.eos_token_ids == {248046, 248044}  # tokenizer_config + generation_config
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_pretokenizer_regex_is_transformers_qwen3_5(qwen_tokenizer_dir: Path) -> None:
    tokenization = pytest.importorskip("transformers.models.qwen3_5.tokenization_qwen3_5")
    # Parse only the settings before the 33 MB vocabulary.
    text = (qwen_tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8")
    model_at = text.index('\n  "model": {')
    head = json.loads(text[:model_at].rstrip().rstrip(",") + "}")
    split = head["pre_tokenizer"]["pretokenizers"][0]
    assert split["pattern"]["Regex"] == tokenization.PRETOKENIZE_REGEX
    assert head["normalizer"]["type"] == "NFC"
    assert '"ignore_merges": true' in text[model_at : text.index('"vocab"', model_at)]


@pytest.mark.slow
def test_hf_loads_demo_model_and_tokenizer(demo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(2)
    hf_tok = transformers.AutoTokenizer.from_pretrained(demo_dir)
    ours = Tokenizer.from_dir(demo_dir)
    for text in SAMPLES:
        assert hf_tok.encode(text, add_special_tokens=False) == ours.encode(text)
    model = transformers.AutoModelForCausalLM.from_pretrained(demo_dir, dtype=torch.float32)
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    # Every written tensor was used (nothing silently re-initialised by HF).
    with safe_open(str(demo_dir / "model.safetensors"), "pt") as f:
        embed = f.get_tensor("model.embed_tokens.weight").float()
    assert torch.equal(model.model.embed_tokens.weight.detach(), embed)
    prompt = torch.tensor(
        [ours.encode(ours.apply_chat_template([{"role": "user", "content": "Hi"}]))]
    )
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=40, min_new_tokens=40, do_sample=False)
    generated = out[0, prompt.shape[1] :].tolist()
    # The init must give varied greedy output, or warm-vs-cold cache tests would be vacuous.
    assert len(set(generated)) >= 10


def test_write_refuses_non_empty_target_and_cleans_up(
    tmp_path: Path, qwen_tokenizer_dir: Path
) -> None:
    target = tmp_path / "model"
    target.mkdir()
    (target / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError):
        demo.write_demo_model(target, tokenizer_from=qwen_tokenizer_dir, dtype="float16")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert sorted(p.name for p in target.iterdir()) == ["keep.txt"]


def test_crash_leaves_no_half_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash_mid_write(tensors: object, filename: str, metadata: object = None) -> None:
        Path(filename).write_bytes(b"half a file")
        raise RuntimeError("disk full")

    monkeypatch.setattr(demo, "demo_tensor_shapes", lambda: {"model.norm.weight": (4,)})
    monkeypatch.setattr(demo, "save_file", crash_mid_write)
    with pytest.raises(RuntimeError, match="disk full"):
        demo.write_demo_model(tmp_path / "model")
    assert list(tmp_path.iterdir()) == []


def test_bad_dtype(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="dtype"):
        demo.write_demo_model(tmp_path / "model", dtype="int8")


def test_ensure_demo_model_creates_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    expected = tmp_path / "cache" / "tt-serve" / "demo-qwen3_5-v1"
    assert demo.demo_model_dir() == expected
    calls: list[Path] = []

    def fake_write(directory: Path) -> Path:
        # The real writer is covered above; here only the first-use logic matters.
        calls.append(directory)
        directory.mkdir(parents=True)
        for name in ("config.json", "generation_config.json", "model.safetensors"):
            (directory / name).write_text("{}")
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (directory / name).write_text("{}")
        return directory

    monkeypatch.setattr(demo, "write_demo_model", fake_write)
    logs: list[str] = []
    assert demo.ensure_demo_model(log=logs.append) == expected
    assert demo.ensure_demo_model(log=logs.append) == expected
    assert calls == [expected]
    assert len(logs) == 1 and str(expected) in logs[0]
    (expected / "model.safetensors").unlink()
    assert demo.ensure_demo_model(log=logs.append) == expected
    assert len(calls) == 2 and "incomplete" in logs[1]


def test_demo_model_dir_defaults_to_home_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert demo.demo_model_dir() == tmp_path / ".cache" / "tt-serve" / "demo-qwen3_5-v1"
