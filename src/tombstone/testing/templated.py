"""A deterministic templated corpus: many people's documents written from the same few templates.

Support notes, forms and letters of a customer service: every subject has a few documents, each filled
from one template with that person's own details (a name, a date, an amount, an order number, a product,
a city, an agent). Most documents are rigid forms (every word fixed but the details; a form is used by a
few people, some by only two), the others free notes (sentences chosen from several). Two filled copies of
one form differ only in those details, so under an embedder like MiniLM they are at cosine 0.85–0.95,
where two unrelated documents are at 0.7–0.8: the corpus mixes near-twins of other people with ordinary
neighbours — the case the semantic level's controls must be calibrated for
(``tests/core/test_semantic_templated.py``, ``benchmarks/semantic_templated.py``).

A **near-copy** of a document (a few words changed) can be planted under another subject, as in
:mod:`tombstone.testing.echoes`. The same arguments always give the same texts on every machine.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tombstone.testing.echoes import FILLERS

FIRST = ("Amara", "Bjorn", "Chen", "Dalia", "Emeka", "Fatima", "Goran", "Hana", "Ines", "Jonas", "Kavya", "Lars",
         "Mateo", "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Sven", "Tariq", "Umaima", "Viktor", "Wen", "Ximena",
         "Yusuf", "Zofia", "Aiko", "Bruno", "Clara", "Dmitri")
LAST = ("Okafor", "Lindqvist", "Haddad", "Nwosu", "Petrovic", "Sato", "Carvalho", "Weber", "Iyer", "Eriksen",
        "Rossi", "Benali", "Nowak", "Raman", "Moreau", "Delgado", "Olsen", "Aziz", "Khan", "Horvath", "Torres",
        "Demir", "Kowalska", "Tanaka", "Costa", "Jensen", "Volkov", "Yilmaz", "Bauer", "Novak")
CITIES = ("Lisbon", "Rotterdam", "Krakow", "Tampere", "Bilbao", "Graz", "Leeds", "Ghent", "Bergen", "Turin",
          "Malmo", "Porto", "Dresden", "Cork", "Brno", "Lyon", "Aarhus", "Seville", "Utrecht", "Bologna")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
PRODUCTS = ("a kettle", "a desk lamp", "running shoes", "a phone case", "a coffee grinder", "headphones",
            "a rain jacket", "a blender", "a backpack", "a monitor stand", "bed linen", "a toaster")
AGENTS = ("Alex", "Sam", "Robin", "Kim", "Jordan", "Charlie")

TITLES = ("Refund request", "Address change", "Delivery complaint", "Subscription cancellation", "Warranty claim",
          "Return authorisation", "Invoice correction", "Account closure", "Loyalty points transfer", "Price match request",
          "Damaged goods report", "Payment dispute")
FIELDS = (("Customer", "{name}"), ("Customer number", "{customer}"), ("Order number", "{order}"), ("Date", "{date}"),
          ("Amount", "{amount}"), ("City", "{city}"), ("Item", "{product}"), ("Handled by", "agent {agent}"))
OUTCOMES = ("Decision: approved.", "Decision: rejected, outside the return period.", "Status: waiting for the warehouse.",
            "Status: forwarded to the finance team.", "A confirmation letter was sent.", "The case was closed.")


def form_templates(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct rigid forms: a title, five labelled fields in an order of their own, an outcome."""
    rng = random.Random(f"tombstone-templated/forms/{seed}")
    out: list[str] = []
    while len(out) < n:
        fields = [FIELDS[0]] + rng.sample(FIELDS[1:], 4)
        rng.shuffle(fields)
        text = f"{rng.choice(TITLES)} form. " + " ".join(f"{label}: {value}." for label, value in fields) + " " + rng.choice(OUTCOMES)
        if text not in out:
            out.append(text)
    return out


NOTE_OPENINGS = ("{name} called support on {date} about order {order}.",
                 "Chat with {name} on {date} regarding order {order}.",
                 "Email from {name} received {date}, order {order}.")
