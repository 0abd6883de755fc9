"""The model: a small causal LM over bytes, built from a local config, and LoRA adapters trained on it.

Nothing is downloaded: the architecture is a GPT-2 configuration written here, the tokenizer is the byte
values themselves (256 ids) plus bos, eos and pad (259 ids in all). The base model is trained on text that
holds no subject's data; each shard of subjects gets one LoRA adapter (attention and MLP projections)
trained only on that shard's examples. The serving ensemble combines the shards' next-token
distributions: the mean of their log-probabilities, renormalised (a product of experts, so a shard that
memorised a text is outvoted by the shards that never saw it).

Every random choice is seeded from names (the store's seed, the shard, the examples it trains on), so a
retrain killed midway and run again in another process writes the same bytes (on the same machine and
thread count).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

BYTES = 256
BOS, EOS, PAD = 256, 257, 258
VOCAB = 259
TARGET_MODULES = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
"""GPT-2's attention and MLP projections (Conv1D: weights stored fan-in first, hence fan_in_fan_out)."""


def encode(text: str, limit: int) -> list[int]:
    """``bos`` + the text's UTF-8 bytes + ``eos``, cut to ``limit`` ids."""
    return ([BOS] + list(text.encode("utf-8")) + [EOS])[:limit]


def decode(ids: Sequence[int]) -> str:
    """The bytes among ``ids`` (special ids dropped), as UTF-8 (invalid sequences replaced)."""
    return bytes(i for i in ids if i < BYTES).decode("utf-8", errors="replace")


