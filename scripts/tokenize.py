#!/usr/bin/env python3
"""Turn text into FastDecode workload files (workload.prompts / workload.score), and generated tokens back into text.

    tokenize.py --tokenizer DIR_OR_NAME INPUT --out prompts.jsonl [--gen-len N] [--max-prompt-len N]
                [--paragraphs] [--chat-template] [--score]
    tokenize.py --tokenizer DIR_OR_NAME --detokenize RUN_DIR/requests.jsonl [--out texts.jsonl]

INPUT is either
  * a plain text file: one prompt per non-empty line (--paragraphs: blank-line separated paragraphs), or
  * a .json / .jsonl file of conversations in ShareGPT's layout, {"conversations": [{"from": "human" | "gpt",
    "value": ...}, ...]}, or OpenAI-style {"messages": [{"role": "user" | "assistant", "content": ...}]} (a
    JSON file holds a list of them, a JSONL file one a line).
One request per prompt / conversation. For conversations the prompt is the first human turn and, following
vLLM's benchmark convention (benchmarks/benchmark_serving.py, ShareGPT), gen_len is the token length of the
first gpt reply after it; conversations without such a reply are left out. --gen-len N sets every gen_len
instead (required for plain text). --max-prompt-len N leaves out (not truncates) longer prompts. Every left-out
item is counted on stderr.

--score writes {"prompt", "continuation"} lines (workload.score, teacher-forced scoring): for conversations the
continuation is the tokenized first reply; for plain text the whole text is scored: prompt = its first token
(the BOS token when the tokenizer adds one), continuation = the rest.

--chat-template applies the tokenizer's chat template to the human turn (add_generation_prompt) when it has
one (an error otherwise); without it the prompt is tokenizer.encode(text) with the tokenizer's special tokens.
Replies / continuations are encoded without special tokens.

--detokenize reads a run folder's requests.jsonl (fd-bench run: one line per request with "id", "prompt",
"tokens") and writes one JSON line per request {"id", "prompt_text", "text"} to --out, or prints
"ID<TAB>TEXT" lines when --out is not given.

Needs transformers (AutoTokenizer: a local folder or a hub name) or, for a folder with tokenizer.json, the
tokenizers package; without either it exits 2 saying so. Exit 2 on bad input, naming the file and line.
"""
from __future__ import annotations

import os
import sys

# This file is called tokenize.py: keep its folder off sys.path, or the standard library's own `tokenize`
# module (imported by linecache, inspect, transformers ...) would resolve to it.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402


class InputError(Exception):
    """Bad input (exit 2); the message names the file and, where there is one, the line."""


HUMAN = {"human", "user"}
REPLY = {"gpt", "assistant", "chatgpt", "bard", "bing", "model"}


# ---------------------------------------------------------------------------------------------------------
# reading inputs


def read_text(path: str, paragraphs: bool = False) -> list[str]:
    """One prompt per non-empty line, or per blank-line separated paragraph (inner newlines kept)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if not paragraphs:
        return [line.strip() for line in text.splitlines() if line.strip()]
    out, cur = [], []
    for line in text.splitlines():
        if line.strip():
            cur.append(line.rstrip())
        elif cur:
            out.append("\n".join(cur).strip())
            cur = []
    if cur:
        out.append("\n".join(cur).strip())
    return out


def _turns(rec, where):
    """[(role, text), ...] of one conversation record, roles normalised to 'human' / 'reply' / other."""
    if not isinstance(rec, dict):
        raise InputError(f"{where}: expected a JSON object with \"conversations\" or \"messages\"")
    if "conversations" in rec:
        turns, rk, tk = rec["conversations"], "from", "value"
    elif "messages" in rec:
        turns, rk, tk = rec["messages"], "role", "content"
    else:
        raise InputError(f"{where}: no \"conversations\" (ShareGPT) or \"messages\" (OpenAI-style) key")
    if not isinstance(turns, list):
        raise InputError(f"{where}: the turns must be a list")
    out = []
    for t in turns:
        if not isinstance(t, dict) or not isinstance(t.get(rk), str) or not isinstance(t.get(tk), str):
            raise InputError(f"{where}: every turn needs string \"{rk}\" and \"{tk}\"")
        role = t[rk].lower()
        out.append(("human" if role in HUMAN else "reply" if role in REPLY else role, t[tk]))
    return out


def read_conversations(path: str) -> list[tuple[str, str | None, str]]:
    """[(first human turn, first reply after it or None, 'FILE:LINE' or 'FILE[i]'), ...]; records with no
    human turn are given as (None, None, where)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    records = []
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except ValueError as e:
            raise InputError(f"{path}: not JSON ({e})")
        records = [(rec, f"{path}[{i}]") for i, rec in enumerate(data)]
    else:
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append((json.loads(line), f"{path}:{n}"))
            except ValueError as e:
                raise InputError(f"{path}:{n}: not JSON ({e})")
    out = []
    for rec, where in records:
        turns = _turns(rec, where)
        h = next((i for i, (r, _) in enumerate(turns) if r == "human"), None)
        if h is None:
            out.append((None, None, where))
            continue
        reply = next((t for r, t in turns[h + 1:] if r == "reply"), None)
        out.append((turns[h][1], reply, where))
    return out