NOTE_SENTENCES = ("The customer said {product} stopped working after a week.",
                  "The parcel for {city} was returned to the warehouse.",
                  "A voucher worth {amount} was offered as an apology.",
                  "The customer asked whether the warranty covers {product}.",
                  "Payment of {amount} was charged twice by mistake.",
                  "The courier left the parcel with a neighbour in {city}.",
                  "The customer wants to exchange {product} for another colour.",
                  "Store credit of {amount} was added to the account.",
                  "The tracking page has not updated for five days.",
                  "The customer was unhappy with the waiting time on the phone.",
                  "The discount code {order} was not accepted at checkout.",
                  "The customer asked for an invoice with the company address in {city}.",
                  "A partial refund of {amount} was agreed for the late delivery.",
                  "The customer reported that {product} was missing from the box.",
                  "The account password was reset at the customer's request.",
                  "The customer asked to change the delivery date.")
NOTE_CLOSINGS = ("Follow-up promised by {agent}.", "Ticket closed by {agent}.", "Escalated to the team lead by {agent}.")


@dataclass(frozen=True)
class TemplatedDocument:
    """One document: its subject (``subject-NNN``), its template (``form-K`` or ``note``) and its text."""

    index: int
    subject: int
    template: str
    text: str


def _details(rng: random.Random, subject: int) -> dict[str, str]:
    return {"name": f"{FIRST[subject % len(FIRST)]} {LAST[(subject * 7 + subject // len(FIRST)) % len(LAST)]}",
            "customer": f"C-{rng.randint(100000, 999999)}", "city": rng.choice(CITIES),
            "agent": rng.choice(AGENTS), "product": rng.choice(PRODUCTS)}


def _per_document(rng: random.Random) -> dict[str, str]:
    return {"date": f"{rng.randint(1, 28)} {rng.choice(MONTHS)}", "amount": f"{rng.randint(9, 900)}.{rng.randint(0, 99):02d} euros",
            "order": f"{rng.choice('ABCDEFGHJKLMNPRSTUVWXYZ')}{rng.randint(100000, 999999)}"}


def templated_corpus(subjects: int, per_subject: int = 3, seed: int = 0, form_share: float = 0.8,
                     forms: int = 120) -> list[TemplatedDocument]:
    """``per_subject`` documents for each of ``subjects`` people, document ``index`` numbered in subject order.
    Each document is a rigid form with probability ``form_share`` (one of ``forms`` templates), else a free
    note (an opening, two to four sentences of sixteen, a closing). The same arguments give the same documents."""
    templates = form_templates(forms, seed)
    docs: list[TemplatedDocument] = []
    for s in range(subjects):
        rng = random.Random(f"tombstone-templated/{seed}/{s}")
        person = _details(rng, s)
        for _ in range(per_subject):
            details = {**person, **_per_document(rng)}
            if rng.random() < form_share:
                k = rng.randrange(len(templates))
                template, text = f"form-{k}", templates[k].format(**details)
            else:
                parts = [rng.choice(NOTE_OPENINGS)] + rng.sample(NOTE_SENTENCES, rng.randint(2, 4)) + [rng.choice(NOTE_CLOSINGS)]
                template, text = "note", " ".join(p.format(**details) for p in parts)
            docs.append(TemplatedDocument(len(docs), s, template, text))
    return docs


def near_copy(doc: TemplatedDocument, changed: int = 3, seed: int = 0) -> str:
    """The document with ``changed`` words replaced (a copy someone edited a little)."""
    rng = random.Random(f"tombstone-templated/near-copy/{seed}/{doc.index}")
    words = doc.text.split()
    for pos in rng.sample(range(len(words)), min(changed, len(words))):
        words[pos] = rng.choice(FILLERS)
    return " ".join(words)


__all__ = ["TemplatedDocument", "near_copy", "templated_corpus"]