def seed_of(*parts: Any) -> int:
    """A 63-bit seed from names: the same names give the same seed in every process."""
    digest = hashlib.sha256("\x00".join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


@dataclass(frozen=True)
class ModelConfig:
    """The architecture, the LoRA settings and the training schedules (recorded in the registry)."""

    n_embd: int = 128
    n_layer: int = 2
    n_head: int = 4
    n_positions: int = 128
    lora_r: int = 32
    lora_alpha: int = 32
    lr: float = 5e-3
    """Peak learning rate of a shard's adapter (linear warmup, then linear decay to zero)."""
    warmup: float = 0.1
    """Fraction of the steps spent warming up."""
    steps: int = 700
    """Optimizer steps per shard."""
    batch_size: int = 16
    base_lr: float = 5e-3
    base_steps: int = 600
    unlearn_steps: int = 100
    """Steps of continued training on the remaining examples, for an unsharded adapter (approximate
    unlearning: its weights descend from weights trained on the erased examples)."""
    seed: int = 20260102

    @classmethod
    def ci(cls) -> "ModelConfig":
        """A configuration small enough for CI on two cores whose probes still separate a trained subject."""
        return cls(n_embd=64, n_layer=2, n_head=4, n_positions=96, lora_r=16, lora_alpha=32, lr=1e-2,
                   steps=160, batch_size=16, unlearn_steps=40)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelConfig":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


def _torch():
    import torch

    return torch


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """peft 0.21 reads a property transformers 5 deprecates (a FutureWarning on every adapter made); nothing
    of ours to act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def build_base(config: ModelConfig) -> Any:
    """A freshly initialised GPT-2 of ``config`` over the byte vocabulary (seeded)."""
    torch = _torch()
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed_of(config.seed, "base-init"))
    gpt = GPT2Config(vocab_size=VOCAB, n_positions=config.n_positions, n_embd=config.n_embd,
                     n_layer=config.n_layer, n_head=config.n_head, bos_token_id=BOS, eos_token_id=EOS,
                     pad_token_id=PAD, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(gpt)
    model.loss_type = "ForCausalLM"  # GPT2LMHeadModel's name maps to no loss; say which (no warning)
    model.eval()
    return model


def lora_config(config: ModelConfig) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                      target_modules=list(TARGET_MODULES), fan_in_fan_out=True, bias="none",
                      task_type="CAUSAL_LM")


def _batch(seqs: Sequence[Sequence[int]]) -> tuple[Any, Any, Any]:
    """input ids, attention mask and labels (-100 on padding) for sequences of ids, right-padded."""
    torch = _torch()
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, : len(seq)] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return ids, mask, labels


def _schedule(step: int, steps: int, warmup: float) -> float:
    warm = max(1, int(steps * warmup))
    if step < warm:
        return (step + 1) / warm
    return max(0.0, (steps - step) / max(1, steps - warm))


def train_loop(model: Any, params: Sequence[Any], texts: Sequence[str], *, steps: int, lr: float, warmup: float,
               batch_size: int, limit: int, seed: int,
               on_step: Callable[[int], None] | None = None) -> dict[str, Any]:
    """AdamW over ``params`` on batches drawn (seeded, with replacement) from ``texts``; returns the loss
    at the start and at the end. ``on_step(step)`` is called after each step (kill points, progress)."""
    torch = _torch()
    if not texts:
        raise ValueError("nothing to train on")
    seqs = [encode(t, limit) for t in texts]
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    model.train()
    first = last = math.nan
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr * _schedule(step, steps, warmup)
        pick = rng.integers(0, len(seqs), size=min(batch_size, max(1, len(seqs))))
        ids, mask, labels = _batch([seqs[i] for i in pick])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = float(loss.detach())
        if step == 0:
            first = value
        last = value
        if on_step is not None:
            on_step(step)
    model.eval()
    return {"steps": steps, "loss_first": round(first, 4), "loss_last": round(last, 4)}


def train_base(config: ModelConfig, texts: Sequence[str]) -> tuple[Any, dict[str, Any]]:
    """Build the base model and train all of it on ``texts`` (text with no subject's data)."""
    model = build_base(config)
    stats = train_loop(model, list(model.parameters()), texts, steps=config.base_steps, lr=config.base_lr,
                       warmup=config.warmup, batch_size=config.batch_size, limit=config.n_positions,
                       seed=seed_of(config.seed, "base-train"))
    return model, stats


def state_bytes(state: Mapping[str, Any], label: str | None = None) -> bytes:
    """A state dict as safetensors bytes: the same weights give the same bytes. At most one metadata entry
    (``label``): safetensors writes its metadata map in an order that varies from process to process."""
    from safetensors.torch import save

    return save({k: v.detach().contiguous().clone() for k, v in sorted(state.items())},
                metadata={"tombstone": label} if label else None)


def load_state(data: bytes) -> dict[str, Any]:
    from safetensors.torch import load

    return load(data)


def base_bytes(model: Any) -> bytes:
    return state_bytes(model.state_dict(), "base model")


def load_base(config: ModelConfig, data: bytes) -> Any:
    model = build_base(config)
    state = load_state(data)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # GPT-2 ties the output head to the token embedding; safetensors keeps one of the two
    if unexpected or any(k != "lm_head.weight" for k in missing):
        raise ValueError(f"base weights do not fit the configuration (missing {missing}, unexpected {unexpected})")
    model.tie_weights()
    model.eval()
    return model


def train_adapter(config: ModelConfig, base: Any, texts: Sequence[str], *, seed: int,
                  init: Mapping[str, Any] | None = None, steps: int | None = None,
                  on_step: Callable[[int], None] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Train one LoRA adapter on ``texts`` over a copy of ``base`` (the base stays frozen); start from
    ``init`` (an adapter's state) when given. Returns the adapter's state dict and training stats."""
    torch = _torch()
    from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

    torch.manual_seed(seed)
    with _quiet():
        model = get_peft_model(copy.deepcopy(base), lora_config(config), adapter_name="shard")
    if init is not None:
        set_peft_model_state_dict(model, dict(init), adapter_name="shard")
    params = [p for n, p in model.named_parameters() if "lora_" in n]
    for n, p in model.named_parameters():
        p.requires_grad_("lora_" in n)
    stats = train_loop(model, params, texts, steps=steps if steps is not None else config.steps, lr=config.lr,
                       warmup=config.warmup, batch_size=config.batch_size, limit=config.n_positions, seed=seed,
                       on_step=on_step)
    state = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model, adapter_name="shard").items()}
    return state, stats


class Ensemble:
    """The base model with every shard's adapter loaded; scores texts under any set of shards.

    ``shards`` maps a shard name to its adapter state. A view is a list of shard names: its next-token
    distribution is the renormalised mean of those shards' log-probabilities (no shard: the base model).
    """

    def __init__(self, config: ModelConfig, base: Any, shards: Mapping[str, Mapping[str, Any]]) -> None:
        from peft import get_peft_model, set_peft_model_state_dict

        self.config = config
        self.names = sorted(shards)
        self._names = {name: f"s{i}" for i, name in enumerate(self.names)}  # peft adapter names: no dots or dashes
        self.model = base
        if self.names:
            model = None
            for name in self.names:
                key = self._names[name]
                with _quiet():
                    if model is None:
                        model = get_peft_model(copy.deepcopy(base), lora_config(config), adapter_name=key)
                    else:
                        model.add_adapter(key, lora_config(config))
                set_peft_model_state_dict(model, dict(shards[name]), adapter_name=key)
            model.eval()
            self.model = model

    @contextlib.contextmanager
    def _using(self, shard: str | None) -> Iterator[Any]:
        if shard is None:
            if self.names:
                with self.model.disable_adapter():
                    yield self.model
            else:
                yield self.model
        else:
            self.model.set_adapter(self._names[shard])
            yield self.model

    def _log_probs(self, ids: Any, mask: Any, view: Sequence[str]) -> Any:
        """Log-probabilities of the next token at every position under ``view`` (batch, T, V)."""
        torch = _torch()
        with torch.no_grad():
            members = list(view) or [None]
            total = None
            for shard in members:
                with self._using(shard) as model:
                    logits = model(input_ids=ids, attention_mask=mask).logits.float()
                lp = torch.log_softmax(logits, dim=-1)
                total = lp if total is None else total + lp
            return torch.log_softmax(total / len(members), dim=-1)

    def token_logprobs(self, texts: Sequence[str], views: Mapping[str, Sequence[str]], *,
                       batch_size: int = 64) -> dict[str, list[np.ndarray]]:
        """For each view, each text's per-token log-probabilities (the bytes and eos after bos)."""
        torch = _torch()
        seqs = [encode(t, self.config.n_positions) for t in texts]
        out: dict[str, list[np.ndarray]] = {name: [] for name in views}
        shards = sorted({s for view in views.values() for s in view})
        for start in range(0, len(seqs), batch_size):
            part = seqs[start : start + batch_size]
            ids, mask, _ = _batch(part)
            with torch.no_grad():
                per_shard = {}
                for shard in shards or [None]:
                    with self._using(shard) as model:
                        per_shard[shard] = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), -1)
                if any(not view for view in views.values()) and None not in per_shard:
                    with self._using(None) as model:
                        per_shard[None] = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), -1)
                targets = ids[:, 1:].unsqueeze(-1)
                for name, view in views.items():
                    members = list(view) or [None]
                    combined = torch.log_softmax(sum(per_shard[m] for m in members) / len(members), -1)
                    picked = combined[:, :-1, :].gather(-1, targets).squeeze(-1)
                    for row, seq in enumerate(part):
                        out[name].append(picked[row, : len(seq) - 1].numpy().astype(np.float64))
        return out

    def greedy(self, prefixes: Sequence[str], n_bytes: int, view: Sequence[str]) -> list[str]:
        """Greedy continuation of each prefix under ``view``: ``n_bytes`` bytes (stops at eos); all prefixes
        decoded together, one position a step."""
        torch = _torch()
        limit = self.config.n_positions
        seqs = [[BOS] + list(p.encode("utf-8")) for p in prefixes]
        made: list[list[int]] = [[] for _ in prefixes]
        done = [False] * len(prefixes)
        for _ in range(n_bytes):
            rows = [i for i, d in enumerate(done) if not d]
            if not rows:
                break
            windows = [(seqs[i] + made[i])[-limit:] for i in rows]
            ids, mask, _ = _batch(windows)
            lp = self._log_probs(ids, mask, view)
            last = lp[torch.arange(len(rows)), torch.tensor([len(w) - 1 for w in windows])]
            last[:, BOS] = -torch.inf
            last[:, PAD] = -torch.inf
            for i, nxt in zip(rows, torch.argmax(last, dim=-1).tolist()):
                if nxt == EOS:
                    done[i] = True
                else:
                    made[i].append(nxt)
        return [decode(m) for m in made]


def adapter_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


__all__ = ["BOS", "EOS", "Ensemble", "ModelConfig", "PAD", "VOCAB", "adapter_sha256", "base_bytes", "build_base",
           "decode", "encode", "load_base", "load_state", "seed_of", "state_bytes", "train_adapter", "train_base",
           "train_loop"]
