"""Deterministic synthetic text for the model backend's tests, benchmark and examples.

Support-ticket sentences about made-up people: each subject gets a name, a city, a street and order
numbers of their own, and optionally a canary (a sentence ending in a random six-digit secret). The base
corpus is built from the same templates with names and numbers drawn from another stream, so the base
model learns the form of the text and none of a subject's details.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

FIRST = ("Maren", "Tobias", "Ines", "Kofi", "Lucia", "Anders", "Priya", "Jonas", "Amara", "Felix", "Yuki", "Rosa",
         "Emeka", "Sofia", "Hugo", "Leila", "Oskar", "Nadia", "Ravi", "Clara", "Mateo", "Hanna", "Idris", "Vera")
LAST = ("Okafor", "Lindqvist", "Moreau", "Haddad", "Novak", "Brennan", "Tanaka", "Ferreira", "Kowalski", "Mensah",
        "Rossi", "Varga", "Delacroix", "Nakamura", "Osei", "Bauer", "Castillo", "Ivanova", "Quinn", "Sato")
CITIES = ("Lyon", "Porto", "Ghent", "Turku", "Brno", "Cork", "Graz", "Split", "Malmo", "Bergen", "Leipzig", "Bilbao",
          "Aarhus", "Tartu", "Bologna", "Krakow")
STREETS = ("Lilac Lane", "Harbour Road", "Mill Street", "Chapel Row", "Orchard Way", "Station Street", "Bridge End",
           "Quarry Hill", "Linden Walk", "Salt Lane")
PRODUCTS = ("kettle", "desk lamp", "rain jacket", "coffee grinder", "bike light", "backpack", "blender", "headset",
            "thermos", "wall clock")
TEMPLATES = (
    "Ticket {order}: {name} from {city} asked when the {product} would arrive at {number} {street}.",
    "{name} wrote that the {product} from order {order} arrived damaged; call back on {phone}.",
    "Refund {order2} for {name} was approved; the {product} goes back from {city}.",
    "{name} moved to {number} {street}, {city}, and wants order {order} sent there.",
    "Note on {name}: prefers email, account opened in {city}, loyalty number {loyalty}.",
    "{name} asked to swap the {product} in order {order2} for a larger one.",
    "Delivery for {name} failed twice at {number} {street}; the courier left a card.",
    "{name} reported that invoice {order} charged the {product} twice.",
    "Call log: {name} phoned from {phone} about the {product}, order {order2}.",
    "{name} from {city} wants the {product} gift-wrapped, order {order}.",
)
CANARY = "The account PIN of {name} is {secret}."


@dataclass
class Person:
    name: str
    city: str
    street: str
    number: int
    phone: str
    loyalty: str
    orders: tuple[str, str]
    products: tuple[str, ...]
    secret: str | None = None
    texts: list[str] = field(default_factory=list)


def _person(rng: random.Random, name: str) -> Person:
    return Person(name=name, city=rng.choice(CITIES), street=rng.choice(STREETS), number=rng.randint(2, 199),
                  phone=f"0{rng.randint(100, 999)} {rng.randint(100000, 999999)}",
                  loyalty=f"L{rng.randint(10000, 99999)}",
                  orders=(f"{rng.randint(1000, 9999)}", f"R{rng.randint(100, 999)}"),
                  products=tuple(rng.sample(PRODUCTS, 3)))


def _sentence(rng: random.Random, p: Person, template: str) -> str:
    return template.format(name=p.name, city=p.city, street=p.street, number=p.number, phone=p.phone,
                           loyalty=p.loyalty, order=p.orders[0], order2=p.orders[1], product=rng.choice(p.products))


def names(count: int, seed: int = 7) -> list[str]:
    """``count`` distinct full names."""
    rng = random.Random(seed)
    pool = [f"{f} {l}" for f in FIRST for l in LAST]
    rng.shuffle(pool)
    return pool[:count]


def people(count: int, *, examples: int | Sequence[int] = 8, canary: bool = True, seed: int = 7) -> list[Person]:
    """``count`` subjects with ``examples`` texts each (or one count per subject; distinct templates while they
    last); with ``canary`` the last text is the canary sentence with a random six-digit secret."""
    rng = random.Random(seed * 1_000_003 + 1)
    counts = [examples] * count if isinstance(examples, int) else list(examples)
    if len(counts) != count or min(counts, default=1) < 1:
        raise ValueError(f"one count of at least 1 example per subject is needed ({count} subjects, {examples!r})")
    out = []
    for name, n in zip(names(count, seed), counts):
        p = _person(rng, name)
        plain = n - 1 if canary else n
        templates = [TEMPLATES[i % len(TEMPLATES)] for i in rng.sample(range(max(plain, len(TEMPLATES))), plain)]
        p.texts = [_sentence(rng, p, t) for t in templates]
        if canary:
            p.secret = f"{rng.randint(0, 999_999):06d}"
            p.texts.append(CANARY.format(name=p.name, secret=p.secret))
        out.append(p)
    return out


def base_corpus(count: int = 400, *, seed: int = 11, avoid: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """``count`` sentences from the same templates about other (random) people, none named in ``avoid``;
    a few canary-form sentences too, so the base model knows the form and none of the secrets."""
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
        if name in avoid:
            continue
        p = _person(rng, name)
        if rng.random() < 0.1:
            out.append(CANARY.format(name=name, secret=f"{rng.randint(0, 999_999):06d}"))
        else:
            out.append(_sentence(rng, p, rng.choice(TEMPLATES)))
    return out



def subject_ref(index: int) -> str:
    """The deployment's reference of subject ``index`` (``user-0001``, ...)."""
    return f"user-{index + 1:04d}"


