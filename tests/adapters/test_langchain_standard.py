"""LangChain's standard VectorStore integration suite (langchain-tests), on every backend, for real.

Each test gets a fresh deployment with an empty store. The store embeds with Tombstone's
``HashingEmbedder`` (wrapped as LangChain ``Embeddings``); the suite's documents carry no subject, so the
store is built with ``default_subject`` — the documented default for records that name none. Its deletes
and overwrites are erasures with receipts, which each test also checks verify.
"""

from __future__ import annotations

import pytest
from langchain_tests.integration_tests import VectorStoreIntegrationTests

from tombstone.keys import load_private_key
from tombstone.receipt import SOURCE_RECEIPT_KIND, verify
from tombstone_adapters.langchain import TombstoneVectorStore

from langchain_backends import Services, deployment

SUBJECT = "langchain-standard-suite"


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    shared = Services(tmp_path_factory.mktemp("services"))
    yield shared
    shared.close()


class _Standard(VectorStoreIntegrationTests):
    backend = ""

    @pytest.fixture
    def vectorstore(self, tmp_path, services):
        with deployment(tmp_path / "deploy", self.backend, services) as (tomb, wrapper):
            store = TombstoneVectorStore(wrapper, tombstone=tomb, default_subject=SUBJECT)
            yield store
            public = load_private_key(tomb.config.keys_dir).public_key()
            for receipt, path in store.receipts:
                assert path.is_file() and receipt["kind"] == SOURCE_RECEIPT_KIND
                verify(receipt, public)
                assert {a["status"] for a in receipt["artifacts"]} <= {"VERIFIED", "RESIDUAL", "UNVERIFIED"}


class TestChroma(_Standard):
    backend = "chroma"


class TestFaiss(_Standard):
    backend = "faiss"


class TestQdrant(_Standard):
    backend = "qdrant"


class TestPgVector(_Standard):
    backend = "pgvector"


class TestPinecone(_Standard):
    backend = "pinecone"
