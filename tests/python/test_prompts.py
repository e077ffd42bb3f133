"""Own prompts, scoring workloads, logits files and --set (issue 11, harness side), seen from outside:
fd-bench run on the reference engine with the tiny model and random weights, and scripts/tokenize.py with a
fake tokenizer (plus the real AutoTokenizer when transformers is installed)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TOKENIZE = REPO_ROOT / "scripts" / "tokenize.py"


def base(models_dir, workload, **extra):
    cfg = {"name": "p", "model": {"config": str(models_dir / "tiny-llama.json"), "weights": {"seed": 3, "dtype": "fp16"}},
           "workload": workload, "engine": {"type": "reference", "threads": 1}}
    cfg.update(extra)
    return cfg


def write_jsonl(path: Path, recs) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def read_jsonl(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def bench(fd_bin, *args, check=True):
    proc = subprocess.run([fd_bin("fd-bench"), *map(str, args)], capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        pytest.fail(f"fd-bench {' '.join(map(str, args))} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_cfg(fd_bin, d: Path, name: str, cfg: dict, *extra) -> Path:
    (d / f"{name}.json").write_text(json.dumps(cfg))
    bench(fd_bin, "run", d / f"{name}.json", "--out", d / name, "--quiet", *extra)
    return d / name


def log_softmax(x):
    x = x.astype(np.float64)
    z = x - x.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


PROMPTS = [
    {"prompt": [5, 6, 7, 8, 9], "gen_len": 8},
    {"prompt": [40, 41], "gen_len": 8, "temperature": 1.0, "seed": 9},
    {"prompt": [100, 101, 102], "gen_len": 3, "max_gen_len": 6},
]


def test_prompts_file_and_per_request_sampling(fd_bin, models_dir, tmp_path):
    """requests.jsonl holds exactly the file's prompts and lengths; the greedy request of a mixed run equals
    an all-greedy run; the sampled one equals a run with that sampling for everyone, and differs from greedy."""
    write_jsonl(tmp_path / "p.jsonl", PROMPTS)
    mixed = run_cfg(fd_bin, tmp_path, "mixed", base(models_dir, {"prompts": "p.jsonl"}))
    reqs = read_jsonl(mixed / "requests.jsonl")
    assert [r["prompt"] for r in reqs] == [p["prompt"] for p in PROMPTS]
    assert [r["output_len"] for r in reqs] == [p["gen_len"] for p in PROMPTS]
    assert [r["prompt_len"] for r in reqs] == [len(p["prompt"]) for p in PROMPTS]
    summary = json.loads((mixed / "summary.json").read_text())
    assert summary["config"]["workload"]["requests"] == 3 and summary["overrides"] == []
    assert not (mixed / "logits.jsonl").exists() and not (mixed / "logits").exists()

    greedy_lines = [{k: v for k, v in p.items() if k not in ("temperature", "seed")} for p in PROMPTS]
    write_jsonl(tmp_path / "g.jsonl", greedy_lines)
    greedy = read_jsonl(run_cfg(fd_bin, tmp_path, "greedy", base(models_dir, {"prompts": "g.jsonl"})) / "requests.jsonl")
    sampled = read_jsonl(run_cfg(fd_bin, tmp_path, "sampled", base(models_dir, {"prompts": "g.jsonl"},
                                                                     sampling={"temperature": 1.0, "seed": 9}))
                         / "requests.jsonl")
    assert reqs[0]["tokens"] == greedy[0]["tokens"] and reqs[2]["tokens"] == greedy[2]["tokens"]
    assert reqs[1]["tokens"] == sampled[1]["tokens"]
    assert reqs[1]["tokens"] != greedy[1]["tokens"]


def test_score_run_perplexity_matches_numpy(fd_bin, models_dir, tmp_path):
    """workload.score: each continuation teacher-forced; score.jsonl's NLL and the summary's perplexity
    equal a NumPy log_softmax over the recorded .npy rows at the forced tokens; logits.jsonl's layout."""
    lines = [{"prompt": [5, 6, 7], "continuation": [20, 21, 22, 23, 24]},
             {"prompt": [9], "continuation": [30, 31]},
             {"prompt": [50, 51, 52, 53], "continuation": [60, 61, 62]}]
    write_jsonl(tmp_path / "s.jsonl", lines)
    run = run_cfg(fd_bin, tmp_path, "score", base(models_dir, {"score": "s.jsonl"},
                                                   output={"logits": {"requests": 3, "top_k": 4}}))
    scores = read_jsonl(run / "score.jsonl")
    logits = read_jsonl(run / "logits.jsonl")
    reqs = read_jsonl(run / "requests.jsonl")
    assert [s["request"] for s in scores] == [0, 1, 2] and [lg["request"] for lg in logits] == [0, 1, 2]
    total, n = 0.0, 0
    for line, s, lg, rq in zip(lines, scores, logits, reqs):
        rows = np.load(run / "logits" / f"request_{s['request']}.npy")
        assert rows.dtype == np.float32 and rows.shape == (len(line["continuation"]), 256)
        ls = log_softmax(rows)
        nll = -ls[np.arange(len(line["continuation"])), line["continuation"]].sum()
        assert s["tokens"] == len(line["continuation"])
        assert s["nll_sum"] == pytest.approx(nll, rel=1e-9, abs=1e-9)
        assert s["nll_mean"] == pytest.approx(nll / s["tokens"], rel=1e-9)
        assert s["ppl"] == pytest.approx(math.exp(nll / s["tokens"]), rel=1e-9)
        total += nll
        n += s["tokens"]
        # The emitted tokens are the model's (greedy) picks; the forced ones are what was fed.
        assert lg["forced"] == line["continuation"]
        assert lg["tokens"] == rq["tokens"] == rows.argmax(axis=1).tolist()
        assert len(lg["top"]) == len(line["continuation"])
        for pos, top in enumerate(lg["top"]):
            assert len(top) == 4
            want = np.argsort(-rows[pos], kind="stable")[:4]
            assert [t for t, _ in top] == want.tolist()
            assert [lp for _, lp in top] == pytest.approx(ls[pos, want].tolist(), rel=1e-9)
    sc = json.loads((run / "summary.json").read_text())["score"]
    assert sc["tokens"] == n == 10 and sc["requests"] == 3
    assert sc["perplexity"] == pytest.approx(math.exp(total / n), rel=1e-9)
    assert sc["mean_nll"] == pytest.approx(total / n, rel=1e-9)


