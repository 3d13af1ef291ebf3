"""Where llama-cpp-python cuts a completion that one token ends with two stop strings.

Run: ``PYTHONPATH=$PWD python3 benchmarks/llamacpp_stop_order.py`` (needs the ``[server]`` extra and
the packaged SmolLM2-135M-Instruct Q4_1 GGUF).  Starts the llama.cpp pair of
:func:`specverify.testing.llama_servers.llama_pair` and sends both servers one greedy request whose
first token, ``'\\n   '`` (a newline and three spaces, one token of SmolLM2's vocabulary), holds
the stop strings ``"\\n"`` and ``" "``; the stop list in both orders, and the first order streamed.
Under the OpenAI contract ("the returned text will not contain the stop sequence") the text ends
before the earliest occurrence of any stop string: here the empty string, whatever the order.
Each response is printed with its request, its text, ``finish_reason`` and ``logprobs.tokens``.
"""

from __future__ import annotations

import json

import httpx

from specverify.testing.llama_servers import llama_pair

PROMPT = "def f(x):"
STOP_ORDERS = ((" ", "\n"), ("\n", " "))


def _streamed_text(client: httpx.Client, url: str, body: dict) -> tuple[str, str | None]:
    text, finish = "", None
    with client.stream("POST", f"{url}/completions", json=dict(body, stream=True)) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[len("data: "):])["choices"][0]
            text += choice["text"]
            finish = choice.get("finish_reason") or finish
    return text, finish


def main() -> None:
    with llama_pair() as pair, httpx.Client(timeout=120.0) as client:
        for name, url in (("baseline", pair.baseline), ("candidate", pair.candidate)):
            for stop in STOP_ORDERS:
                body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0.0, "logprobs": 1, "stop": list(stop)}
                choice = client.post(f"{url}/completions", json=body).json()["choices"][0]
                print(f"{name}: {json.dumps(body)}\n  text {choice['text']!r}, finish_reason "
                      f"{choice['finish_reason']!r}, tokens {choice['logprobs']['tokens']}")
            body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0.0, "stop": list(STOP_ORDERS[0])}
            text, finish = _streamed_text(client, url, body)
            print(f"{name}, streamed: {json.dumps(body)}\n  text {text!r}, finish_reason {finish!r}")


if __name__ == "__main__":
    main()