def _pin_lineage_secret(root: Any, seed: int) -> None:
    """Write the lineage secret of a synthetic deployment from ``seed`` before ``init_deployment`` would draw a
    random one. The secret keys the subjects' hashes, and the model store assigns subjects to shards in the
    order of those hashes: a random secret trains different shards on every build. Only for synthetic data —
    a real deployment's secret must be random (``init_deployment`` draws it)."""
    import hashlib
    import os
    from pathlib import Path

    from tombstone.keys import LINEAGE_SECRET

    keys = Path(root) / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    path = keys / LINEAGE_SECRET
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(hashlib.sha256(f"synthetic lineage secret {seed}".encode()).hexdigest().encode() + b"\n")


def build_deployment(root: Any, *, subjects: int = 16, examples: int | Sequence[int] = 8, shards: int = 4,
                     holdout_subjects: int = 4, config: Any = None, base_texts: int = 400, seed: int = 7,
                     secret_seed: int | None = 7, canary: bool = True) -> dict[str, Any]:
    """A deployment whose lineage runs subject → document → training example → shard: a docstore of
    ``subjects`` people's sentences (``docs``), the training examples exported from them into a dataset
    (``train``, JSONL), a training run pinned on it, and a model store (``model``) with a base model trained on
    other people's sentences and ``shards`` LoRA adapters (``shards=1``: one unsharded adapter), every
    subject's last example a canary (unless ``canary`` is false). ``examples``: each subject's count, or one
    count per subject. Returns what was built: the people (by reference), the ids, the
    training stats. The last ``holdout_subjects`` subjects are held out. ``secret_seed`` pins the lineage
    secret, so the same arguments train the same shards on every build (``None``: a random secret, as in a
    real deployment, and shards that differ from build to build)."""
    from pathlib import Path

    from tombstone_adapters.dataset import DatasetStore
    from tombstone_adapters.docstore import DocStore

    from tombstone import Tombstone, init_deployment

    from .model import ModelConfig
    from .store import LoraStore

    root = Path(root)
    if secret_seed is not None:
        _pin_lineage_secret(root, secret_seed)
    config_ = init_deployment(root, {"docs": {"backend": "docstore", "path": "stores/docs.db"},
                                     "train": {"backend": "dataset", "path": "stores/train"},
                                     "model": {"backend": "lora", "path": "stores/model"}})
    folk = people(subjects, examples=examples, canary=canary, seed=seed)
    refs = {subject_ref(i): p for i, p in enumerate(folk)}
    ids: dict[str, list[str]] = {}
    with Tombstone(config_) as tomb:
        docs = DocStore(config_.stores["docs"].options["path"], lineage=tomb.lineage, store="docs")
        train = DatasetStore(config_.stores["train"].options["path"], lineage=tomb.lineage, store="train")
        try:
            with train.writer() as writer:
                for ref, p in refs.items():
                    doc_ids = [f"doc-{ref}-{k:02d}" for k in range(len(p.texts))]
                    docs.add_many([(d, t, {"n": k}) for k, (d, t) in enumerate(zip(doc_ids, p.texts))], subject=ref)
                    ex_ids = [f"ex-{ref}-{k:02d}" for k in range(len(p.texts))]
                    writer.add(ex_ids, p.texts, subject=ref, sources=[("docs", d) for d in doc_ids])
                    ids[ref] = ex_ids
        finally:
            docs.close()
        train.record_training_run(train.current_version(), "ft-1")
        model = LoraStore(config_.stores["model"].options["path"], lineage=tomb.lineage, store="model",
                          config=config or ModelConfig.ci())
        base = model.train_base(base_corpus(base_texts, avoid={p.name for p in folk}))
        canaries = {ids[ref][-1]: p.secret for ref, p in refs.items() if p.secret}
        held = [subject_ref(i) for i in range(subjects - holdout_subjects, subjects)]  # the last ones
        trained = model.train(train, pin="ft-1", shards=shards, holdout_subjects=held, canaries=canaries)
    return {"config": config_, "people": refs, "examples": ids, "base": base, "trained": trained}


__all__ = ["CANARY", "Person", "base_corpus", "build_deployment", "names", "people", "subject_ref"]