def test_score_without_output_logits_scores_all_and_writes_no_logits(fd_bin, models_dir, tmp_path):
    write_jsonl(tmp_path / "s.jsonl", [{"prompt": [5], "continuation": [6, 7]}, {"prompt": [8], "continuation": [9]}])
    run = run_cfg(fd_bin, tmp_path, "s", base(models_dir, {"score": "s.jsonl"}))
    assert [s["tokens"] for s in read_jsonl(run / "score.jsonl")] == [2, 1]
    assert not (run / "logits.jsonl").exists() and not (run / "logits").exists()


def test_logits_subset_of_a_generation_run(fd_bin, models_dir, tmp_path):
    """output.logits with a list of ids and full false: only those requests, no .npy; with full (default)
    the .npy rows are the logits the greedy tokens were picked from."""
    write_jsonl(tmp_path / "p.jsonl", PROMPTS)
    run = run_cfg(fd_bin, tmp_path, "sub", base(models_dir, {"prompts": "p.jsonl"},
                                                 output={"logits": {"requests": [2], "top_k": 2, "full": False}}))
    lg = read_jsonl(run / "logits.jsonl")
    assert [x["request"] for x in lg] == [2] and "forced" not in lg[0]
    assert len(lg[0]["top"]) == 3 and lg[0]["tokens"] == [t[0][0] for t in lg[0]["top"]]  # greedy = top-1
    assert not (run / "logits").exists()
    full = run_cfg(fd_bin, tmp_path, "full", base(models_dir, {"prompts": "p.jsonl"}, output={"logits": {"requests": [0, 2]}}))
    lg = read_jsonl(full / "logits.jsonl")
    assert [x["request"] for x in lg] == [0, 2] and all("top" not in x for x in lg)
    assert sorted(p.name for p in (full / "logits").iterdir()) == ["request_0.npy", "request_2.npy"]
    rows = np.load(full / "logits" / "request_0.npy")
    assert rows.shape == (8, 256) and rows.argmax(axis=1).tolist() == lg[0]["tokens"]