def is_conversation_file(path: str) -> bool:
    return path.endswith((".json", ".jsonl"))


# ---------------------------------------------------------------------------------------------------------
# tokenizing (any object with encode(text, add_special_tokens=...) and decode(ids); apply_chat_template for
# --chat-template)


def encode_prompt(tok, text: str, chat_template: bool = False) -> list[int]:
    if chat_template:
        if not getattr(tok, "chat_template", None) or not hasattr(tok, "apply_chat_template"):
            raise InputError("--chat-template: this tokenizer has no chat template")
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict):  # some versions return a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    return [int(i) for i in tok.encode(text, add_special_tokens=True)]


def encode_reply(tok, text: str) -> list[int]:
    return [int(i) for i in tok.encode(text, add_special_tokens=False)]


def make_records(tok, items, *, conversations: bool, gen_len=None, max_prompt_len=None, score=False,
                 chat_template=False):
    """items: prompts (plain text) or read_conversations() tuples. Returns (records, skipped) where skipped
    is {reason: count}. Records are workload.prompts lines ({"prompt", "gen_len"}) or, with score,
    workload.score lines ({"prompt", "continuation"})."""
    if not score and gen_len is None and not conversations:
        raise InputError("plain text has no reply to take gen_len from: give --gen-len N (or --score)")
    if gen_len is not None and gen_len < 1:
        raise InputError("--gen-len must be >= 1")
    recs, skipped = [], {}

    def skip(why):
        skipped[why] = skipped.get(why, 0) + 1

    for item in items:
        if conversations:
            human, reply, _ = item
            if human is None:
                skip("no human turn")
                continue
            if reply is None and (score or gen_len is None):
                skip("no reply after the first human turn")
                continue
            prompt = encode_prompt(tok, human, chat_template)
            cont = encode_reply(tok, reply) if reply is not None else []
        else:
            if score:
                ids = encode_prompt(tok, item, chat_template)
                prompt, cont = ids[:1], ids[1:]
            else:
                prompt, cont = encode_prompt(tok, item, chat_template), []
        if not prompt:
            skip("empty prompt")
            continue
        if max_prompt_len is not None and len(prompt) > max_prompt_len:
            skip(f"prompt longer than --max-prompt-len {max_prompt_len}")
            continue
        if score:
            if not cont:
                skip("empty continuation")
                continue
            recs.append({"prompt": prompt, "continuation": cont})
        else:
            n = gen_len if gen_len is not None else len(cont)
            if n < 1:
                skip("empty reply (gen_len 0)")
                continue
            recs.append({"prompt": prompt, "gen_len": n})
    return recs, skipped


