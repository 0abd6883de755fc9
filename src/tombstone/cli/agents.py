"""``tombstone mcp``: the deployment as a Model Context Protocol server, for agents."""

from __future__ import annotations

from tombstone.cli.base import CONFIG_OPTION, main
from tombstone.errors import ConfigError


@main.command("mcp")
@CONFIG_OPTION
def mcp_cmd(config_path: str | None) -> None:
    """Serve the deployment to an agent over stdio (Model Context Protocol): where, status, erase (a dry run
    first, then with its confirmation token), receipt_show, receipt_verify, scan. Opens no network listener."""
    try:
        import mcp  # noqa: F401
    except ImportError as exc:
        raise ConfigError("tombstone mcp needs the MCP SDK: pip install 'tombstone-rag[mcp]'") from exc
    from tombstone.mcpserver import serve_stdio

    serve_stdio(config_path)