def test_set_overrides(fd_bin, models_dir, tmp_path):
    write_jsonl(tmp_path / "p.jsonl", PROMPTS)
    cfg = base(models_dir, {"prompts": "p.jsonl"})
    run = run_cfg(fd_bin, tmp_path, "set", cfg, "--set", "workload.requests=2", "--set", "sampling.temperature=0.5",
                  "--set", "output.logits.requests=1")
    s = json.loads((run / "summary.json").read_text())
    assert s["overrides"] == ["workload.requests=2", "sampling.temperature=0.5", "output.logits.requests=1"]
    assert s["config"]["workload"]["requests"] == 2 and s["config"]["sampling"]["temperature"] == 0.5
    assert len(read_jsonl(run / "requests.jsonl")) == 2
    assert [x["request"] for x in read_jsonl(run / "logits.jsonl")] == [0]
    p = bench(fd_bin, "run", tmp_path / "set.json", "--out", tmp_path / "bad", "--set", "workload.prompts.x=1", check=False)
    assert p.returncode == 2 and "workload.prompts is not an object" in p.stderr, p.stderr
    p = bench(fd_bin, "run", tmp_path / "set.json", "--out", tmp_path / "bad", "--set", "workload.requests=9", check=False)
    assert p.returncode == 2 and "holds 3 requests" in p.stderr, p.stderr
    assert not (tmp_path / "bad").exists()
    assert "--set" in bench(fd_bin, "run", "--help").stdout


@pytest.mark.parametrize("key,line,what", [
    ("prompts", "{\"prompt\": [5], \"gen_len\": ", "not JSON"),
    ("prompts", "{\"prompt\": [], \"gen_len\": 2}", "'prompt' is empty"),
    ("prompts", "{\"prompt\": [5, 999], \"gen_len\": 2}", "token id 999 outside the vocabulary"),
    ("prompts", "{\"prompt\": [5], \"gen_len\": 600}", "positions"),
    ("prompts", "{\"prompt\": [5], \"gen_len\": 2, \"colour\": 1}", "unknown key 'colour'"),
    ("prompts", "{\"prompt\": [5], \"gen_len\": -1}", "'gen_len' = -1"),
    ("score", "{\"prompt\": [5], \"continuation\": []}", "'continuation' is empty"),
])
def test_bad_lines_exit_2_naming_file_and_line(fd_bin, models_dir, tmp_path, key, line, what):
    good = "{\"prompt\": [5, 6], \"gen_len\": 2}" if key == "prompts" else "{\"prompt\": [5], \"continuation\": [6]}"
    f = tmp_path / "w.jsonl"
    f.write_text(good + "\n" + line + "\n")
    (tmp_path / "c.json").write_text(json.dumps(base(models_dir, {key: str(f)})))
    p = bench(fd_bin, "run", tmp_path / "c.json", "--out", tmp_path / "run", check=False)
    assert p.returncode == 2 and f"{f}:2: " in p.stderr and what in p.stderr, p.stderr
    assert not (tmp_path / "run").exists()  # before any work


def test_bad_logits_request_id_exit_2(fd_bin, models_dir, tmp_path):
    write_jsonl(tmp_path / "p.jsonl", PROMPTS)
    (tmp_path / "c.json").write_text(json.dumps(base(models_dir, {"prompts": "p.jsonl"}, output={"logits": {"requests": [3]}})))
    p = bench(fd_bin, "run", tmp_path / "c.json", "--out", tmp_path / "run", check=False)
    assert p.returncode == 2 and "output.logits.requests: request 3 is not in the workload" in p.stderr, p.stderr


