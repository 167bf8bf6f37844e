"""Calls a running tessera-serve through OpenAI's own Python client, as a user would.

    .venv/bin/python scripts/openai_client.py http://127.0.0.1:8000 minilm "text one" "text two"

Prints one JSON line: {"model", "embeddings": [[...], ...], "prompt_tokens"}. The client
asks for base64 by default and decodes it; the serve tests compare the floats with the
server's own float responses.
"""
import json
import sys

from openai import OpenAI

url, model, *texts = sys.argv[1:]
client = OpenAI(base_url=url.rstrip("/") + "/v1", api_key="unused", max_retries=0, timeout=120)
r = client.embeddings.create(model=model, input=texts)
print(json.dumps({
    "model": r.model,
    "embeddings": [d.embedding for d in sorted(r.data, key=lambda d: d.index)],
    "prompt_tokens": r.usage.prompt_tokens,
}))
# An unknown model is an OpenAI-shaped 404 the client raises as NotFoundError.
try:
    client.embeddings.create(model="no-such-model", input="x")
    sys.exit("an unknown model did not raise")
except Exception as e:  # noqa: BLE001 - the client's error class is the check
    if type(e).__name__ != "NotFoundError":
        sys.exit(f"an unknown model raised {type(e).__name__}: {e}")
