"""Disaggregated serving in miniature: a prefill process computes a prompt's
KV cache and WRITEs it, block by block, into a decode process's registered
buffer with NIXL (one notification), and the decode process continues the
generation from it.  The model is a toy causal transformer in torch (fixed
seed, no downloaded weights).

    # one process doing both (the reference for the two below)
    python examples/nixl_kv_disagg.py single
    # two processes on ucxpy's libucp, started separately (one job key)
    ucxpy-ucx --key-file /tmp/kv.key python examples/nixl_kv_disagg.py decode /tmp/kv &
    ucxpy-ucx --key-file /tmp/kv.key python examples/nixl_kv_disagg.py prefill /tmp/kv

Both print the generated tokens and a SHA-256 of every decode step's
logits: the decode process computes the same steps on the same bytes, so
tokens and logits are equal bitwise to the single process's.  The metadata
(agent metadata, the decode buffer's descriptors) go through files in the
directory given; the KV cache itself goes by NIXL WRITEs.
"""
from __future__ import annotations

import hashlib
import os
import sys
import time

import torch

VOCAB, DIM, LAYERS = 96, 64, 2
BLOCK = 4                           # tokens per KV block (one NIXL descriptor each)
MAX_BLOCKS = 16
PROMPT = [5, 17, 42, 8, 77, 3, 19, 64, 23, 11, 90, 31, 2, 56]
NEW_TOKENS = 12
TIMEOUT = float(os.environ.get("KV_TIMEOUT", "60"))


class Toy(torch.nn.Module):
    """Single-head causal attention blocks with an MLP; the KV cache is one
    contiguous tensor ``[positions, layers, 2, DIM]``: a block of BLOCK
    positions (their K and V in every layer) is one contiguous range of
    bytes, one NIXL descriptor."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1234)
        self.emb = torch.nn.Parameter(torch.randn(VOCAB, DIM, generator=g) * 0.5)
        self.pos = torch.nn.Parameter(torch.randn(MAX_BLOCKS * BLOCK, DIM, generator=g) * 0.1)
        self.qkv = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(DIM, 3 * DIM, generator=g) / DIM ** 0.5)
             for _ in range(LAYERS)])
        self.mlp = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(DIM, DIM, generator=g) / DIM ** 0.5)
             for _ in range(LAYERS)])
        self.out = torch.nn.Parameter(torch.randn(DIM, VOCAB, generator=g) / DIM ** 0.5)

    @staticmethod
    def new_cache() -> torch.Tensor:
        return torch.zeros(MAX_BLOCKS * BLOCK, LAYERS, 2, DIM)

    def step(self, tokens: list, start: int, cache: torch.Tensor) -> torch.Tensor:
        """Run ``tokens`` at positions ``start..``: their K/V go into
        ``cache``, attention reads every position before them from it;
        returns the last position's logits."""
        n = len(tokens)
        x = self.emb[torch.tensor(tokens)] + self.pos[start:start + n]
        for layer in range(LAYERS):
            q, k, v = (x @ self.qkv[layer]).split(DIM, dim=1)
            cache[start:start + n, layer, 0] = k
            cache[start:start + n, layer, 1] = v
            keys = cache[:start + n, layer, 0]
            vals = cache[:start + n, layer, 1]
            scores = (q @ keys.T) / DIM ** 0.5
            mask = torch.arange(start + n)[None, :] > torch.arange(start, start + n)[:, None]
            att = scores.masked_fill(mask, float("-inf")).softmax(dim=1)
            x = x + att @ vals
            x = x + torch.tanh(x @ self.mlp[layer])
        return (x[-1] @ self.out).detach()


def prefill(model: Toy, cache: torch.Tensor) -> int:
    """The prompt's KV cache into ``cache``; the first generated token."""
    with torch.no_grad():
        return int(model.step(PROMPT, 0, cache).argmax())


def decode(model: Toy, cache: torch.Tensor, first: int) -> tuple:
    """Greedy generation from the prompt's cache: the tokens and the SHA-256
    of every step's logits."""
    tokens, h, pos = [first], hashlib.sha256(), len(PROMPT)
    with torch.no_grad():
        for _ in range(NEW_TOKENS - 1):
            logits = model.step([tokens[-1]], pos, cache)
            h.update(logits.numpy().tobytes())
            tokens.append(int(logits.argmax()))
            pos += 1
    return tokens, h.hexdigest()