def detokenize(tok, requests_path: str):
    """[{"id", "prompt_text", "text"}] from a run folder's requests.jsonl."""
    out = []
    with open(requests_path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError as e:
                raise InputError(f"{requests_path}:{n}: not JSON ({e})")
            if not isinstance(r, dict) or "tokens" not in r or "id" not in r:
                raise InputError(f"{requests_path}:{n}: not a requests.jsonl line (needs \"id\" and \"tokens\")")
            out.append({"id": r["id"], "prompt_text": tok.decode(r.get("prompt", [])), "text": tok.decode(r["tokens"])})
    return out


# ---------------------------------------------------------------------------------------------------------
# the real tokenizer


class _TokenizersWrapper:
    """encode/decode over a tokenizers.Tokenizer (a folder with tokenizer.json, no transformers)."""

    chat_template = None

    def __init__(self, t):
        self.t = t

    def encode(self, text, add_special_tokens=True):
        return self.t.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids):
        return self.t.decode(list(ids))


def load_tokenizer(name: str):
    try:
        from transformers import AutoTokenizer
    except ImportError:
        AutoTokenizer = None
    if AutoTokenizer is not None:
        return AutoTokenizer.from_pretrained(name)
    path = os.path.join(name, "tokenizer.json")
    try:
        import tokenizers
    except ImportError:
        raise InputError("neither transformers nor tokenizers is installed for " + sys.executable +
                         ": run tokenize.py where they are (pip install transformers), e.g. on the GPU machine")
    if not os.path.isfile(path):
        raise InputError(f"transformers is not installed and {path} does not exist (the tokenizers package alone "
                         "reads a folder's tokenizer.json): install transformers for hub names")
    return _TokenizersWrapper(tokenizers.Tokenizer.from_file(path))


def write_jsonl(path: str, recs) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main(argv=None, tokenizer=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=tokenizer is None, help="a tokenizer folder or hub name (AutoTokenizer)")
    ap.add_argument("input", nargs="?", help="plain text, or .json / .jsonl conversations (ShareGPT / OpenAI layout)")
    ap.add_argument("--out", help="the JSONL to write (required unless --detokenize)")
    ap.add_argument("--gen-len", type=int, help="gen_len of every request (default: the first reply's token length)")
    ap.add_argument("--max-prompt-len", type=int, help="leave out prompts with more tokens than this")
    ap.add_argument("--paragraphs", action="store_true", help="plain text: blank-line separated prompts")
    ap.add_argument("--chat-template", action="store_true", help="apply the tokenizer's chat template to the prompt")
    ap.add_argument("--score", action="store_true", help="write workload.score lines {prompt, continuation}")
    ap.add_argument("--detokenize", metavar="REQUESTS_JSONL", help="decode a run folder's requests.jsonl instead")
    a = ap.parse_args(argv)
    try:
        if a.detokenize:
            if a.input:
                ap.error("--detokenize takes no INPUT")
            tok = tokenizer or load_tokenizer(a.tokenizer)
            texts = detokenize(tok, a.detokenize)
            if a.out:
                write_jsonl(a.out, texts)
                print(f"tokenize.py: wrote {len(texts)} texts to {a.out}", file=sys.stderr)
            else:
                for t in texts:
                    print(f"{t['id']}\t{t['text']}")
            return 0
        if not a.input or not a.out:
            ap.error("give INPUT and --out (or --detokenize)")
        if not os.path.isfile(a.input):
            raise InputError(f"{a.input}: no such file")
        conv = is_conversation_file(a.input)
        items = read_conversations(a.input) if conv else read_text(a.input, a.paragraphs)
        tok = tokenizer or load_tokenizer(a.tokenizer)
        recs, skipped = make_records(tok, items, conversations=conv, gen_len=a.gen_len, max_prompt_len=a.max_prompt_len,
                                     score=a.score, chat_template=a.chat_template)
        if not recs:
            raise InputError(f"{a.input}: no request left to write" +
                             (" (" + ", ".join(f"{k}: {v}" for k, v in skipped.items()) + ")" if skipped else ""))
        write_jsonl(a.out, recs)
        kind = "workload.score" if a.score else "workload.prompts"
        msg = f"tokenize.py: wrote {len(recs)} requests ({kind}) to {a.out}"
        if skipped:
            msg += "; left out " + ", ".join(f"{v} ({k})" for k, v in skipped.items())
        print(msg, file=sys.stderr)
        return 0
    except InputError as e:
        print(f"tokenize.py: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"tokenize.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
