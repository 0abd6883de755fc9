"""``tombstone mcp`` driven by the MCP SDK's own client: in process (the real protocol objects, no mocks) and as
a subprocess over stdio. An agent lists the tools, finds a subject, dry-runs, is refused without the token and
with an altered or spent one, erases with it, and verifies the receipt."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

mcp = pytest.importorskip("mcp")

from mcp import Client, StdioServerParameters  # noqa: E402

from tombstone.mcpserver import build_server  # noqa: E402

from support import write_docs  # noqa: E402


@pytest.fixture
def deployment(tmp_path):
    from tombstone import Tombstone, init_deployment

    config = init_deployment(tmp_path / "deploy", {"docs": {"backend": "docstore", "path": "stores/docs/docstore.db"}})
    with Tombstone(config) as tomb:
        write_docs(tomb, "alice", 2)
        write_docs(tomb, "bob", 1)
    return config.path


def result_of(call) -> dict:
    assert not call.is_error, call.content
    if call.structured_content is not None:
        data = call.structured_content
        return data.get("result", data) if set(data) == {"result"} else data
    return json.loads(call.content[0].text)


def error_of(call) -> str:
    assert call.is_error
    return call.content[0].text


def run(coro):
    return asyncio.run(coro)


def test_tools_are_listed_with_their_hints(deployment):
    async def go():
        async with Client(build_server(deployment)) as client:
            return (await client.list_tools()).tools

    tools = {t.name: t for t in run(go())}
    assert set(tools) == {"where", "status", "erase", "receipt_show", "receipt_verify", "scan"}
    assert tools["erase"].annotations.destructive_hint is True
    assert tools["erase"].annotations.read_only_hint is False
    for name in ("where", "status", "receipt_show", "receipt_verify", "scan"):
        assert tools[name].annotations.read_only_hint is True, name


def test_an_agent_finds_dry_runs_confirms_erases_and_verifies(deployment):
    """The dry run changes nothing; without the token, with an altered one or another subject's, nothing is
    erased; with it the subject is erased, its receipt verifies against the deployment's key, and the token
    cannot be used again."""
    from tombstone import Tombstone
    from tombstone.config import load_config

    async def go():
        async with Client(build_server(deployment)) as client:
            out = {}
            out["where"] = result_of(await client.call_tool("where", {"subject": "alice"}))
            out["dry"] = result_of(await client.call_tool("erase", {"subject": "alice"}))
            out["bob_dry"] = result_of(await client.call_tool("erase", {"subject": "bob"}))
            token = out["dry"]["confirm"]
            altered = token[:-1] + ("0" if token[-1] != "0" else "1")
            out["altered"] = error_of(await client.call_tool("erase", {"subject": "alice", "confirm": altered}))
            out["other"] = error_of(await client.call_tool("erase", {"subject": "alice",
                                                                     "confirm": out["bob_dry"]["confirm"]}))
            out["unknown"] = error_of(await client.call_tool("erase", {"subject": "nobody"}))
            with Tombstone(load_config(deployment)) as tomb:
                out["states_before"] = {a.state for a in tomb.lineage.artifacts_for(tomb.lineage.subject_key("alice"))}
            out["erased"] = result_of(await client.call_tool("erase", {"subject": "alice", "confirm": token}))
            out["again"] = error_of(await client.call_tool("erase", {"subject": "alice", "confirm": token}))
            out["verify"] = result_of(await client.call_tool("receipt_verify", {"subject": "alice"}))
            out["show"] = result_of(await client.call_tool("receipt_show", {"subject": "alice"}))
            out["resource"] = await client.read_resource("tombstone://receipts/alice")
            out["report"] = await client.read_resource("tombstone://report")
            out["status"] = result_of(await client.call_tool("status", {}))
            out["scan"] = result_of(await client.call_tool("scan", {"store": "docs"}))
            return out

    out = run(go())
    assert len(out["where"]["artifacts"]) == 2
    assert out["dry"]["dry_run"] is True and len(out["dry"]["would_erase"]) == 2
    assert "does not match" in out["altered"] and "does not match" in out["other"]
    assert "unknown subject 'nobody'" in out["unknown"] and "\n" not in out["unknown"]
    assert out["states_before"] == {"live"}  # neither the dry run nor a refused call changed anything
    assert out["erased"]["dry_run"] is False and {a["status"] for a in out["erased"]["artifacts"]} == {"VERIFIED"}
    assert "already used" in out["again"]
    assert out["verify"]["verified"] is True and out["verify"].get("file_matches_chain") is True
    assert out["show"]["receipt_hash"] == out["verify"]["receipt_hash"]
    assert json.loads(out["resource"].contents[0].text)["receipt_hash"] == out["verify"]["receipt_hash"]
    report = json.loads(out["report"].contents[0].text)
    assert report["signatures"]["checked"] is True and report["totals"]["subjects"] == 1 and not report["failures"]
    assert [s["subject"] for s in out["status"]["sagas"]] == ["alice"]
    assert out["scan"]["store"] == "docs" and "ids" not in out["scan"]


def test_the_command_serves_over_stdio_and_exits_with_its_client(deployment):
    """``tombstone mcp`` as an agent starts it: a subprocess speaking over its stdin and stdout; the client's
    exit ends it (no server left running)."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "tombstone", "mcp", "--config", str(deployment)])

    async def go():
        async with Client(params) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            where = result_of(await client.call_tool("where", {"subject": "bob"}))
            return tools, where

    tools, where = run(go())
    assert "erase" in tools and len(where["artifacts"]) == 1


def test_a_bad_config_is_one_line_and_a_missing_sdk_names_the_extra(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from tombstone.cli import main

    result = CliRunner().invoke(main, ["mcp", "--config", str(tmp_path / "none.toml")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    monkeypatch.setitem(sys.modules, "mcp", None)
    result = CliRunner().invoke(main, ["mcp", "--config", str(Path(tmp_path) / "none.toml")])
    assert result.exit_code == 2 and "pip install 'tombstone-rag[mcp]'" in result.output


def test_the_readme_example_runs_as_written(tmp_path, monkeypatch):
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    [example] = [b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "tombstone.mcpserver" in b]
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(example, "README.md", "exec"), namespace)
    assert namespace["erased"]["summary"]["VERIFIED"] == 1 and namespace["verified"]["verified"] is True
