"""A deterministic corpus with clusters, and the echoes the semantic level looks for.

Used by the semantic tests (``tests/core/test_semantic.py``) and the benchmark (``benchmarks/semantic.py``).
Every document is a few facts of one topic (the topics are the clusters), each fact written in one of two
phrasings and filled with the document's own details (a name, a date, an amount, an item, a place, a
reason, a reference). Three kinds of echo of a document can be planted under another subject:

* a **near-copy**: the same text with a few words changed;
* a **paraphrase**: the same facts and details, in the other phrasing and another order;
* a **summary**: one sentence that keeps the document's key details.

The same seed always gives the same texts on every machine.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np

NAMES = ("Amara Okafor", "Bjorn Lindqvist", "Chen Wei", "Dalia Haddad", "Emeka Nwosu", "Fatima Zahra",
         "Goran Petrovic", "Hana Sato", "Ines Carvalho", "Jonas Weber", "Kavya Iyer", "Lars Eriksen",
         "Mateo Rossi", "Nadia Benali", "Oskar Nowak", "Priya Raman", "Quentin Moreau", "Rosa Delgado",
         "Sven Olsen", "Tariq Aziz", "Umaima Khan", "Viktor Horvath", "Wen Li", "Ximena Torres",
         "Yusuf Demir", "Zofia Kowalska", "Aiko Tanaka", "Bruno Costa", "Clara Jensen", "Dmitri Volkov",
         "Elif Yilmaz", "Felix Bauer", "Greta Novak", "Hugo Laurent", "Ingrid Berg", "Jamal Harris",
         "Keiko Mori", "Luca Bianchi", "Maya Cohen", "Nico Schulz")
PLACES = ("Lisbon", "Rotterdam", "Krakow", "Tampere", "Bilbao", "Graz", "Leeds", "Ghent", "Bergen", "Turin",
          "Malmo", "Porto", "Dresden", "Cork", "Brno", "Lyon", "Aarhus", "Seville", "Utrecht", "Bologna")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
FILLERS = ("quickly", "again", "perhaps", "certainly", "still", "already", "kindly", "finally", "meanwhile",
           "really", "formally", "briefly")


@dataclass(frozen=True)
class Topic:
    name: str
    facts: tuple[tuple[str, str], ...]
    """Each fact in two phrasings, with ``{name}``, ``{date}``, ``{amount}``, ``{item}``, ``{place}``,
    ``{reason}`` and ``{ref}`` slots."""
    items: tuple[str, ...]
    reasons: tuple[str, ...]
    summary: str


TOPICS: tuple[Topic, ...] = (
    Topic("parcel delivery",
          (("{name} ordered {item} from the online shop on {date}.",
            "On {date}, {name} bought {item} through the web store."),
           ("The courier tried to deliver the parcel in {place} but {reason}.",
            "Delivery in {place} failed because {reason}."),
           ("Tracking number {ref} shows the package stuck at the depot.",
            "The package with tracking code {ref} has not left the depot."),
           ("{name} asked for a refund of {amount} for the missing parcel.",
            "A refund of {amount} was requested by {name} since the parcel never arrived."),
           ("The shop offered to resend the item by express post.",
            "Sending the item again with express shipping was proposed by the shop."),
           ("Customer service promised an answer within two working days.",
            "Support said a reply would come in two business days.")),
          ("a walnut bookshelf", "two ceramic vases", "a folding bicycle", "an espresso machine", "a winter coat",
           "a set of garden chairs", "a standing desk", "a baby stroller", "a drone camera", "a wool carpet"),
          ("nobody answered the door", "the address label was torn", "the street was closed for works",
           "the van broke down", "the building code was wrong", "the parcel was too large for the locker"),
          "In short, {name}'s parcel with {item} (tracking {ref}) was not delivered in {place}; refund {amount}."),
    Topic("medical appointment",
          (("{name} booked an appointment with the cardiologist for {date}.",
            "A cardiology consultation on {date} was scheduled for {name}."),
           ("The clinic in {place} asked the patient to bring {item}.",
            "Patients at the {place} clinic must bring {item} to the visit."),
           ("The visit was moved because {reason}.",
            "Because {reason}, the consultation had to be rescheduled."),
           ("The insurance will cover {amount} of the examination costs.",
            "Of the examination bill, {amount} is paid by the health insurer."),
           ("Blood test results are filed under patient number {ref}.",
            "The lab results are stored with patient record {ref}."),
           ("The doctor recommended a follow-up check in six weeks.",
            "A control visit after six weeks was advised by the physician.")),
          ("the previous ECG printout", "a list of current medication", "the referral letter", "the vaccination card",
           "fasting blood samples", "the old X-ray images", "a sleep diary", "the insurance card"),
          ("the doctor was ill", "the heart monitor was broken", "the patient had a fever",
           "the clinic flooded", "an emergency took priority", "the lab results were late"),
          "In short, {name}'s cardiology visit in {place} on {date} (patient {ref}) was moved; insurer pays {amount}."),
    Topic("apartment lease",
          (("{name} signed a lease for a flat in {place} starting {date}.",
            "Starting {date}, {name} rents an apartment in {place} under a signed contract."),
           ("The monthly rent is {amount} including heating.",
            "Rent of {amount} per month covers the heating as well."),
           ("The landlord refused to repair {item} because {reason}.",
            "Repairs to {item} were declined by the owner since {reason}."),
           ("The deposit is held in escrow account {ref}.",
            "Escrow account {ref} keeps the security deposit."),
           ("The tenant may end the lease with three months notice.",
            "Three months of notice lets the renter terminate the contract."),
           ("Pets are allowed only with written permission from the owner.",
            "Animals need the landlord's written consent.")),
          ("the broken boiler", "the leaking bathroom tap", "the cracked window", "the mouldy ceiling",
           "the jammed front door", "the faulty radiator", "the noisy elevator", "the damp basement"),
          ("the damage was caused by the tenant", "the budget was used up", "the insurer had not agreed yet",
           "the contractor was unavailable", "the lease excludes such repairs", "a dispute was pending"),
          "In short, {name} rents a flat in {place} from {date} at {amount}; the owner will not fix {item}."),
    Topic("flight booking",
          (("{name} booked a return flight to {place} departing {date}.",
            "A round trip to {place}, leaving on {date}, was reserved by {name}."),
           ("The airline cancelled the outbound flight because {reason}.",
            "Because {reason}, the carrier cancelled the departing flight."),
           ("Booking reference {ref} was rebooked onto the next morning.",
            "The reservation {ref} moved to a flight the following morning."),
           ("{name} claims compensation of {amount} under the passenger rights rules.",
            "Under passenger rights law, {name} is asking for {amount} in compensation."),
           ("The checked bag contained {item} and did not arrive.",
            "The suitcase holding {item} was lost in transit."),
           ("The airport lounge voucher was accepted at the gate.",
            "At the gate the lounge coupon was honoured.")),
          ("a laptop and chargers", "hiking boots", "a wedding dress", "diving equipment", "a violin case",
           "medical supplies", "ski gear", "presents for the family"),
          ("of a strike by air traffic controllers", "a storm closed the runway", "the aircraft had a technical fault",
           "the crew exceeded duty hours", "of volcanic ash", "the airport lost power"),
          "In short, {name}'s flight to {place} on {date} (booking {ref}) was cancelled; claim {amount}."),
    Topic("bank transfer",
          (("{name} sent {amount} to a supplier in {place} on {date}.",
            "On {date}, {name} transferred {amount} to a vendor based in {place}."),
           ("The transfer with reference {ref} was held by the bank.",
            "The bank blocked payment {ref} for review."),
           ("The compliance team asked for {item} before releasing the funds.",
            "Before the money could go out, compliance requested {item}."),
           ("The delay happened because {reason}.",
            "The hold was caused because {reason}."),
           ("The account will be charged a fee for the urgent processing.",
            "An express processing fee will be debited from the account."),
           ("The relationship manager confirmed the release by phone.",
            "By telephone the account manager confirmed the funds were released.")),
          ("a copy of the invoice", "proof of identity", "the signed purchase contract", "the supplier's tax number",
           "a utility bill", "the company registration", "a source of funds letter", "the customs declaration"),
          ("the amount exceeded the daily limit", "the beneficiary name did not match", "of sanctions screening",
           "the account was newly opened", "the IBAN had a typo", "the payment looked unusual"),
          "In short, {name}'s transfer of {amount} to {place} on {date} (ref {ref}) was held pending {item}."),
    Topic("car repair",
          (("{name} brought the car to the garage in {place} on {date}.",
            "On {date}, {name} left the vehicle at a workshop in {place}."),
           ("The mechanic found a problem with {item}.",
            "A fault in {item} was diagnosed by the technician."),
           ("The quote for parts and labour came to {amount}.",
            "Labour and parts were estimated at {amount}."),
           ("Work order {ref} was paused because {reason}.",
            "Because {reason}, job card {ref} was put on hold."),
           ("A courtesy car was provided for the week.",
            "The garage lent a replacement vehicle for seven days."),
           ("The warranty covers the gearbox but not the brakes.",
            "Brakes are excluded from the warranty, the gearbox is included.")),
          ("the clutch", "the timing belt", "the brake discs", "the alternator", "the catalytic converter",
           "the suspension springs", "the air conditioning", "the fuel pump"),
          ("the spare part was back-ordered", "the insurer had to approve it", "the owner disputed the price",
           "the workshop was understaffed", "a second opinion was requested", "the diagnosis was uncertain"),
          "In short, {name}'s car in {place} (order {ref}, {date}) needs work on {item}; quote {amount}."),
    Topic("school enrollment",
          (("{name} applied to enrol a child at the primary school in {place} for {date}.",
            "For {date}, {name} submitted an enrolment request to the {place} primary school."),
           ("The school requested {item} with the application.",
            "The application had to include {item}."),
           ("The place was put on a waiting list because {reason}.",
            "Because {reason}, the child was waitlisted."),
           ("The registration fee of {amount} was paid online.",
            "An online payment of {amount} covered the registration."),
           ("Application number {ref} is being reviewed by the board.",
            "The board is considering file {ref}."),
           ("Parents can visit the classrooms on the open day.",
            "An open day lets families see the classrooms.")),
          ("the birth certificate", "proof of address", "the vaccination record", "the previous school report",
           "a language assessment", "the custody papers", "two passport photos", "a medical certificate"),
          ("the class was full", "the catchment area was disputed", "documents were missing",
           "a sibling priority applied to others", "the deadline had passed", "the lottery was not yet held"),
          "In short, {name}'s enrolment at the {place} school for {date} (file {ref}) is waitlisted; fee {amount}."),
    Topic("software bug report",
          (("{name} reported a crash in the accounting app on {date}.",
            "On {date}, {name} filed a report about the accounting software crashing."),
           ("The error appears when exporting {item}.",
            "Exporting {item} triggers the failure."),
           ("Ticket {ref} was escalated to the engineering team.",
            "Engineering took over ticket {ref} after escalation."),
           ("The root cause is that {reason}.",
            "Investigation showed that {reason}."),
           ("The customer was offered a credit of {amount} for the downtime.",
            "A {amount} credit for the outage was proposed to the client."),
           ("A patch is planned for the next release in {place}'s region.",
            "The fix ships with the upcoming release for the {place} region.")),
          ("quarterly reports to PDF", "the payroll spreadsheet", "invoices in bulk", "the general ledger",
           "tax forms as XML", "bank reconciliations", "the audit trail", "customer statements"),
          ("a date field overflows", "the cache was not invalidated", "a library was outdated",
           "the database lock timed out", "memory ran out on large files", "a locale setting was wrong"),
          "In short, {name}'s crash report (ticket {ref}, {date}) on exporting {item}; credit {amount}."),
    Topic("insurance claim",
          (("{name} filed a home insurance claim after damage on {date}.",
            "After the damage on {date}, {name} submitted a claim to the home insurer."),
           ("The damage was to {item} in the house in {place}.",
            "In the {place} house, {item} was damaged."),
           ("The adjuster estimated the loss at {amount}.",
            "A loss of {amount} was assessed by the adjuster."),
           ("Claim {ref} was partly rejected because {reason}.",
            "Because {reason}, part of claim {ref} was refused."),
           ("The policy excess of two hundred euros applies.",
            "An excess of 200 euros is deducted under the policy."),
           ("Photos of the damage were uploaded to the portal.",
            "The portal received pictures of the damage.")),
          ("the kitchen floor", "the roof tiles", "the living room ceiling", "the garage door", "the solar panels",
           "the basement walls", "the wooden deck", "the electrical wiring"),
          ("the policy had lapsed", "the damage was gradual wear", "maintenance was neglected",
           "the value was not declared", "the event was excluded", "the report came too late"),
          "In short, {name}'s insurance claim {ref} for {item} in {place} ({date}) was partly refused; loss {amount}."),
    Topic("job application",
          (("{name} applied for the data analyst position in {place} on {date}.",
            "On {date}, {name} sent an application for the analyst job in {place}."),
           ("The recruiter asked for {item} before the interview.",
            "Before interviewing, the recruiter wanted {item}."),
           ("The salary expectation was {amount} per year.",
            "A yearly salary of {amount} was requested."),
           ("Candidate number {ref} was invited to a second round.",
            "A second interview was offered to applicant {ref}."),
           ("The offer was delayed because {reason}.",
            "Because {reason}, the job offer came late."),
           ("The start date would be after a three month notice period.",
            "Work would begin once three months of notice were served.")),
          ("two references", "a portfolio of dashboards", "the university transcript", "a coding test",
           "a work permit", "a cover letter in German", "the previous contract", "a writing sample"),
          ("the budget was frozen", "the hiring manager left", "background checks took longer",
           "the team was reorganised", "another candidate was considered", "the role was redefined"),
          "In short, {name} applied as analyst in {place} on {date} (candidate {ref}), asking {amount}."),
    Topic("restaurant event",
          (("{name} reserved the private dining room in {place} for {date}.",
            "For {date}, {name} booked the private room of a restaurant in {place}."),
           ("The menu for forty guests was priced at {amount}.",
            "Forty guests would be served for {amount}."),
           ("The chef could not serve {item} because {reason}.",
            "Because {reason}, {item} was taken off the menu."),
           ("Reservation {ref} requires a deposit of one third.",
            "A one-third deposit secures booking {ref}."),
           ("Vegetarian options were added on request.",
            "On request, meat-free dishes were included."),
           ("The event must end by midnight due to noise rules.",
            "Noise regulations require the party to finish at midnight.")),
          ("the oyster starter", "the truffle risotto", "the wine pairing", "the birthday cake",
           "the grilled octopus", "the cheese board", "the lobster bisque", "the chocolate fondant"),
          ("the supplier was out of stock", "of a health inspection", "the kitchen oven failed",
           "the season had ended", "the sommelier was away", "prices had doubled"),
          "In short, {name}'s dinner in {place} on {date} (booking {ref}) for {amount}, without {item}."),
    Topic("utility outage",
          (("{name} reported a power outage at the home in {place} on {date}.",
            "On {date}, {name} told the utility the electricity was off at the {place} house."),
           ("The outage damaged {item}.",
            "{item} was damaged by the power cut."),
           ("The grid operator said the cause was that {reason}.",
            "According to the network operator, {reason}."),
           ("Incident {ref} was closed after the line was repaired.",
            "After repairs, incident {ref} was marked resolved."),
           ("{name} asked for compensation of {amount} for spoiled food.",
            "Compensation of {amount} for spoiled groceries was requested by {name}."),
           ("Smart meter readings confirm the six hour interruption.",
            "The smart meter data shows a six hour gap in supply.")),
          ("the freezer", "the heat pump", "the home router", "the aquarium pump", "the electric car charger",
           "the washing machine", "the alarm system", "the well pump"),
          ("a tree fell on the line", "a transformer overheated", "a digger cut the cable",
           "lightning struck the substation", "the network was overloaded", "a fuse box failed"),
          "In short, {name}'s power cut in {place} on {date} (incident {ref}) damaged {item}; claim {amount}."),
)


@dataclass(frozen=True)
class Document:
    """One synthetic document: its topic (the cluster), its facts and details, and its text."""

    index: int
    topic: int
    facts: tuple[int, ...]
    phrasing: tuple[int, ...]
    details: tuple[tuple[str, str], ...]
    text: str


def _details(rng: random.Random, topic: Topic) -> dict[str, str]:
    return {
        "name": rng.choice(NAMES),
        "date": f"{rng.randint(1, 28)} {rng.choice(MONTHS)}",
        "amount": f"{rng.randint(40, 4000)} euros",
        "item": rng.choice(topic.items),
        "place": rng.choice(PLACES),
        "reason": rng.choice(topic.reasons),
        "ref": f"{rng.choice('ABCDEFGHJKLMNPRSTUVWXYZ')}{rng.randint(10000, 99999)}",
    }


def _render(topic: Topic, facts, phrasing, details: dict[str, str]) -> str:
    out = []
    for fact, phrase in zip(facts, phrasing):
        sentence = topic.facts[fact][phrase].format(**details)
        out.append(sentence[0].upper() + sentence[1:])
    return " ".join(out)


def corpus(n: int, seed: int = 0, facts_per_document: int = 4, topics: int | None = None) -> list[Document]:
    """``n`` documents spread round-robin over the first ``topics`` topics (all by default); the same
    arguments give the same documents."""
    docs = []
    for i in range(n):
        rng = random.Random(f"tombstone-echoes/{seed}/{i}")
        t = i % (topics or len(TOPICS))
        topic = TOPICS[t]
        facts = tuple(rng.sample(range(len(topic.facts)), facts_per_document))
        phrasing = tuple(rng.randint(0, 1) for _ in facts)
        details = _details(rng, topic)
        docs.append(Document(i, t, facts, phrasing, tuple(sorted(details.items())),
                             _render(topic, facts, phrasing, details)))
    return docs


def near_copy(doc: Document, changed: int = 3, seed: int = 0) -> str:
    """The document with ``changed`` words replaced (a copy someone edited a little)."""
    rng = random.Random(f"tombstone-echoes/near-copy/{seed}/{doc.index}")
    words = doc.text.split()
    for pos in rng.sample(range(len(words)), min(changed, len(words))):
        words[pos] = rng.choice(FILLERS)
    return " ".join(words)


def paraphrase(doc: Document, seed: int = 0) -> str:
    """The same facts and details in the other phrasing, in another order."""
    rng = random.Random(f"tombstone-echoes/paraphrase/{seed}/{doc.index}")
    order = list(range(len(doc.facts)))
    while len(order) > 1 and order == list(range(len(doc.facts))):
        rng.shuffle(order)
    topic = TOPICS[doc.topic]
    return _render(topic, [doc.facts[i] for i in order], [1 - doc.phrasing[i] for i in order], dict(doc.details))


def summary(doc: Document) -> str:
    """One sentence keeping the document's key details (a derived summary)."""
    return TOPICS[doc.topic].summary.format(**dict(doc.details))