def test_example_prompts_experiment_checks(fd_bin, repo_root):
    for name in ("quickstart-prompts.json", "quickstart-score.json"):
        p = bench(fd_bin, "run", repo_root / "experiments" / name, "--check")
        assert json.loads(p.stdout)["workload"]["requests"] > 0


# ---------------------------------------------------------------------------------------------------------
# scripts/tokenize.py


def load_tokenize():
    spec = importlib.util.spec_from_file_location("fd_tokenize", TOKENIZE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class FakeTokenizer:
    """Words -> ids (a fixed vocabulary grown as words come); BOS = 1 when special tokens are asked for."""

    chat_template = "fake"

    def __init__(self):
        self.vocab = {}

    def encode(self, text, add_special_tokens=True):
        ids = [self.vocab.setdefault(w, 10 + len(self.vocab)) for w in text.split()]
        return ([1] if add_special_tokens else []) + ids

    def decode(self, ids):
        inv = {v: k for k, v in self.vocab.items()}
        return " ".join(inv.get(i, f"<{i}>") for i in ids if i != 1)

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True):
        assert add_generation_prompt and tokenize and messages[0]["role"] == "user"
        return [1, 2] + self.encode(messages[0]["content"], add_special_tokens=False) + [3]


SHAREGPT = [
    {"conversations": [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": "hi how are you"},
                       {"from": "human", "value": "fine"}]},
    {"conversations": [{"from": "system", "value": "be nice"}, {"from": "human", "value": "one two three"},
                       {"from": "gpt", "value": "four"}]},
    {"conversations": [{"from": "human", "value": "no reply"}]},
    {"messages": [{"role": "user", "content": "openai style"}, {"role": "assistant", "content": "yes it is"}]},
]


def test_tokenize_sharegpt_prompts_and_score(tmp_path):
    t = load_tokenize()
    (tmp_path / "c.json").write_text(json.dumps(SHAREGPT))
    tok = FakeTokenizer()
    assert t.main([str(tmp_path / "c.json"), "--out", str(tmp_path / "p.jsonl")], tokenizer=tok) == 0
    recs = read_jsonl(tmp_path / "p.jsonl")
    enc = lambda s, sp=True: tok.encode(s, add_special_tokens=sp)  # noqa: E731
    assert recs == [{"prompt": enc("hello there"), "gen_len": 4},  # gen_len = the first reply's tokens
                    {"prompt": enc("one two three"), "gen_len": 1},
                    {"prompt": enc("openai style"), "gen_len": 3}]
    assert t.main([str(tmp_path / "c.json"), "--out", str(tmp_path / "s.jsonl"), "--score"], tokenizer=tok) == 0
    assert read_jsonl(tmp_path / "s.jsonl")[0] == {"prompt": enc("hello there"), "continuation": enc("hi how are you", False)}
    # JSONL input, --gen-len, --max-prompt-len (drops, not truncates), --chat-template.
    write_jsonl(tmp_path / "c.jsonl", SHAREGPT)
    assert t.main([str(tmp_path / "c.jsonl"), "--out", str(tmp_path / "q.jsonl"), "--gen-len", "7", "--max-prompt-len", "5",
                   "--chat-template"], tokenizer=tok) == 0
    chat = lambda s: [1, 2] + enc(s, False) + [3]  # noqa: E731
    # "one two three" is 6 tokens with the template: left out; with --gen-len the reply-less one stays.
    assert read_jsonl(tmp_path / "q.jsonl") == [{"prompt": chat("hello there"), "gen_len": 7},
                                                {"prompt": chat("no reply"), "gen_len": 7},
                                                {"prompt": chat("openai style"), "gen_len": 7}]