def report(tokens: list, digest: str) -> None:
    print(f"tokens {' '.join(map(str, tokens))}", flush=True)
    print(f"logits sha256 {digest}", flush=True)


# -- the two processes ------------------------------------------------------------------
def _agent(name: str):
    from nixl_cu12._api import nixl_agent, nixl_agent_config   # (deferred: single needs none)
    return nixl_agent(name, nixl_agent_config(backends=["UCX"]))


def _blocks(cache: torch.Tensor, n: int) -> list:
    size = BLOCK * cache[0].numel() * cache.element_size()
    return [(cache.data_ptr() + b * size, size, 0) for b in range(n)]


def put_file(path: str, data: bytes) -> None:
    """``data`` into ``path``, whole or not at all (how the processes swap
    their metadata here: any shared channel will do)."""
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def get_file(path: str, timeout: float = TIMEOUT) -> bytes:
    """The contents of ``path`` once the other process has put it there."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path} after {timeout} s")
        time.sleep(0.01)
    with open(path, "rb") as f:
        return f.read()


def run_decode(d: str) -> None:
    model, cache = Toy(), Toy.new_cache()
    ag = _agent("decode")
    ag.register_memory([(cache.data_ptr(), cache.numel() * cache.element_size(), 0, "")], "DRAM")
    put_file(os.path.join(d, "decode.descs"),
         ag.get_serialized_descs(ag.get_xfer_descs(_blocks(cache, MAX_BLOCKS), "DRAM")))
    put_file(os.path.join(d, "decode.meta"), ag.get_agent_metadata())
    ag.add_remote_agent(get_file(os.path.join(d, "prefill.meta")))
    put_file(os.path.join(d, "decode.ready"), b"")   # (both know each other: go)
    deadline = time.monotonic() + TIMEOUT
    while True:                                   # the one notification: "kv <tokens> <first>"
        notes = ag.get_new_notifs().get("prefill", [])
        if notes:
            _, ntok, first = notes[0].decode().split()
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"no KV notification after {TIMEOUT} s")
        time.sleep(0.0005)
    assert int(ntok) == len(PROMPT)
    report(*decode(model, cache, int(first)))


def run_prefill(d: str) -> None:
    model, cache = Toy(), Toy.new_cache()
    first = prefill(model, cache)
    nblocks = -(-len(PROMPT) // BLOCK)
    ag = _agent("prefill")
    ag.register_memory([(cache.data_ptr(), cache.numel() * cache.element_size(), 0, "")], "DRAM")
    put_file(os.path.join(d, "prefill.meta"), ag.get_agent_metadata())
    ag.add_remote_agent(get_file(os.path.join(d, "decode.meta")))
    remote = ag.deserialize_descs(get_file(os.path.join(d, "decode.descs")))
    get_file(os.path.join(d, "decode.ready"))
    dst = [remote[b] for b in range(nblocks)]
    h = ag.initialize_xfer("WRITE", ag.get_xfer_descs(_blocks(cache, nblocks), "DRAM"),
                           ag.get_xfer_descs(dst, "DRAM"), "decode",
                           f"kv {len(PROMPT)} {first}".encode())
    state, deadline = ag.transfer(h), time.monotonic() + TIMEOUT
    while state != "DONE":
        if state == "ERR" or time.monotonic() > deadline:
            raise RuntimeError(f"the KV cache's WRITE ended in {state}")
        state = ag.check_xfer_state(h)
    ag.release_xfer_handle(h)
    print(f"prefill: {nblocks} blocks of {BLOCK} tokens written, first token {first}",
          flush=True)


def main() -> None:
    torch.set_num_threads(1)            # (the same reductions in every process: bitwise)
    mode = sys.argv[1] if len(sys.argv) > 1 else "single"
    if mode == "single":
        model, cache = Toy(), Toy.new_cache()
        report(*decode(model, cache, prefill(model, cache)))
    elif mode == "decode":
        run_decode(sys.argv[2])
    elif mode == "prefill":
        run_prefill(sys.argv[2])
    else:
        sys.exit(f"usage: {sys.argv[0]} single | prefill DIR | decode DIR")


if __name__ == "__main__":
    main()
