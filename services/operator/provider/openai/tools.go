package openai

import (
	"bytes"
	"encoding/json"
	"hash/maphash"
	"sync"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// Every model call of an invocation sends the same tools, and most
// invocations the same tool set. Checking and encoding their schemas
// and descriptions anew each time cost about as much CPU as the rest of
// the request (140 µs for the nine tools of a default operator, 6.5 KB
// of definitions, on a 2-CPU VM); the tools' JSON is therefore kept per
// tool set, found by the definitions' content (compared in full, never
// by a hash alone), and written into the body as it is.

// maxToolSets bounds the tool sets kept; beyond it, new sets are encoded
// on every call, as before. Tool sets come from the operator's
// configuration and the agents' allowed_tools, so there are few.
const maxToolSets = 64

// toolCache is the encoded "tools" array of each tool set seen.
type toolCache struct {
	seed maphash.Seed
	mu   sync.RWMutex
	sets map[uint64][]*toolSet
	n    int
}

type toolSet struct {
	specs []provider.ToolSpec // a copy
	json  []byte
}

func newToolCache() *toolCache {
	return &toolCache{seed: maphash.MakeSeed(), sets: map[uint64][]*toolSet{}}
}

// toolsJSON returns the "tools" array for specs (nil for none), or the
// error of the first tool that cannot be sent.
func (p *Provider) toolsJSON(model string, specs []provider.ToolSpec) ([]byte, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	c := p.tools
	if c == nil {
		return encodeTools(p, model, specs)
	}
	h := c.hash(specs)
	c.mu.RLock()
	for _, s := range c.sets[h] {
		if sameSpecs(s.specs, specs) {
			c.mu.RUnlock()
			return s.json, nil
		}
	}
	c.mu.RUnlock()
	b, err := encodeTools(p, model, specs)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n < maxToolSets {
		c.sets[h] = append(c.sets[h], &toolSet{specs: cloneSpecs(specs), json: b})
		c.n++
	}
	return b, nil
}

// encodeTools checks and encodes a tool set.
func encodeTools(p *Provider, model string, specs []provider.ToolSpec) ([]byte, error) {
	tools := make([]chatTool, 0, len(specs))
	for _, t := range specs {
		tool, err := p.tool(model, t)
		if err != nil {
			return nil, err
		}
		tools = append(tools, tool)
	}
	b, err := json.Marshal(tools)
	if err != nil {
		return nil, p.errorf(model, errs.InvalidArgument, "encoding the tools: %v", err)
	}
	return b, nil
}

func (c *toolCache) hash(specs []provider.ToolSpec) uint64 {
	var h maphash.Hash
	h.SetSeed(c.seed)
	for _, t := range specs {
		// Lengths first, so that no two different sets write the same
		// bytes.
		var n [24]byte
		putLen(n[0:], len(t.Name))
		putLen(n[8:], len(t.Description))
		putLen(n[16:], len(t.InputSchema))
		_, _ = h.Write(n[:])
		_, _ = h.WriteString(t.Name)
		_, _ = h.WriteString(t.Description)
		_, _ = h.Write(t.InputSchema)
	}
	return h.Sum64()
}

func putLen(b []byte, n int) {
	for i := range 8 {
		b[i] = byte(n >> (8 * i))
	}
}

func sameSpecs(a, b []provider.ToolSpec) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || a[i].Description != b[i].Description || !bytes.Equal(a[i].InputSchema, b[i].InputSchema) {
			return false
		}
	}
	return true
}

func cloneSpecs(specs []provider.ToolSpec) []provider.ToolSpec {
	out := make([]provider.ToolSpec, len(specs))
	for i, t := range specs {
		out[i] = provider.ToolSpec{Name: t.Name, Description: t.Description, InputSchema: bytes.Clone(t.InputSchema)}
	}
	return out
}
