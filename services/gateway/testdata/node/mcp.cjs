// mcp.cjs: the official MCP TypeScript SDK's client
// (@modelcontextprotocol/sdk 1.32) against the gateway's MCP server over
// streamable HTTP, as services/gateway/node_test.go runs it:
//   node mcp.cjs <MCP URL> <token or ""> <agent>
// It lists the tools, calls the agent's tool with a progress token, and
// prints what it saw as one JSON object; the Go test checks it. Any
// failure throws (exit 1).
const { Client } = require('@modelcontextprotocol/sdk/client/index.js');
const { StreamableHTTPClientTransport } = require('@modelcontextprotocol/sdk/client/streamableHttp.js');

async function main() {
  const [url, token, agent] = process.argv.slice(2);
  if (!url || !agent) throw new Error('usage: node mcp.cjs <MCP URL> <token or ""> <agent>');

  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: token ? { headers: { Authorization: `Bearer ${token}` } } : undefined,
  });
  const client = new Client({ name: 'neuron-node-interop', version: '1' });
  await client.connect(transport);

  const { tools } = await client.listTools();
  let progress = 0;
  const result = await client.callTool(
    { name: agent, arguments: { message: 'hello over mcp' } },
    undefined,
    { onprogress: () => { progress++; } },
  );
  await client.close();

  console.log(JSON.stringify({
    server: client.getServerVersion()?.name,
    tools: tools.map((t) => t.name).sort(),
    isError: result.isError ?? false,
    structured: result.structuredContent ?? null,
    text: (result.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join(''),
    progress,
  }));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