ECHOES = {"near-copy": near_copy, "paraphrase": paraphrase, "summary": lambda doc, seed=0: summary(doc)}
"""Each kind of echo: ``make(document, seed) -> text``."""



class MemoryStore:
    """A brute-force in-memory vector store with the two hooks the semantic level asks of an adapter
    (``semantic_neighbours``, ``stored_vectors``) and the lineage look-ups its snapshot needs
    (``probe_vectors``, ``artifact``): the measurement of :mod:`tombstone.verify.neighbourhood` without a
    database, for calibration runs and for choosing test cases. Cosine similarity, exact."""

    def __init__(self, store: str = "memory") -> None:
        self.store = store
        self.ids: list[str] = []
        self.vectors: dict[str, np.ndarray] = {}
        self.fragments: dict[str, list[np.ndarray]] = {}
        self.records: dict[str, Any] = {}

    def add(self, aid: str, vector, fragments, subject: str) -> None:
        from tombstone.lineage.records import ArtifactRecord

        self.ids.append(aid)
        self.vectors[aid] = np.asarray(vector, dtype=np.float32)
        self.fragments[aid] = [np.asarray(f, dtype=np.float32) for f in fragments]
        self.records[aid] = ArtifactRecord(self.store, aid, "memory", "vector", subject_key=subject)
        self._matrix = None

    def remove(self, aid: str) -> None:
        self.ids.remove(aid)
        for table in (self.vectors, self.fragments, self.records):
            table.pop(aid, None)
        self._matrix = None

    def _unit(self):
        if getattr(self, "_matrix", None) is None:
            m = np.stack([self.vectors[i] for i in self.ids]).astype(np.float64)
            self._matrix = m / np.linalg.norm(m, axis=1, keepdims=True)
        return self._matrix

    # -- the adapter's hooks
    def semantic_neighbours(self, vectors, k: int, exclude=frozenset()):
        from tombstone.verify.neighbourhood import Neighbours

        m = self._unit()
        q = np.asarray(vectors, dtype=np.float64).reshape(-1, m.shape[1])
        sims = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ m.T
        fetch = min(len(self.ids), k + len(exclude))
        out = []
        for row in sims:
            top = np.argpartition(-row, fetch - 1)[:fetch] if fetch < len(row) else np.arange(len(row))
            top = top[np.argsort(-row[top], kind="stable")]
            order = [j for j in top if self.ids[j] not in exclude][:k]
            ids = [self.ids[j] for j in order]
            out.append(Neighbours(ids, [float(1 - row[j]) for j in order], np.stack([self.vectors[i] for i in ids])
                                  if ids else np.zeros((0, m.shape[1]))))
        return out

    def stored_vectors(self, ids):
        return {i: self.vectors[i] for i in ids if i in self.vectors}

    # -- the lineage's look-ups
    def probe_vectors(self, artifacts):
        return {a.artifact_id: self.fragments.get(a.artifact_id, []) for a in artifacts}

    def artifact(self, store: str, aid: str):
        return self.records.get(aid)


def measure(store: MemoryStore, erased: list[str], focus: str, matched: bool = True):
    """The semantic level's decision for ``focus`` when ``erased`` are removed (filtered out): what the
    saga's snapshot and verify steps compute, on a :class:`MemoryStore`. None when not measured.
    ``matched=False``: with the nearest controls instead of matched ones (the choice before that calibration)."""
    from tombstone.verify import neighbourhood as nb

    records = [store.records[aid] for aid in erased]
    snap = nb.take_snapshots(store, records, probe_vectors=store.probe_vectors, artifact=store.artifact,
                             matched=matched)[focus]
    if snap.meta.get("outcome") != "measured":
        return None
    after = store.semantic_neighbours(snap.queries, nb.TOP, frozenset(erased))
    drifts = [nb.drift(before, res.vectors) for before, res in zip(snap.baselines, after)]
    return nb.decide(drifts, [float(np.mean(c["drifts"])) for c in snap.meta["controls"]])


__all__ = [
    "ECHOES",
    "TOPICS",
    "Document",
    "MemoryStore",
    "Topic",
    "corpus",
    "measure",
    "near_copy",
    "paraphrase",
    "summary",
]
