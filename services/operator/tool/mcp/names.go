package mcp

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/secbear/neuron/services/operator/tool"
)

// Separator joins the server name and the MCP tool name in a tool name.
const Separator = "__"

// hashLen is the number of hex digits of the suffix added to a rewritten
// name.
const hashLen = 8

func nameByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-'
}

// ToolName returns the registry name of the MCP tool mcpName of server:
// server + "__" + mcpName when that follows the tool name rule (letters,
// digits, '_' and '-', at most tool.MaxNameLen bytes). Otherwise the name
// is rewritten deterministically: every byte outside the allowed set
// becomes '_', the result is cut to leave room for a suffix, and "-" plus
// the first 8 hex digits of the SHA-256 of mcpName is appended, so two
// different MCP names that sanitize alike still get different names. For
// example "files.read" on server "fs" becomes "fs__files_read-<hash>".
// server must satisfy the rule of Server.Name.
func ToolName(server, mcpName string) string {
	full := server + Separator + mcpName
	if len(full) <= tool.MaxNameLen && allNameBytes(mcpName) {
		return full
	}
	var b strings.Builder
	b.Grow(len(full))
	b.WriteString(server)
	b.WriteString(Separator)
	for i := 0; i < len(mcpName); i++ {
		if c := mcpName[i]; nameByte(c) {
			b.WriteByte(c)
		} else {
			b.WriteByte('_')
		}
	}
	base := b.String()
	if max := tool.MaxNameLen - 1 - hashLen; len(base) > max {
		base = base[:max]
	}
	sum := sha256.Sum256([]byte(mcpName))
	return base + "-" + hex.EncodeToString(sum[:])[:hashLen]
}

func allNameBytes(s string) bool {
	for i := 0; i < len(s); i++ {
		if !nameByte(s[i]) {
			return false
		}
	}
	return true
}