def test_tokenize_plain_text_and_detokenize(tmp_path, capsys):
    t = load_tokenize()
    tok = FakeTokenizer()
    (tmp_path / "t.txt").write_text("the cat sat\n\nthe dog\nran far\n")
    assert t.main([str(tmp_path / "t.txt"), "--out", str(tmp_path / "p.jsonl"), "--gen-len", "5"], tokenizer=tok) == 0
    recs = read_jsonl(tmp_path / "p.jsonl")
    assert [r["prompt"] for r in recs] == [tok.encode("the cat sat"), tok.encode("the dog"), tok.encode("ran far")]
    assert all(r["gen_len"] == 5 for r in recs)
    assert t.main([str(tmp_path / "t.txt"), "--out", str(tmp_path / "g.jsonl"), "--paragraphs", "--score"], tokenizer=tok) == 0
    s = read_jsonl(tmp_path / "g.jsonl")
    whole = tok.encode("the cat sat")
    assert s[0] == {"prompt": whole[:1], "continuation": whole[1:]}
    assert s[1]["continuation"] == tok.encode("the dog\nran far", add_special_tokens=False)
    # Plain text needs --gen-len (no reply to measure): exit 2 naming the flag.
    assert t.main([str(tmp_path / "t.txt"), "--out", str(tmp_path / "x.jsonl")], tokenizer=tok) == 2
    assert "--gen-len" in capsys.readouterr().err
    # --detokenize: a requests.jsonl as fd-bench writes it.
    ids = tok.encode("a b c", add_special_tokens=False)
    write_jsonl(tmp_path / "requests.jsonl", [{"id": 0, "prompt": tok.encode("the cat"), "tokens": ids, "output_len": 3}])
    assert t.main(["--detokenize", str(tmp_path / "requests.jsonl")], tokenizer=tok) == 0
    assert capsys.readouterr().out == "0\ta b c\n"
    assert t.main(["--detokenize", str(tmp_path / "requests.jsonl"), "--out", str(tmp_path / "texts.jsonl")], tokenizer=tok) == 0
    assert read_jsonl(tmp_path / "texts.jsonl") == [{"id": 0, "prompt_text": "the cat", "text": "a b c"}]
    (tmp_path / "bad.jsonl").write_text("{\"conversations\": [{\"from\": \"human\"}]}\n")
    assert t.main([str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "y.jsonl")], tokenizer=tok) == 2
    assert f"{tmp_path / 'bad.jsonl'}:1" in capsys.readouterr().err


def test_tokenize_without_transformers_exits_2(tmp_path):
    """Run as a program with neither transformers nor tokenizers importable: a clear error, exit 2."""
    if importlib.util.find_spec("transformers") or importlib.util.find_spec("tokenizers"):
        blocker = tmp_path / "block"
        blocker.mkdir()
        for m in ("transformers", "tokenizers"):
            (blocker / m).mkdir()
            (blocker / m / "__init__.py").write_text("raise ImportError('blocked for the test')\n")
        env_path = str(blocker)
    else:
        env_path = ""
    (tmp_path / "t.txt").write_text("hello\n")
    import os
    env = dict(os.environ, PYTHONPATH=env_path)
    p = subprocess.run([sys.executable, str(TOKENIZE), "--tokenizer", "x", str(tmp_path / "t.txt"), "--out",
                        str(tmp_path / "o.jsonl"), "--gen-len", "2"], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 2 and "transformers" in p.stderr, p.stderr
    p = subprocess.run([sys.executable, str(TOKENIZE), "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "vLLM" in p.stdout


def test_tokenize_real_autotokenizer(tmp_path):
    """The real AutoTokenizer, from a word-level tokenizer built here (no download)."""
    transformers = pytest.importorskip("transformers", reason="transformers not installed: real-tokenizer test skipped")
    tokenizers = pytest.importorskip("tokenizers")
    words = ["<unk>", "<s>", "hello", "there", "hi", "how", "are", "you"]
    tk = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tk.decoder = tokenizers.decoders.WordPiece()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>")
    fast.save_pretrained(tmp_path / "tok")
    (tmp_path / "c.json").write_text(json.dumps(SHAREGPT[:1]))
    p = subprocess.run([sys.executable, str(TOKENIZE), "--tokenizer", str(tmp_path / "tok"), str(tmp_path / "c.json"),
                        "--out", str(tmp_path / "p.jsonl")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rec = read_jsonl(tmp_path / "p.jsonl")[0]
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert rec["prompt"] == auto.encode("hello there") and rec["gen_len"] == len(auto.encode("hi how are you", add_special_tokens=False))
    assert rec["gen_len"] == 4
